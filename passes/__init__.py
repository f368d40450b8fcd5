"""IR -> IR passes, one per file, each registered by name (see registry.py)."""
from .registry import PASSES, get_pass, register_pass, run_passes

__all__ = ["PASSES", "get_pass", "register_pass", "run_passes"]
