"""The runtime: `@mt.kernel` (jit.py), its generated launch functions (binder.py), specialization keys
(specialize.py), source fingerprints (fingerprint.py), the on-disk cache (cache.py), the CUDA driver wrapper
(driver.py), the launcher with its preallocated parameter buffers (launcher.py) and host-side TMA tensor
descriptors (tma.py)."""
from .cache import DiskCache, cache_dir
from .driver import CudaError, get_driver, set_driver
from .jit import AotSpec, Kernel, kernel
from .specialize import ArgSpec, SignatureError, parse_arg_spec, parse_signature
from .tma import TensorDescriptor, TensorDescriptorError

__all__ = [
    "AotSpec", "ArgSpec", "CudaError", "DiskCache", "Kernel", "SignatureError", "cache_dir", "get_driver", "kernel",
    "parse_arg_spec", "parse_signature", "set_driver", "TensorDescriptor", "TensorDescriptorError",
]
