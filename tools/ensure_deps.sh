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
# Every mapped folder (pyproject's package-dir) is checked, not only minitriton/: with another checkout's editable
# install, minitriton itself comes from the current folder but frontend/, passes/ and kernels_src/ from that one.
imports_here() {
    "$PY" - "$here" <<'PYCODE'
import os, sys
import minitriton, minitriton.passes, minitriton.frontend, minitriton.kernels
here = sys.argv[1]
for m in (minitriton, minitriton.passes, minitriton.frontend, minitriton.kernels):
    root = os.path.realpath(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])
    if not root.startswith(here + os.sep):
        sys.exit(f"{m.__name__} imports from {root}, not this checkout")
PYCODE
}
imports_here 2>/dev/null || pip_install --no-deps --no-build-isolation -e . || pip_install --no-deps -e .
imports_here
