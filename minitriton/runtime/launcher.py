"""Launching one compiled variant: its preallocated parameter buffer and its loaded function per device.

cuLaunchKernel takes `void **kernelParams`: one pointer per kernel parameter, each to the bytes of that parameter.
A ParamBuffer builds that once per compiled variant — a byte buffer with one aligned slot per parameter and the
array of pointers to the slots — so a launch only packs the new pointer and scalar values into the slots (one
`struct.pack_into`) and hands the driver the same address every time. Nothing is allocated on the device and nothing
synchronizes, so launches can be captured into CUDA graphs (the driver copies the parameters during the call).

How the hot path works (`kernel[grid](x, y, out, n, BLOCK=128)` once the variant exists):
  1. `kernel[grid]` is a dict hit returning the launch function generated for the kernel (binder.py), made once per
     grid; the grid was validated when it was made.
  2. Calling it, Python binds the arguments to the kernel's own parameter list (no Python-level binding code).
  3. One environment-dict read for MINITRITON_INTERPRET; one list unpack gives the active driver's three per-launch
     calls (driver.HOT); current_device().
  4. Per runtime argument, inline: tensor -> data_ptr, get_device (checked against the current device), dtype and
     16-byte alignment; int -> i32 / i32:16 / i32=1 (i64 through a helper); float -> fp32.
  5. One flat key tuple, one dict lookup: the entry of (device, specialization) -> `Launcher.entry`, a tuple of the
     function handle, the packer, the buffer and its address, block size, shared memory and the owning thread.
  6. current_stream(device) (a C getter: torch's raw stream handle) and the driver's dict of CUstream objects.
  7. The owning thread packs the variant's buffer (one struct.pack_into) and calls cuLaunchKernel (cuda-bindings,
     the function handle as a CUfunction object, the parameter array as an address).
Anything unusual — a new key, a replaced driver, a bad argument, a value that does not fit its slot, a failed
launch — leaves this path for the Kernel / Launcher method that handles it; tools/launch_profile.py times each step.

Threads: the driver call releases the GIL, so two threads packing one buffer could each launch with the other's
values. Instead of a lock on every launch, the buffer belongs to one thread (`owner`, the first to launch the
variant); any other thread launches through `launch_shared`, which packs a second buffer under a lock.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from .driver import CudaError, stream_for
from minitriton.ir.types import TensorDescType

from .specialize import parse_arg_spec

# The default dynamic shared memory a kernel may use without opting in.
SHARED_WITHOUT_OPT_IN = 48 * 1024
# What struct raises for a value that does not fit its slot.
PACK_ERRORS = (struct.error, OverflowError, TypeError)


@dataclass(frozen=True)
class Slot:
    """One kernel parameter: its name, struct format character(s), size and alignment in bytes."""

    name: str
    fmt: str
    size: int
    align: int


_SIGNED = {1: "b", 2: "h", 4: "i", 8: "q"}
_UNSIGNED = {1: "B", 2: "H", 4: "I", 8: "Q"}
_FLOAT = {2: "e", 4: "f", 8: "d"}


def slot_for(name: str, type_code: str, size: int, align: int) -> Slot:
    """The slot of a parameter whose Triton-spelled type is `type_code` and whose PTX declaration has `size` bytes.

    `bytes` (an opaque `.b8 x[N]` parameter) and `tensordesc<...>` (a TMA tensor map, runtime/tma.py) are packed
    from a bytes object.
    """
    ty = None if type_code == "bytes" else parse_arg_spec(type_code).type
    if ty is None or isinstance(ty, TensorDescType):  # a tensor map travels as its 128 bytes
        return Slot(name, f"{size}s", size, align)
    if ty.is_pointer:
        table = {8: "Q"}
    elif ty.is_float:  # type: ignore[union-attr]
        table = _FLOAT
    elif ty.is_bool or not ty.is_signed:  # type: ignore[union-attr]
        table = _UNSIGNED
    else:
        table = _SIGNED
    if size not in table:
        raise ValueError(f"parameter '{name}' of type {type_code} cannot be passed in a {size}-byte PTX parameter")
    return Slot(name, table[size], size, align)


class ParamBuffer:
    """The parameter bytes of one compiled variant and the `void *[]` array pointing at each slot, built once."""

    def __init__(self, slots: Sequence[Slot]):
        self.slots = list(slots)
        fmt, self.offsets, offset = "<", [], 0
        for slot in self.slots:
            pad = -offset % slot.align
            fmt += "x" * pad + slot.fmt
            offset += pad
            self.offsets.append(offset)
            offset += slot.size
        self.struct = struct.Struct(fmt)
        self.buffer = ctypes.create_string_buffer(max(offset, 1))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(self.slots), 1))(*[base + o for o in self.offsets])
        self.address = ctypes.addressof(self.pointers) if self.slots else 0
        self.pack = self.struct.pack_into  # pack(buffer, 0, *values)

    def slot_bytes(self, index: int) -> bytes:
        """The bytes currently in slot `index` (for tests and debugging)."""
        start = self.offsets[index]
        return self.buffer.raw[start:start + self.slots[index].size]


class Launcher:
    """A compiled variant ready to launch: CompiledKernel metadata + ParamBuffer + a function handle per device."""

    def __init__(self, compiled: Any, runtime_names: Sequence[str]):
        meta = compiled.metadata
        self.compiled = compiled
        self.name: str = meta["name"]
        self.threads = 32 * int(meta["num_warps"])
        self.static_shared = int(meta.get("shared") or 0)
        self.dynamic_shared = int(meta.get("dynamic_shared") or 0)
        # launch flags, the driver launch's last argument (driver.launch_flags: 0 where the driver has no early launch)
        self.programmatic = bool(meta.get("programmatic_launch"))
        self.flags = 0
        params = meta["params"]
        self.params = ParamBuffer([slot_for(p["name"], p["type"], p["size"], p["align"]) for p in params])
        position = {n: i for i, n in enumerate(runtime_names)}
        missing = [p["name"] for p in params if p["name"] not in position]
        if missing:
            raise RuntimeError(f"compiled kernel '{self.name}' has parameters {missing} that the Python function "
                               f"does not pass at runtime")
        take = [position[p["name"]] for p in params]
        # Usually every runtime argument is a parameter, in order: then packing is struct.pack_into itself.
        self.take = None if take == list(range(len(runtime_names))) else take
        self.pack = self.params.pack if self.take is None else self._pack_reordered
        # Tensor descriptors arrive as TensorDescriptor objects; their slots take the 128-byte tensor map.
        self.descriptor_slots = [i for i, p in enumerate(params) if p["type"].startswith("tensordesc<")]
        if self.descriptor_slots:
            self.pack = self._pack_with_tensor_maps
        self.driver: Any = None
        self.functions: dict[int, Any] = {}
        self.owner: int | None = None  # the thread that packs self.params (see the module docstring)
        self.shared_params: ParamBuffer | None = None  # the buffer of every other thread, packed under self.lock
        self.lock = threading.Lock()

    def _pack_reordered(self, buffer: Any, offset: int, *raw: Any) -> None:
        self.params.struct.pack_into(buffer, offset, *[raw[i] for i in self.take])  # type: ignore[union-attr]

    def _pack_with_tensor_maps(self, buffer: Any, offset: int, *raw: Any) -> None:
        values = list(raw) if self.take is None else [raw[i] for i in self.take]
        for i in self.descriptor_slots:
            values[i] = values[i].tensor_map()
        self.params.struct.pack_into(buffer, offset, *values)

    def function(self, driver: Any, device: int) -> Any:
        """The function handle on `device`, loaded through `driver` on first use."""
        if driver is not self.driver:  # a different driver (tests swap in fakes): handles are not shared
            self.driver, self.functions = driver, {}
            flags = getattr(driver, "launch_flags", None)  # drivers without it (test fakes) launch plainly
            self.flags = flags(self.programmatic) if flags is not None else 0
        fn = self.functions.get(device)
        return fn if fn is not None else self._load(driver, device)

    def entry(self, driver: Any, device: int) -> tuple:
        """What the generated launch function unpacks on a hit (binder.py): loads the function if needed."""
        fn = self.function(driver, device)
        with self.lock:
            if self.owner is None:
                self.owner = threading.get_ident()
        params = self.params
        return (driver, fn, self.pack, params.buffer, params.address, self.threads, self.dynamic_shared, self.owner,
                self, self.flags)

    def __call__(self, driver: Any, device: int, gx: int, gy: int, gz: int, raw: list) -> None:
        """Launch on torch's current stream of `device` (the generic path; binder.py inlines the same steps)."""
        fn = self.function(driver, device)
        err = self.launch(driver.launch, fn, gx, gy, gz, stream_for(driver, device), raw)
        if err:
            self.launch_failed(driver, err, device, (gx, gy, gz), raw)

    def launch(self, launch: Any, fn: Any, gx: int, gy: int, gz: int, stream: Any, raw: Sequence[Any]) -> Any:
        """Pack `raw` (runtime argument values, in the Python function's order) and launch; returns the error."""
        if self.owner is None:
            with self.lock:
                if self.owner is None:
                    self.owner = threading.get_ident()
        if threading.get_ident() != self.owner:
            return self.launch_shared(launch, fn, gx, gy, gz, stream, raw)
        params = self.params
        try:
            self.pack(params.buffer, 0, *raw)
        except PACK_ERRORS as e:
            raise self.pack_error(raw, e) from None
        return launch(fn, gx, gy, gz, self.threads, 1, 1, self.dynamic_shared, stream, params.address, self.flags)[0]

    def launch_shared(self, launch: Any, fn: Any, gx: int, gy: int, gz: int, stream: Any,
                      raw: Sequence[Any]) -> Any:
        """A launch from a thread that does not own the variant's buffer: a second buffer, one thread at a time
        (the lock is held through the driver call, which reads the buffer without the GIL)."""
        with self.lock:
            if self.shared_params is None:
                self.shared_params = ParamBuffer(self.params.slots)
            params = self.shared_params
            try:
                self.pack(params.buffer, 0, *raw)
            except PACK_ERRORS as e:
                raise self.pack_error(raw, e) from None
            return launch(fn, gx, gy, gz, self.threads, 1, 1, self.dynamic_shared, stream, params.address, self.flags)[0]

    def _load(self, driver: Any, device: int) -> Any:
        compiled = self.compiled
        total = self.static_shared + self.dynamic_shared
        if total > SHARED_WITHOUT_OPT_IN:
            limit = driver.max_shared_per_block(device)
            if total > limit:
                raise RuntimeError(f"kernel '{self.name}' needs {total} bytes of shared memory per block; the "
                                   f"device allows {limit}. Use smaller tiles or fewer stages (num_stages).")
        image = compiled.cubin if compiled.cubin is not None else compiled.ptx
        fn = driver.load_function(image, self.name, device)
        if total > SHARED_WITHOUT_OPT_IN and self.dynamic_shared:
            driver.set_max_dynamic_shared(fn, self.dynamic_shared)
        self.functions[device] = fn
        return fn

    def pack_error(self, raw: Sequence[Any], error: Exception) -> ValueError:
        values = raw if self.take is None else [raw[i] for i in self.take]
        for slot, value in zip(self.params.slots, values):
            try:
                struct.pack("<" + slot.fmt, value)
            except PACK_ERRORS as e:
                return ValueError(f"argument '{slot.name}' = {value!r} of kernel '{self.name}' does not fit its "
                                  f"{slot.size}-byte parameter: {e}")
        return ValueError(f"cannot pack the arguments of kernel '{self.name}': {error}")

    def launch_failed(self, driver: Any, err: Any, device: int, grid: tuple, raw: Sequence[Any]) -> None:
        """After a failed cuLaunchKernel: retry once on a thread without torch's context current, else raise."""
        if driver.is_invalid_context(err):
            driver.ensure_context(device)
            err = self.launch(driver.launch, self.function(driver, device), *grid, stream_for(driver, device), raw)
            if not err:
                return
        raise CudaError(f"cuLaunchKernel of kernel '{self.name}' (grid {grid}, {self.threads} threads, "
                        f"{self.dynamic_shared} bytes dynamic shared memory) failed: {driver.error_message(err)}")
