"""MiniTriton: a Python DSL and compiler for custom GPU kernels on NVIDIA Hopper (sm_90a).

    import minitriton as mt

    @mt.kernel
    def add(x, y, out, n, BLOCK: mt.constexpr):
        offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
        mask = offs < n
        mt.store(out + offs, mt.load(x + offs, mask=mask) + mt.load(y + offs, mask=mask), mask=mask)

    add[(triton_cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
"""
from .errors import CompilationError, InterpreterError
from .frontend.source import func
from .language import *  # noqa: F401,F403 - the builtins and dtypes are the public language
from .language import __all__ as _language_all

__version__ = "0.1.0"


def __getattr__(name: str):  # the runtime imports lazily so `import minitriton` stays light and GPU-free
    if name in ("kernel", "Kernel"):
        from .runtime import jit

        return getattr(jit, name)
    if name in ("autotune", "Config"):
        from .runtime import autotune

        return getattr(autotune, name)
    if name == "TensorDescriptor":
        from .runtime.tma import TensorDescriptor

        return TensorDescriptor
    raise AttributeError(f"module 'minitriton' has no attribute {name!r}")


__all__ = list(_language_all) + ["kernel", "Kernel", "autotune", "Config", "TensorDescriptor", "func",
                                  "CompilationError", "InterpreterError"]
