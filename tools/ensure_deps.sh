#!/usr/bin/env bash
# Install what `make test` / `make demo` need, only what is missing (idempotent, safe on a fresh clone).
# torch comes first and pinned: on the CPU machines `torch==2.13.0` is a CPU build from local disk, while an
# unpinned `torch` (pulled in by `pip install -e .`) would download a multi-gigabyte CUDA build.
set -euo pipefail
PY=${PY:-python3}
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

"$PY" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
"$PY" -c "import numpy, lark, pytest, hypothesis" 2>/dev/null || pip_install numpy lark pytest hypothesis
"$PY" -c "import cuda.bindings.driver" 2>/dev/null || pip_install "cuda-bindings>=13,<14"
# The package must be installed (editable) from THIS checkout: CI clones into a fresh folder.
here=$(pwd -P)
"$PY" - "$here" <<'PYCODE' 2>/dev/null || pip_install --no-deps --no-build-isolation -e . || pip_install --no-deps -e .
import os, sys
import minitriton
root = os.path.realpath(os.path.dirname(minitriton.__file__ or ""))
sys.exit(0 if root == os.path.join(sys.argv[1], "minitriton") else 1)
PYCODE
"$PY" - "$here" <<'PYCODE'
import os, sys
import minitriton, minitriton.passes
root = os.path.realpath(os.path.dirname(minitriton.__file__))
assert root == os.path.join(sys.argv[1], "minitriton"), f"minitriton imports from {root}, not this checkout"
PYCODE
