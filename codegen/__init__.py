"""Tiled IR -> PTX text (ptx.py and the lowering modules it dispatches to), and ptxas glue (ptxas.py)."""
from .ptx import emit_ptx
from .ptxas import PtxasError, PtxasReport, ptxas_path, run_ptxas

__all__ = ["emit_ptx", "run_ptxas", "PtxasReport", "PtxasError", "ptxas_path"]
