"""The Triton versions of the benchmark kernels (imported only when triton is installed).

Triton's JIT reads a kernel's globals to resolve names, so these live at module level in their own file."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def empty():
    pass


@triton.jit
def add3(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)
