"""IR -> IR passes, one per file, each registered by name (see registry.py)."""
from .registry import PASSES, get_pass, register_pass, run_passes

# Importing a pass module registers its pass.
from . import canonicalize, constant_fold, cse, dce  # noqa: E402,F401  (canonicalization passes)
from . import tiling  # noqa: E402,F401  (layout assignment)
from . import dot_lowering  # noqa: E402,F401  (tensor-core instruction choice for mt.dot)
from . import pipeline  # noqa: E402,F401  (software pipelining of dot K loops: cp.async rings)
from . import warp_specialize  # noqa: E402,F401  (partitions: producer warpgroup + consumer warps, ring protocols)
from . import async_dots  # noqa: E402,F401  (in-place ring dots of explicit partitions made asynchronous)
from . import defer_dot_waits  # noqa: E402,F401  (a partition's register / ring-slot wgmma dots wait where used)

__all__ = ["PASSES", "get_pass", "register_pass", "run_passes"]
