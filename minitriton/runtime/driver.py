"""The CUDA driver, through cuda-bindings (`cuda.bindings.driver`), behind a small interface the launcher uses.

Nothing here touches the driver, or imports torch or cuda-bindings, at import time: the first launch creates the
CudaDriver. Tests install a fake with `set_driver` (same methods), so the launch path runs without a GPU.

The interface (what launcher.py, binder.py and jit.py call):
    current_device() -> int                 torch's current CUDA device (a fake may answer -1: host tensors)
    current_stream(device) -> Any           torch's current stream on that device (a raw handle `launch` takes)
    streams (optional)                      raw handle -> the form `launch` takes fastest (CudaDriver: CUstream)
    load_function(image, name, device)      cubin bytes or PTX text -> a function handle (module kept alive)
    set_max_dynamic_shared(fn, nbytes)      opt in to more than 48 KB of dynamic shared memory
    max_shared_per_block(device) -> int     the opt-in limit, for a readable error before launching
    launch                                  cuLaunchKernel itself (11 arguments, returns a tuple, first the error;
                                            the last, `extra`, is the launch_flags value: 0, or 1 for a
                                            programmatic dependent launch through cuLaunchKernelEx)
    launch_flags(programmatic) (optional)   that flag for a kernel (metadata `programmatic_launch`); absent: 0
    error_message(err) -> str               "CUDA_ERROR_X: description"
    ensure_context(device)                  make torch's (primary) context current on this thread

The launch hot path calls current_device, current_stream and launch at every launch: `HOT` holds the active driver
with those bound once, plus its `streams` mapping (set_driver and get_driver keep it current), so a launch reads
them with one list unpack instead of attribute lookups. The real driver binds them to C functions (torch's device
and raw-stream getters, and cuLaunchKernel through runtime/c_launch.py, a small C extension built on first use, which
takes function and stream handles as ints: 2 us per launch less than cuda-bindings' wrapper on the H200). Without a
C compiler it falls back to cuda-bindings' cuLaunchKernel and maps raw handles to cached CUstream objects with a dict
(a hit is a C-level lookup; cuLaunchKernel converts a CUstream ~40 ns faster than an int), so no Python code runs.
"""
from __future__ import annotations

import threading
from typing import Any


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call, the kernel and the driver's error."""


class StreamObjects(dict):
    """raw stream handle -> `make(handle)`, made on first use (a dict hit runs no Python code). Bounded: a
    program that creates streams without end starts the cache over."""

    LIMIT = 4096

    def __init__(self, make: Any):
        super().__init__()
        self.make = make

    def __missing__(self, raw: int) -> Any:
        if len(self) >= self.LIMIT:
            self.clear()
        obj = self[raw] = self.make(raw)
        return obj


class _SameHandle(dict):
    """The `streams` of a driver without one: every handle stands for itself."""

    def __missing__(self, raw: Any) -> Any:
        return raw


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
        # The raw-stream getter Triton uses: far cheaper than torch.cuda.current_stream().cuda_stream.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.current_stream = raw if raw is not None else (
            lambda device: torch.cuda.current_stream(device).cuda_stream)
        self.streams = StreamObjects(cu.CUstream)
        self._modules: list[Any] = []  # keeps every loaded module alive as long as the driver
        self._check(cu.cuInit(0), "cuInit")
        # Handles as ints -> cuda-bindings objects, for the calls other than launch (c_launch takes ints).
        self._functions: dict[int, Any] = {}
        self.programmatic = False  # launches through cuLaunchKernelEx (c_launch.PROGRAMMATIC) are possible
        self.c_launch = self._use_c_launch()

    def _use_c_launch(self) -> bool:
        """Launch through runtime/c_launch.py (ints for function and stream handles) when it builds here."""
        import ctypes

        from . import c_launch

        fast = c_launch.load()
        if fast is None:
            return False
        try:
            address = ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernel, ctypes.c_void_p).value
        except (OSError, AttributeError):
            return False
        fast.bind(address)
        try:  # programmatic dependent launch (CUDA >= 11.8 drivers)
            fast.bind_ex(ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx, ctypes.c_void_p).value)
            self.programmatic = True
        except (OSError, AttributeError):
            pass
        self.launch = fast.launch
        self.streams = StreamObjects(lambda raw: raw)  # raw handles as they are (a dict hit, no Python code)
        return True

    def launch_flags(self, programmatic: bool) -> int:
        """The `extra` argument of `launch` for a kernel: c_launch.PROGRAMMATIC for one that waits on the previous
        grid (mt.grid_dependency_wait) where the C launcher has cuLaunchKernelEx, else 0 (a plain launch: the
        kernel's wait then returns at once)."""
        from .c_launch import PROGRAMMATIC

        return PROGRAMMATIC if programmatic and self.programmatic else 0

    def _check(self, result: tuple, what: str) -> Any:
        err, *rest = result
        if err:
            raise CudaError(f"{what} failed: {self.error_message(err)}")
        return rest[0] if len(rest) == 1 else rest

    def error_message(self, err: Any) -> str:
        cu = self.cu
        err = cu.CUresult(err) if isinstance(err, int) else err  # c_launch returns plain ints
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
        fn = self._check(self.cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction('{name}')")
        if not self.c_launch:
            return fn
        self._functions[int(fn)] = fn
        return int(fn)

    def set_max_dynamic_shared(self, fn: Any, nbytes: int) -> None:
        attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        fn = self._functions.get(fn, fn) if isinstance(fn, int) else fn
        self._check(self.cu.cuFuncSetAttribute(fn, attr, nbytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE)")

    def max_shared_per_block(self, device: int) -> int:
        attr = self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        dev = self._check(self.cu.cuDeviceGet(device), "cuDeviceGet")
        return int(self._check(self.cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))

    def resident_blocks(self, fn: Any, device: int, threads: int, dynamic_shared: int) -> int:
        """Blocks of `fn` (launched with `threads` threads and `dynamic_shared` bytes) that the device runs at
        once: the occupancy calculator's blocks per SM (registers, shared memory, warps) times the SM count."""
        fn = self._functions.get(fn, fn) if isinstance(fn, int) else fn
        per_sm = self._check(self.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, dynamic_shared),
                             "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        attr = self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        dev = self._check(self.cu.cuDeviceGet(device), "cuDeviceGet")
        return int(per_sm) * int(self._check(self.cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))

    def is_invalid_context(self, err: Any) -> bool:
        return int(err) == int(self.cu.CUresult.CUDA_ERROR_INVALID_CONTEXT)


def stream_for(driver: Any, device: int) -> Any:
    """The current stream of `device` as `driver.launch` takes it (through `driver.streams` when it has one): what
    the slow paths pass, the same object the hot path gets from HOT."""
    raw = driver.current_stream(device)
    streams = getattr(driver, "streams", None)
    return raw if streams is None else streams[raw]


_active: Any = None
_lock = threading.Lock()
# [driver, current_device, current_stream, streams, launch] of the active driver; all None until there is one.
HOT: list[Any] = [None] * 5


def _install(driver: Any) -> None:
    global _active
    _active = driver
    # One slice assignment: a launch on another thread unpacks either the old five or the new five.
    if driver is None:
        HOT[:] = [None] * 5
        return
    streams = getattr(driver, "streams", None)  # (an empty mapping is falsy: test for None)
    HOT[:] = [driver, driver.current_device, driver.current_stream, _SameHandle() if streams is None else streams,
              driver.launch]


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
