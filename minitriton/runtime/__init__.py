"""The runtime: `@mt.kernel` (jit.py), specialization keys (specialize.py), source fingerprints (fingerprint.py),
the on-disk cache (cache.py), the CUDA driver wrapper (driver.py) and the launcher with its preallocated parameter
buffers (launcher.py)."""
from .cache import DiskCache, cache_dir
from .driver import CudaError, get_driver, set_driver
from .jit import AotSpec, Kernel, kernel
from .specialize import ArgSpec, SignatureError, parse_arg_spec, parse_signature

__all__ = [
    "AotSpec", "ArgSpec", "CudaError", "DiskCache", "Kernel", "SignatureError", "cache_dir", "get_driver", "kernel",
    "parse_arg_spec", "parse_signature", "set_driver",
]
