"""The state of one kernel's PTX emission, shared by the lowering modules.

`KernelContext` holds the virtual registers of every IR value (a scalar is one register, every thread holding the
same value; a tile is the list of registers for the elements this thread owns, in the layout's register order —
see minitriton/ir/layouts.py), the instruction lines, and the per-thread index arithmetic every lowering needs:
lane / warp ids and, per layout dim, the thread's coordinate and base element. Index arithmetic depends only on
%tid, so it goes into a *prologue* placed before the kernel body, where it dominates every use no matter which
branch or loop first asked for it; constants go there too.

A register list may repeat a name (a splat or constant tile is one register); registers are written once, except
the ones scf lowering creates for carried values and results, which are fresh per value.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

from minitriton.errors import CompilationError
from minitriton.ir import Location, Operation, Value
from minitriton.ir.layouts import WARP_SIZE, DimMap, ThreadMap, log2, thread_map
from minitriton.ir.partitions import Partition
from minitriton.ir.types import TensorType

from .registers import RegisterFile, mov_type

SMEM_LIMIT = 48 * 1024  # static shared memory a kernel may declare
SCRATCH_ALIGN = 16  # exchange regions start 16-byte aligned (the widest vector access)


@dataclass
class Scratch:
    """A static shared buffer the lowerings reuse behind barriers: `smem` for the code outside partitions and
    partition 0, `smem_pJ` for partition J (partitions run at once, so each has its own)."""

    name: str
    nbytes: int = 0
    align: int = 16


class KernelContext:
    def __init__(self, func: Operation):
        self.func = func
        self.name: str = func.attrs["sym_name"]
        # A warp-specialized kernel (passes/warp_specialize.py) launches num_warps warps, but the code outside its
        # partitions was laid out for partition 0's warps (consumer_warps); inside a partition, num_warps is the
        # partition's (in_partition).
        self.block_warps = int(func.attrs.get("num_warps", 4))
        self.num_warps = int(func.attrs.get("consumer_warps", self.block_warps))
        self.outer_warps = self.num_warps  # what code outside the partitions is laid out for
        self.partition: Partition | None = None  # the partition being lowered (codegen/ptx.py lower_warp_specialize)
        self.scratches: dict[str, Scratch] = {"smem": Scratch("smem")}
        self.min_blocks_per_sm = int(func.attrs.get("min_blocks_per_sm", 0))
        self.regs = RegisterFile()
        self.body: list[str] = []
        self.prologue: list[str] = []
        self.values: dict[Value, list[str]] = {}
        self.smem_limit = SMEM_LIMIT  # read when the context is made, so tests can shrink it
        self.shared_decls: list[str] = []  # other .shared variables (mbarriers), declared after smem
        self.files: dict[str, int] = {}
        self._loc: tuple[int, int, int] | None = None
        self._labels = 0
        self._cache: dict[object, str] = {}
        self.op: Operation | None = None  # the op being lowered (for error messages)
        self.used: set[Value] = set()  # values some op reads (results nobody reads may skip work)
        # The scratch bytes [start, end) an exchange (layout conversions, cross-warp reductions and scans) wrote
        # before the latest barrier, and nobody else touched since: the next exchange may write elsewhere without a
        # barrier of its own (scratch_for_exchange). None after any other barrier or a label (code reached from
        # elsewhere).
        self.exchange_region: tuple[int, int] | None = None

    # ------------------------------------------------------------------------------------------ text

    def new(self, cls: str) -> str:
        return self.regs.new(cls)

    def emit(self, line: str) -> None:
        self.body.append(f"  {line}")

    def label(self, name: str) -> None:
        self.body.append(f"{name}:")
        self.exchange_region = None

    def new_label(self, tag: str) -> str:
        self._labels += 1
        return f"$L_{tag}_{self._labels}"

    def barrier(self) -> None:
        """A block barrier; inside a partition the partition's named barrier, counting its threads only (the
        other partitions never reach it)."""
        if self.partition is not None:
            self.emit(f"bar.sync {self.partition.barrier_id}, {self.partition.threads};")
        else:
            self.emit("bar.sync 0;")
        self.exchange_region = None

    def leader(self) -> str:
        """A predicate true on the one thread that issues single-thread work (TMA, expect_tx, scalar stores):
        thread 0, or inside a partition the partition's first thread."""
        return self.owner_pred(None)  # type: ignore[return-value]

    @contextmanager
    def in_partition(self, part: Partition) -> Iterator[None]:
        """Lower the code of partition `part`: its warps, barrier, leader and scratch buffer."""
        saved = self.partition, self.num_warps
        self.partition, self.num_warps = part, part.warps
        self.exchange_region = None
        if part.index:
            self.scratches.setdefault(self.scratch_name, Scratch(self.scratch_name))
        try:
            yield
        finally:
            self.partition, self.num_warps = saved
            self.exchange_region = None

    @property
    def scratch_name(self) -> str:
        return "smem" if self.partition is None or self.partition.index == 0 else f"smem_p{self.partition.index}"

    @property
    def smem_bytes(self) -> int:
        return self.scratches[self.scratch_name].nbytes

    @property
    def smem_align(self) -> int:
        """The alignment of the current scratch buffer (TMA raises it: 128, or 1024 for 128B-swizzled boxes)."""
        return self.scratches[self.scratch_name].align

    @smem_align.setter
    def smem_align(self, value: int) -> None:
        self.scratches[self.scratch_name].align = value

    def set_loc(self, loc: Location | None) -> None:
        """Emit `.loc` when the source position changes (line info for ptxas -lineinfo and error messages)."""
        if loc is None:
            return
        index = self.files.setdefault(loc.file, len(self.files) + 1)
        key = (index, loc.line, loc.col)
        if key != self._loc:
            self._loc = key
            self.body.append(f"  .loc {index} {loc.line} {loc.col + 1}")

    def error(self, message: str) -> CompilationError:
        """A CompilationError pointing at the op being lowered."""
        loc = self.op.loc if self.op is not None else None
        where = f"'{self.op.name}': " if self.op is not None else ""
        return CompilationError(f"PTX codegen: {where}{message}", loc)

    # ---------------------------------------------------------------------------------------- values

    def bind(self, v: Value, regs: Sequence[str]) -> None:
        self.values[v] = list(regs)

    def get(self, v: Value) -> list[str]:
        try:
            return self.values[v]
        except KeyError:
            raise self.error(f"value {v!r} has no registers (used before its definition?)") from None

    def get1(self, v: Value) -> str:
        """The register of a scalar value."""
        regs = self.get(v)
        if len(regs) != 1 or isinstance(v.type, TensorType):
            raise self.error(f"expected a scalar, got {v.type}")
        return regs[0]

    def tmap(self, v: Value) -> ThreadMap:
        t = v.type
        if not isinstance(t, TensorType) or t.encoding is None:
            raise self.error(f"expected a tile with a layout, got {t} (did the tiling pass run?)")
        return thread_map(t.encoding, t.shape)

    # ------------------------------------------------------------------------------ prologue values

    def _cached(self, key: object, make) -> str:  # type: ignore[no-untyped-def]
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def in_prologue(self, key: object, cls: str, text: str) -> str:
        """A register computed once in the prologue by `text` ({d} is the destination), cached under `key`: for
        per-thread values that depend only on %tid (addresses, predicates)."""
        return self._pro(key, cls, text)

    def const(self, lit: str, cls: str) -> str:
        """A register holding the immediate `lit` (emitted once, in the prologue)."""

        def make() -> str:
            r = self.new(cls)
            self.prologue.append(f"  mov.{mov_type(cls)} {r}, {lit};")
            return r

        return self._cached(("const", lit, cls), make)

    def _pro(self, key: object, cls: str, text: str) -> str:
        """A prologue register computed by `text` (with {d} for the destination), cached under `key`."""

        def make() -> str:
            r = self.new(cls)
            self.prologue.append("  " + text.format(d=r))
            return r

        return self._cached(key, make)

    @property
    def tid(self) -> str:
        return self._pro("tid", "b32", "mov.u32 {d}, %tid.x;")

    @property
    def lane(self) -> str:
        return self._pro("lane", "b32", f"and.b32 {{d}}, {self.tid}, {WARP_SIZE - 1};")

    @property
    def warp(self) -> str:
        return self._pro("warp", "b32", f"shr.u32 {{d}}, {self.tid}, 5;")

    def lane_coord(self, dm: DimMap) -> str:
        """The thread's lane coordinate along a dim (0 .. tpw-1)."""
        if dm.tpw == 1:
            return self.const("0", "b32")
        return self._pro(("lane_coord", dm.lane_shift, dm.tpw), "b32",
                         f"bfe.u32 {{d}}, {self.lane}, {dm.lane_shift}, {log2(dm.tpw)};")

    def warp_coord(self, dm: DimMap) -> str:
        if dm.wpc == 1:
            return self.const("0", "b32")
        return self._pro(("warp_coord", dm.warp_shift, dm.wpc), "b32",
                         f"bfe.u32 {{d}}, {self.warp}, {dm.warp_shift}, {log2(dm.wpc)};")

    def thread_coord(self, dm: DimMap) -> str:
        """lane_coord + tpw * warp_coord."""
        if dm.wpc == 1:
            return self.lane_coord(dm)
        if dm.tpw == 1:
            return self.warp_coord(dm)
        return self._pro(("thread_coord", dm.lane_shift, dm.tpw, dm.warp_shift, dm.wpc), "b32",
                         f"mad.lo.u32 {{d}}, {self.warp_coord(dm)}, {dm.tpw}, {self.lane_coord(dm)};")

    def dim_base(self, dm: DimMap) -> str:
        """The thread's first element along a dim: (spt * thread_coord) % size."""
        if dm.size == 1 or dm.tpw * dm.wpc == 1:
            return self.const("0", "b32")
        coord = self.thread_coord(dm)
        scaled = coord if dm.spt == 1 else self._pro(("scaled", coord, dm.spt), "b32",
                                                      f"shl.b32 {{d}}, {coord}, {log2(dm.spt)};")
        if dm.spt * dm.tpw * dm.wpc <= dm.size:
            return scaled
        return self._pro(("wrapped", scaled, dm.size), "b32", f"and.b32 {{d}}, {scaled}, {dm.size - 1};")

    def owner_pred(self, tmap: ThreadMap | None) -> str | None:
        """A predicate true on the one thread that owns each element (None when nobody shares elements). For a
        scalar (tmap None) the owner is thread 0, inside a partition its first thread."""
        if tmap is None:
            first = 0 if self.partition is None else self.partition.first_thread
            return self._pro(("owner_scalar", first), "pred", f"setp.eq.u32 {{d}}, {self.tid}, {first};")
        preds = []
        for dm in tmap.dims + tmap.hidden:
            if dm.is_replicated:
                limit = max(1, dm.size // dm.spt)
                preds.append(self._pro(("owner_dim", dm), "pred",
                                       f"setp.lt.u32 {{d}}, {self.thread_coord(dm)}, {limit};"))
        if not preds:
            return None
        acc = preds[0]
        for p in preds[1:]:
            acc = self._pro(("and_pred", acc, p), "pred", f"and.pred {{d}}, {acc}, {p};")
        return acc

    def linear_base(self, tmap: ThreadMap, strides: Sequence[int]) -> str:
        """sum_d base_d * strides[d]: the linear index of the thread's base element."""
        acc = self.const("0", "b32")
        for dm, stride in zip(tmap.dims, strides):
            if stride == 0 or dm.size == 1 or dm.tpw * dm.wpc == 1:
                continue
            base = self.dim_base(dm)
            acc = self._pro(("lin", acc, base, stride), "b32", f"mad.lo.u32 {{d}}, {base}, {stride}, {acc};")
        return acc

    # ---------------------------------------------------------------------------------------- shared

    @property
    def smem(self) -> str:
        """A register holding the address of the scratch buffer (the current partition's)."""
        name = self.scratch_name
        return self._pro(("smem", name), "b32", f"mov.u32 {{d}}, {name};")

    def need_smem(self, nbytes: int) -> None:
        total = sum(s.nbytes for s in self.scratches.values()) - self.smem_bytes + max(self.smem_bytes, nbytes)
        if nbytes > self.smem_limit or total > self.smem_limit:
            raise self.error(f"needs {nbytes} bytes of shared memory, more than the {self.smem_limit} available; "
                             f"use smaller blocks")
        scratch = self.scratches[self.scratch_name]
        scratch.nbytes = max(scratch.nbytes, nbytes)

    def smem_addr(self, tmap: ThreadMap, strides: Sequence[int], elem_bytes: int, offset: int = 0) -> str:
        """smem + offset + elem_bytes * linear_base(tmap, strides): add register offsets as immediates."""
        lin = self.linear_base(tmap, strides)
        return self._pro(("smem_addr", self.scratch_name, lin, elem_bytes, offset), "b32",
                         f"mad.lo.u32 {{d}}, {lin}, {elem_bytes}, {self.smem_at(offset)};")

    def scratch_for_exchange(self, nbytes: int) -> int:
        """The byte offset in the scratch buffer where a write / bar.sync / read exchange of nbytes writes, after the
        leading barrier its writes need, if any. Back-to-back exchanges alternate between two regions: the
        previous one's middle barrier ordered everything before it, and after it threads read only its region, so
        writing elsewhere needs no barrier (one bar.sync of two saved). After any other barrier or a label: offset
        0 behind a barrier. `exchange_published` ends the write half."""
        previous = self.exchange_region
        if previous is not None:
            base = 0 if nbytes <= previous[0] else -(-previous[1] // SCRATCH_ALIGN) * SCRATCH_ALIGN
            if base + nbytes <= self.smem_limit:
                self.need_smem(base + nbytes)
                return base
        self.need_smem(nbytes)
        self.barrier()
        return 0

    def exchange_published(self, base: int, nbytes: int) -> None:
        """The middle barrier of an exchange that wrote [base, base + nbytes) (scratch_for_exchange): its reads
        follow, and the next exchange may write the other region without a barrier."""
        self.barrier()
        self.exchange_region = (base, base + nbytes)

    def plus(self, reg: str, delta: int) -> str:
        """A b32 register holding reg + delta (reg itself when delta is 0), emitted at the current point."""
        if not delta:
            return reg
        out = self.new("b32")
        self.emit(f"add.s32 {out}, {reg}, {delta};")
        return out

    def smem_at(self, offset: int) -> str:
        """A register holding the scratch buffer's address plus offset."""
        return self.smem if offset == 0 else self._smem_plus(offset)

    def _smem_plus(self, offset: int) -> str:
        return self._pro(("smem_plus", self.scratch_name, offset), "b32", f"add.u32 {{d}}, {self.smem}, {offset};")
