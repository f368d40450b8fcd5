#!/usr/bin/env bash
# The baseline of an A/B device run: the tree of commit REV (default HEAD) exported into the git-ignored .base/,
# to be carried to the GPU machine next to the working tree (run's `carry: [".base"]`) and timed there in the
# same call, on the same card, with its own kernel cache:
#
#     bash tools/base_tree.sh [REV]
#     # on the device, BEFORE the working tree is installed:
#     pip install -q --no-deps --no-build-isolation -e .base
#     (cd .base && MINITRITON_CACHE_DIR=/tmp/cache_base python3 tools/flash_kda_variants.py ...)
#     pip install -q --no-deps --no-build-isolation -e .     # then the working tree replaces it
#
# Why installed, not just put on sys.path: the package maps minitriton.codegen / .passes / .frontend / .kernels to
# top-level folders (pyproject's package-dir), which only an installed (editable) finder resolves, and that
# finder runs before sys.path. Two editable installs of the one project cannot coexist, hence the order.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
rm -rf .base
mkdir .base
git archive "$rev" | tar -x -C .base
echo "$(git rev-parse --short "$rev")" > .base/REVISION
echo ".base/ holds $(cat .base/REVISION) ($(du -sh .base | cut -f1))"
