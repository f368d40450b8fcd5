"""The CUDA driver, through cuda-bindings (`cuda.bindings.driver`), behind a small interface the launcher uses.

Nothing here touches the driver, or imports torch or cuda-bindings, at import time: the first launch creates the
CudaDriver. Tests install a fake with `set_driver` (same methods), so the launch path runs without a GPU.

The interface (what launcher.py, binder.py and jit.py call):
    current_device() -> int                 torch's current CUDA device (a fake may answer -1: host tensors)
    current_stream(device) -> Any           torch's current stream on that device, in a form `launch` takes
    load_function(image, name, device)      cubin bytes or PTX text -> a function handle (module kept alive)
    set_max_dynamic_shared(fn, nbytes)      opt in to more than 48 KB of dynamic shared memory
    max_shared_per_block(device) -> int     the opt-in limit, for a readable error before launching
    launch                                  cuLaunchKernel itself (11 arguments, returns a tuple, first the error)
    error_message(err) -> str               "CUDA_ERROR_X: description"
    ensure_context(device)                  make torch's (primary) context current on this thread

The launch hot path calls current_device, current_stream and launch at every launch: `HOT` holds the active driver
with those three bound once (set_driver and get_driver keep it current), so a launch reads them with one list
unpack instead of three attribute lookups. The real driver binds them to C functions (torch's device and raw-stream
getters, cuda-bindings' cuLaunchKernel), so none of the three runs Python code.
"""
from __future__ import annotations

import threading
from typing import Any


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call, the kernel and the driver's error."""


class CudaDriver:
    """The real driver. Created on first use; binds the three per-launch calls to C functions directly."""

    def __init__(self) -> None:
        import torch
        from cuda.bindings import driver as cu

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU is available; set MINITRITON_INTERPRET=1 to run kernels on the CPU "
                               "through the interpreter")
        torch.cuda.init()
        self.cu = cu
        self.launch = cu.cuLaunchKernel
        # torch.cuda.current_device without its lazy-init check (done above).
        self.current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
        # The raw-stream getter Triton uses: far cheaper than torch.cuda.current_stream().cuda_stream. It answers
        # the handle as an int, which cuLaunchKernel takes as it is (converting it costs less than a Python-level
        # cache of CUstream objects would).
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.current_stream = raw if raw is not None else (
            lambda device: torch.cuda.current_stream(device).cuda_stream)
        self._modules: list[Any] = []  # keeps every loaded module alive as long as the driver
        self._check(cu.cuInit(0), "cuInit")

    def _check(self, result: tuple, what: str) -> Any:
        err, *rest = result
        if err:
            raise CudaError(f"{what} failed: {self.error_message(err)}")
        return rest[0] if len(rest) == 1 else rest

    def error_message(self, err: Any) -> str:
        cu = self.cu
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        return f"{name}: {text}"

    def ensure_context(self, device: int) -> None:
        """Make the device's primary context (the one torch uses) current on this thread."""
        import torch

        torch.cuda.init()
        ctx = self._check(self.cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is not None and int(ctx) != 0:
            return
        dev = self._check(self.cu.cuDeviceGet(device), "cuDeviceGet")
        ctx = self._check(self.cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        self._check(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load_function(self, image: bytes | str, name: str, device: int) -> Any:
        """Load a cubin (bytes) or PTX (str, JIT-compiled by the driver) and return the entry `name`."""
        self.ensure_context(device)
        data = image if isinstance(image, bytes) else image.encode() + b"\0"
        what = "cuModuleLoadData(cubin)" if isinstance(image, bytes) else "cuModuleLoadData(PTX, driver JIT)"
        module = self._check(self.cu.cuModuleLoadData(data), f"{what} for kernel '{name}'")
        self._modules.append(module)
        return self._check(self.cu.cuModuleGetFunction(module, name.encode()),
                           f"cuModuleGetFunction('{name}')")

    def set_max_dynamic_shared(self, fn: Any, nbytes: int) -> None:
        attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._check(self.cu.cuFuncSetAttribute(fn, attr, nbytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE)")

    def max_shared_per_block(self, device: int) -> int:
        attr = self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        dev = self._check(self.cu.cuDeviceGet(device), "cuDeviceGet")
        return int(self._check(self.cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))

    def is_invalid_context(self, err: Any) -> bool:
        return err == self.cu.CUresult.CUDA_ERROR_INVALID_CONTEXT


_active: Any = None
_lock = threading.Lock()
# [driver, current_device, current_stream, launch] of the active driver; all None until there is one.
HOT: list[Any] = [None, None, None, None]


def _install(driver: Any) -> None:
    global _active
    _active = driver
    # One slice assignment: a launch on another thread unpacks either the old four or the new four.
    HOT[:] = [None] * 4 if driver is None else [driver, driver.current_device, driver.current_stream, driver.launch]


def get_driver() -> Any:
    """The active driver, created on first call (this is the first thing that needs a GPU)."""
    if _active is None:
        with _lock:
            if _active is None:
                _install(CudaDriver())
    return _active


def activate() -> list[Any]:
    """HOT after creating the driver if there is none yet (the launch hot path's first call)."""
    get_driver()
    return list(HOT)


def set_driver(driver: Any) -> Any:
    """Install `driver` (a fake in tests; None to go back to the real one on next use). Returns the previous one."""
    with _lock:
        previous = _active
        _install(driver)
    return previous
