"""The interpreter's global memory: torch tensors placed in a virtual address space, with checked gathers/scatters.

Each distinct torch storage behind the pointer arguments becomes a *buffer* whose first byte sits at
`(i + 1) << 42` (4 TiB apart). A tensor argument's pointer value is its buffer's base plus
`storage_offset * itemsize`, so views (slices, transposes, strided tensors) work like on the GPU, and two
arguments that share one storage share one buffer (writes through one are visible through the other).

An address belongs to the buffer whose base is nearest (the ±2 TiB window around it). A load, store or atomic
lane that is enabled by its mask must lie fully inside that buffer's storage and be aligned to the element size;
anything else raises InterpreterError naming the op's location, the lane, the address and the buffer. Lanes that
are masked off are never read or written.

Reads and writes go through a byte view of the whole untyped storage, reinterpreted as the element's raw dtype
(values.raw_dtype), so every torch dtype works, bf16 included.

Stores with several enabled lanes at one address: the last lane in row-major order wins (on the GPU the winner is
unspecified). Atomic adds at one address apply in row-major lane order; each lane returns the value it saw.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from ..errors import InterpreterError
from ..ir.core import Location
from ..ir.types import ScalarType
from .values import from_raw, raw_dtype, to_raw

BUFFER_SHIFT = 42  # buffer i starts at (i + 1) << BUFFER_SHIFT
HALF_WINDOW = 1 << (BUFFER_SHIFT - 1)


@dataclass
class Buffer:
    """One torch storage placed at `base` in the virtual address space."""

    base: int
    data: np.ndarray  # uint8 view of the whole untyped storage (shares memory with torch)
    names: list[str]  # the arguments pointing into it, for error messages
    typed: dict[np.dtype, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(self.data.shape[0])

    def view(self, dt: np.dtype) -> np.ndarray:
        """The storage as an array of `dt` elements (the tail that is too short for one element is left out)."""
        v = self.typed.get(dt)
        if v is None:
            n = self.nbytes // dt.itemsize
            v = self.typed[dt] = self.data[: n * dt.itemsize].view(dt)
        return v

    def describe(self) -> str:
        return f"buffer of argument {' / '.join(self.names)} ({self.nbytes} bytes of storage)"


class Memory:
    """The buffers of one interpreter run and checked element access to them."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []
        self._by_storage: dict[tuple[int, int], Buffer] = {}
        self._bases = np.zeros(0, dtype=np.int64)
        self._sizes = np.zeros(0, dtype=np.int64)

    def add_tensor(self, name: str, t: torch.Tensor) -> int:
        """Place `t`'s storage in the address space (once per storage) and return `t`'s first element's address."""
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        buf = self._by_storage.get(key)
        if buf is None:
            data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            buf = Buffer((len(self.buffers) + 1) << BUFFER_SHIFT, data, [])
            self.buffers.append(buf)
            self._by_storage[key] = buf
            self._bases = np.array([b.base for b in self.buffers], dtype=np.int64)
            self._sizes = np.array([b.nbytes for b in self.buffers], dtype=np.int64)
        buf.names.append(f"'{name}' ({str(t.dtype).replace('torch.', '')} {tuple(t.shape)})")
        return buf.base + t.storage_offset() * t.element_size()

    # -------------------------------------------------------------------------------------- addressing

    def resolve(self, addrs: np.ndarray, active: np.ndarray | None, itemsize: int, what: str,
                loc: Location | None, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Check the enabled lanes of the flat int64 `addrs` and find their elements.

        Returns (lanes, buf, idx): the enabled lane numbers, and for each its buffer number and element index
        (counted in `itemsize` units from the storage start). Raises InterpreterError for the first bad lane.
        """
        lanes = np.arange(addrs.size) if active is None else np.flatnonzero(active)
        sel = addrs[lanes]
        buf = ((sel + HALF_WINDOW) >> BUFFER_SHIFT) - 1
        known = (buf >= 0) & (buf < len(self.buffers))
        safe_buf = np.where(known, buf, 0)
        if not self.buffers:
            safe_bases = safe_sizes = np.zeros(sel.shape, dtype=np.int64)
        else:
            safe_bases, safe_sizes = self._bases[safe_buf], self._sizes[safe_buf]
        offset = sel - safe_bases
        ok = known & (offset >= 0) & (offset + itemsize <= safe_sizes) & (offset % itemsize == 0)
        if not ok.all():
            bad = int(np.argmin(ok))
            self._fail(int(lanes[bad]), int(sel[bad]), int(buf[bad]), itemsize, what, loc, shape)
        return lanes, buf, offset // itemsize

    def _fail(self, lane: int, addr: int, b: int, itemsize: int, what: str, loc: Location | None,
              shape: tuple[int, ...]) -> None:
        index = tuple(int(i) for i in np.unravel_index(lane, shape)) if shape else ()
        where = f"{what}: lane {index} address {addr:#x}"
        if not 0 <= b < len(self.buffers):
            raise InterpreterError(f"{where} points into no buffer (wild or null pointer)", loc)
        buffer = self.buffers[b]
        offset = addr - buffer.base
        if offset < 0:
            problem = f"is out of bounds: {-offset} bytes before the start of the"
        elif offset + itemsize > buffer.nbytes:
            problem = (f"is out of bounds: byte offset {offset} (element {offset // itemsize}, {itemsize}-byte "
                       f"elements) is past the end of the")
        else:
            problem = f"is misaligned: byte offset {offset} is not a multiple of the element size {itemsize} in the"
        raise InterpreterError(f"{where} {problem} {buffer.describe()}", loc)

    # -------------------------------------------------------------------------------------- access

    def gather(self, addrs: np.ndarray, active: np.ndarray | None, s: ScalarType, what: str,
               loc: Location | None, shape: tuple[int, ...]) -> np.ndarray:
        """Raw values at the flat `addrs` where `active` (all lanes when None); inactive lanes read as 0."""
        dt = raw_dtype(s)
        out = np.zeros(addrs.shape, dtype=dt)
        lanes, buf, idx = self.resolve(addrs, active, dt.itemsize, what, loc, shape)
        for b, part in _groups(buf):
            out[lanes[part]] = self.buffers[b].view(dt)[idx[part]]
        return out

    def scatter(self, addrs: np.ndarray, active: np.ndarray | None, raw: np.ndarray, s: ScalarType, what: str,
                loc: Location | None, shape: tuple[int, ...]) -> None:
        """Write raw values to the flat `addrs` where `active`; duplicate addresses: the last lane wins."""
        dt = raw_dtype(s)
        lanes, buf, idx = self.resolve(addrs, active, dt.itemsize, what, loc, shape)
        for b, part in _groups(buf):
            target, values = _last_lane_wins(idx[part], raw[lanes[part]])
            self.buffers[b].view(dt)[target] = values

    def atomic_add(self, addrs: np.ndarray, active: np.ndarray | None, values: np.ndarray, s: ScalarType,
                   add: Callable[[np.ndarray, np.ndarray], np.ndarray], what: str, loc: Location | None,
                   shape: tuple[int, ...]) -> np.ndarray:
        """Add `values` at the flat `addrs` lane by lane in row-major order; returns each lane's old value (0 for
        masked-off lanes). `add(a, b)` adds two value arrays in the element type."""
        dt = raw_dtype(s)
        old = np.zeros(addrs.shape, dtype=values.dtype)
        lanes, buf, idx = self.resolve(addrs, active, dt.itemsize, what, loc, shape)
        for b, part in _groups(buf):
            view, lane_ids, target = self.buffers[b].view(dt), lanes[part], idx[part]
            # Each round handles the first remaining lane of every address, so a lane sees its predecessors' adds.
            while target.size:
                _, first = np.unique(target, return_index=True)
                here, now = target[first], lane_ids[first]
                seen = from_raw(view[here], s)
                old[now] = seen
                view[here] = to_raw(add(seen, values[now]), s)
                rest = np.ones(target.size, dtype=bool)
                rest[first] = False
                lane_ids, target = lane_ids[rest], target[rest]
        return old


def _groups(buf: np.ndarray) -> Iterator[tuple[int, np.ndarray | slice]]:
    """(buffer number, selection of lanes) pairs; one group without copying in the common one-buffer case."""
    if buf.size == 0:
        return
    first = int(buf[0])
    if (buf == first).all():
        yield first, slice(None)
        return
    for b in np.unique(buf):
        yield int(b), np.flatnonzero(buf == b)


def _last_lane_wins(target: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop all but the last lane writing each element (numpy leaves repeated-index assignment unordered)."""
    uniq, last_rev = np.unique(target[::-1], return_index=True)
    if uniq.size == target.size:
        return target, values
    keep = target.size - 1 - last_rev
    return target[keep], values[keep]
