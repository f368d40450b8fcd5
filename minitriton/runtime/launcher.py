"""Launching one compiled variant: its preallocated parameter buffer and its loaded function per device.

cuLaunchKernel takes `void **kernelParams`: one pointer per kernel parameter, each to the bytes of that parameter.
A ParamBuffer builds that once per compiled variant — a byte buffer with one aligned slot per parameter and the
array of pointers to the slots — so a launch only packs the new pointer and scalar values into the slots (one
`struct.pack_into`) and hands the driver the same address every time. Nothing is allocated on the device and nothing
synchronizes, so launches can be captured into CUDA graphs (the driver copies the parameters at launch / capture).
A lock per variant keeps concurrent launches from different threads from overwriting each other's slots.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from .driver import CudaError
from .specialize import parse_arg_spec

# The default dynamic shared memory a kernel may use without opting in.
SHARED_WITHOUT_OPT_IN = 48 * 1024


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

    `bytes` (an opaque `.b8 x[N]` parameter such as a TMA descriptor) is packed from a bytes object.
    """
    if type_code == "bytes":
        return Slot(name, f"{size}s", size, align)
    ty = parse_arg_spec(type_code).type
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
        params = meta["params"]
        self.params = ParamBuffer([slot_for(p["name"], p["type"], p["size"], p["align"]) for p in params])
        position = {n: i for i, n in enumerate(runtime_names)}
        missing = [p["name"] for p in params if p["name"] not in position]
        if missing:
            raise RuntimeError(f"compiled kernel '{self.name}' has parameters {missing} that the Python function "
                               f"does not pass at runtime")
        take = [position[p["name"]] for p in params]
        # Usually every runtime argument is a parameter, in order: then the packing needs no reordering.
        self.take = None if take == list(range(len(runtime_names))) else take
        self.driver: Any = None
        self.functions: dict[int, Any] = {}
        self.lock = threading.Lock()

    def __call__(self, driver: Any, device: int, gx: int, gy: int, gz: int, raw: list) -> None:
        if driver is not self.driver:  # a different driver (tests swap in fakes): handles are not shared
            self.driver, self.functions = driver, {}
        fn = self.functions.get(device)
        if fn is None:
            fn = self._load(driver, device)
        params = self.params
        stream = driver.current_stream(device)
        # One buffer per variant: two threads launching it at once must not interleave pack and launch (the
        # driver copies the parameters during cuLaunchKernel, which runs without the GIL).
        with self.lock:
            try:
                params.pack(params.buffer, 0, *(raw if self.take is None else [raw[i] for i in self.take]))
            except (struct.error, OverflowError) as e:
                raise self._pack_error(raw, e) from None
            err = driver.launch(fn, gx, gy, gz, self.threads, 1, 1, self.dynamic_shared, stream, params.address,
                                0)[0]
        if err:
            self._launch_failed(driver, err, device, (gx, gy, gz), raw)

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

    def _pack_error(self, raw: list, error: Exception) -> ValueError:
        values = raw if self.take is None else [raw[i] for i in self.take]
        for slot, value in zip(self.params.slots, values):
            try:
                struct.pack("<" + slot.fmt, value)
            except (struct.error, OverflowError) as e:
                return ValueError(f"argument '{slot.name}' = {value!r} of kernel '{self.name}' does not fit its "
                                  f"{slot.size}-byte parameter: {e}")
        return ValueError(f"cannot pack the arguments of kernel '{self.name}': {error}")

    def _launch_failed(self, driver: Any, err: Any, device: int, grid: tuple, raw: list) -> None:
        if driver.is_invalid_context(err):  # a thread without torch's context current: make it current, retry
            driver.ensure_context(device)
            with self.lock:
                self.params.pack(self.params.buffer, 0, *(raw if self.take is None else [raw[i] for i in self.take]))
                err = driver.launch(self.functions[device], *grid, self.threads, 1, 1, self.dynamic_shared,
                                    driver.current_stream(device), self.params.address, 0)[0]
            if not err:
                return
        raise CudaError(f"cuLaunchKernel of kernel '{self.name}' (grid {grid}, {self.threads} threads, "
                        f"{self.dynamic_shared} bytes dynamic shared memory) failed: {driver.error_message(err)}")
