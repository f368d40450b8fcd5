"""What layout encodings mean: which thread of a CTA holds which element of a tile, in which register.

Two distributed encodings (Triton's, simplified), attached to tensor types by the tiling pass:

  #mt.blocked<{sizePerThread = [..], threadsPerWarp = [..], warpsPerCTA = [..], order = [..]}>
  #mt.slice<{dim = d, parent = #mt.blocked<...>}>

Blocked. `order` lists the dims from fastest to slowest varying. Thread `tid` has lane = tid % 32 and warp =
tid // 32; the lane is split into one coordinate per dim (lane_d, taking log2(threadsPerWarp[d]) bits, the dims in
`order`, the first dim of `order` in the lowest bits), and so is the warp. The thread's coordinate along d is
t_d = lane_d + threadsPerWarp[d] * warp_d. One "CTA tile" covers tile_d = sizePerThread[d] * threadsPerWarp[d] *
warpsPerCTA[d] elements along d. Along a dim of extent S_d, the thread holds the elements

    (spt_d * t_d) % S_d  +  rep * tile_d + s,     s < min(spt_d, S_d),  rep < max(1, S_d // tile_d)

that is: a contiguous run of sizePerThread elements per CTA tile, the tile repeated when the tensor is larger,
wrapped around (several threads holding the same element: "replication") when it is smaller. Every extent is a
power of two, so this splits into a per-thread *base* (the first term) plus a per-register constant *offset*
(the rest), which is what makes the codegen simple: an element's coordinate is base(thread) + offset(register).
Registers are numbered over the per-dim local indices j_d = rep * min(spt_d, S_d) + s, with the first dim of
`order` varying fastest, so the `sizePerThread` elements of a run along order[0] are consecutive registers (the
vectorized loads and stores rely on this).

Slice. `#mt.slice<{dim = d, parent = P}>` over a shape S is P over S with a size-1 dim inserted at d, that dim then
dropped: reduce(x: P, axis=d) gives a slice of P, and expand_dims(slice(d, P), axis=d) gives back P with the
same registers. The lanes and warps that P spreads along d hold copies of the same element.

The tensor-core encodings `#mt.mma` (dot accumulators) and `#mt.dot_op` (mma.sync operands) are distributed
layouts too; their thread maps are built in minitriton/ir/mma_layouts.py (an mma accumulator's is a blocked one).

Everything below is pure Python on ints (no IR walking): `thread_map(encoding, shape)` gives a ThreadMap, and the
functions on it say what a thread holds. The codegen builds every lowering on these functions, and the tests
check them exhaustively on small shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

from .types import LayoutAttr, layout

WARP_SIZE = 32


def log2(n: int) -> int:
    """log2 of a power of two (raises on anything else: every extent in a layout is a power of two)."""
    if n <= 0 or n & (n - 1):
        raise ValueError(f"{n} is not a power of two")
    return n.bit_length() - 1


# --------------------------------------------------------------------------------------- building encodings


def blocked(size_per_thread: Sequence[int], threads_per_warp: Sequence[int], warps_per_cta: Sequence[int],
            order: Sequence[int]) -> LayoutAttr:
    """The `#mt.blocked` encoding with these parameters (checked: see `check_blocked`)."""
    enc = layout("blocked", sizePerThread=list(size_per_thread), threadsPerWarp=list(threads_per_warp),
                 warpsPerCTA=list(warps_per_cta), order=list(order))
    check_blocked(enc)
    return enc


def slice_of(dim: int, parent: LayoutAttr) -> LayoutAttr:
    """`#mt.slice<{dim = dim, parent = parent}>`: the layout of parent-layout values reduced over `dim`."""
    if not 0 <= dim < rank_of(parent):
        raise ValueError(f"slice dim {dim} out of range for {parent}")
    return layout("slice", dim=dim, parent=parent)


def is_blocked(enc: LayoutAttr | None) -> bool:
    return enc is not None and enc.kind == "blocked"


def is_slice(enc: LayoutAttr | None) -> bool:
    return enc is not None and enc.kind == "slice"


def rank_of(enc: LayoutAttr) -> int:
    """The rank of the tensors this encoding lays out."""
    if enc.kind == "blocked":
        return len(enc.get("order"))
    if enc.kind == "slice":
        return rank_of(enc.get("parent")) - 1
    if enc.kind in ("mma", "dot_op"):  # tensor-core layouts (minitriton/ir/mma_layouts.py) are 2-D
        return 2
    raise ValueError(f"unknown layout kind {enc.kind!r}")


def num_warps_of(enc: LayoutAttr) -> int:
    """How many warps the encoding spreads a tile over."""
    while enc.kind in ("slice", "dot_op"):
        enc = enc.get("parent")
    n = 1
    for w in enc.get("warpsPerCTA"):
        n *= w
    return n


def check_blocked(enc: LayoutAttr) -> None:
    """Raise ValueError unless `enc` is a well-formed blocked encoding (powers of two, 32 lanes, an order)."""
    spt, tpw, wpc, order = (tuple(enc.get(k, ())) for k in ("sizePerThread", "threadsPerWarp", "warpsPerCTA",
                                                             "order"))
    rank = len(order)
    if not (len(spt) == len(tpw) == len(wpc) == rank) or sorted(order) != list(range(rank)):
        raise ValueError(f"malformed blocked layout {enc}")
    for v in spt + tpw + wpc:
        log2(v)
    prod = 1
    for t in tpw:
        prod *= t
    if prod != WARP_SIZE:
        raise ValueError(f"threadsPerWarp of {enc} must multiply to {WARP_SIZE}")


def blocked_for_shape(shape: Sequence[int], num_warps: int, size_per_thread: Sequence[int] | None = None,
                      order: Sequence[int] | None = None, keep_in_warp: Sequence[int] = ()) -> LayoutAttr:
    """The blocked layout Triton would build for `shape` (BlockedEncodingAttr::get): starting at the fastest dim,
    give each dim as many lanes (then warps) as it has runs of sizePerThread, and the leftovers to the slowest dim.
    Defaults: one element per thread, the last dim fastest.

    `keep_in_warp` (dims the tile is reduced along): lanes are placed as above, but warps go first to the other
    dims (fastest first, each up to its runs not yet covered by lanes), so a reduction along those dims stays
    within a warp; warps left over go where Triton would put them."""
    rank = len(shape)
    spt = list(size_per_thread) if size_per_thread is not None else [1] * rank
    order = list(order) if order is not None else list(reversed(range(rank)))
    tpw, wpc = [1] * rank, [1] * rank
    lanes, warps, threads = WARP_SIZE, num_warps, WARP_SIZE * num_warps
    for d in order[:-1]:
        want = max(1, min(threads, max(1, shape[d] // spt[d])))
        tpw[d] = max(1, min(want, lanes))
        wpc[d] = max(1, min(want // tpw[d], warps))
        lanes //= tpw[d]
        warps //= wpc[d]
        threads //= want
    tpw[order[-1]] *= lanes
    wpc[order[-1]] *= warps
    avoid = [d for d in keep_in_warp if 0 <= d < rank]
    if avoid and len(set(avoid)) < rank and any(wpc[d] > 1 for d in avoid):
        wpc = _warps_off(shape, spt, tpw, order, num_warps, set(avoid))
    return blocked(spt, tpw, wpc, order)


def _warps_off(shape: Sequence[int], spt: Sequence[int], tpw: Sequence[int], order: Sequence[int], num_warps: int,
               avoid: set[int]) -> list[int]:
    """warpsPerCTA putting warps on the dims not in `avoid` first (up to their uncovered runs), then on the avoided
    dims, unless the tile is small (at most 4 elements per thread): then the leftover warps hold copies."""
    wpc, warps = [1] * len(shape), num_warps
    numel = 1
    for s in shape:
        numel *= s
    small = numel <= 4 * num_warps * 32  # copies of a small tile cost less than a reduction across warps
    preferred = [d for d in order if d not in avoid] + ([] if small else [d for d in order if d in avoid])
    for d in preferred:
        room = max(1, shape[d] // (spt[d] * tpw[d]))
        wpc[d] = max(1, min(room, warps))
        warps //= wpc[d]
    wpc[preferred[0]] *= warps  # more warps than runs: replicate along the first preferred dim
    return wpc


def default_layout(shape: Sequence[int], num_warps: int) -> LayoutAttr:
    """The layout a tensor gets when nothing asks for another: one element per thread, last dim fastest."""
    return blocked_for_shape(shape, num_warps)


def permute_layout(enc: LayoutAttr, perm: Sequence[int]) -> LayoutAttr:
    """The blocked layout of trans(x, perm) that keeps every element in the same thread and register as in x:
    result dim i is operand dim perm[i], so each per-dim parameter moves with its dim."""
    if not is_blocked(enc):
        raise ValueError(f"only blocked layouts are permuted, got {enc}")
    inverse = [perm.index(d) for d in range(len(perm))]
    pick = [[enc.get(k)[p] for p in perm] for k in ("sizePerThread", "threadsPerWarp", "warpsPerCTA")]
    return blocked(pick[0], pick[1], pick[2], [inverse[d] for d in enc.get("order")])


# --------------------------------------------------------------------------------------------- thread maps


@dataclass(frozen=True)
class DimMap:
    """How one tensor dim is spread: extent `size`; runs of `spt` elements per thread; `tpw` lanes and `wpc` warps
    along it, their coordinates read from the lane id at bit `lane_shift` and the warp id at bit `warp_shift`."""

    size: int
    spt: int
    tpw: int
    wpc: int
    lane_shift: int
    warp_shift: int

    @property
    def tile(self) -> int:
        """Elements one CTA-wide repetition covers along this dim."""
        return self.spt * self.tpw * self.wpc

    @property
    def run(self) -> int:
        """Contiguous elements a thread holds per repetition (the run is cut short by a smaller extent)."""
        return min(self.spt, self.size)

    @property
    def reps(self) -> int:
        return max(1, self.size // self.tile)

    @property
    def per_thread(self) -> int:
        """Elements along this dim that one thread holds."""
        return self.run * self.reps

    @property
    def distinct_lanes(self) -> int:
        """How many lane coordinates hold different elements (the others are copies)."""
        return min(self.tpw, max(1, self.size // self.spt))

    @property
    def distinct_warps(self) -> int:
        """How many warp coordinates hold different elements."""
        return min(self.wpc, max(1, self.size // (self.spt * self.tpw)))

    def lane_coord(self, lane: int) -> int:
        return (lane >> self.lane_shift) & (self.tpw - 1)

    def warp_coord(self, warp: int) -> int:
        return (warp >> self.warp_shift) & (self.wpc - 1)

    def thread_coord(self, lane: int, warp: int) -> int:
        return self.lane_coord(lane) + self.tpw * self.warp_coord(warp)

    def base(self, lane: int, warp: int) -> int:
        """The first element along this dim that the thread holds."""
        return (self.spt * self.thread_coord(lane, warp)) % self.size

    def offset(self, j: int) -> int:
        """The offset from the base of the thread's local element j (0 <= j < per_thread)."""
        rep, s = divmod(j, self.run)
        return rep * self.tile + s

    @property
    def is_replicated(self) -> bool:
        """Whether several thread coordinates along this dim hold the same elements."""
        return self.tpw * self.wpc > max(1, self.size // self.spt)

    def is_owner(self, lane: int, warp: int) -> bool:
        """Whether this thread is the first of the copies of its elements along this dim."""
        return self.spt * self.thread_coord(lane, warp) < self.size


@dataclass(frozen=True)
class ThreadMap:
    """A layout applied to a shape: `dims` (one DimMap per tensor dim), `hidden` (size-1 dims sliced away: their
    lanes and warps hold copies) and `reg_offsets` (per register, its offset from the thread's base coordinate).

    Thread tid holds, in register r, the element base(tid) + reg_offsets[r]."""

    dims: tuple[DimMap, ...]
    hidden: tuple[DimMap, ...]
    reg_offsets: tuple[tuple[int, ...], ...]
    num_warps: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def num_regs(self) -> int:
        return len(self.reg_offsets)

    @property
    def num_threads(self) -> int:
        return self.num_warps * WARP_SIZE

    def base(self, tid: int) -> tuple[int, ...]:
        lane, warp = tid % WARP_SIZE, tid // WARP_SIZE
        return tuple(d.base(lane, warp) for d in self.dims)

    def element(self, tid: int, reg: int) -> tuple[int, ...]:
        """The coordinates of the element thread `tid` holds in register `reg`."""
        return tuple(b + o for b, o in zip(self.base(tid), self.reg_offsets[reg]))

    def elements(self, tid: int) -> list[tuple[int, ...]]:
        return [self.element(tid, r) for r in range(self.num_regs)]

    def is_owner(self, tid: int) -> bool:
        """Whether thread `tid` is the designated holder of its elements (exactly one owner per element)."""
        lane, warp = tid % WARP_SIZE, tid // WARP_SIZE
        return all(d.is_owner(lane, warp) for d in self.dims + self.hidden)

    @property
    def replicated(self) -> bool:
        """Whether some element is held by more than one thread."""
        return any(d.is_replicated for d in self.dims + self.hidden)


def thread_map(enc: LayoutAttr, shape: Sequence[int]) -> ThreadMap:
    """The ThreadMap of encoding `enc` over `shape`."""
    return _thread_map(enc, tuple(shape))


@lru_cache(maxsize=4096)
def _thread_map(enc: LayoutAttr, shape: tuple[int, ...]) -> ThreadMap:
    if rank_of(enc) != len(shape):
        raise ValueError(f"layout {enc} has rank {rank_of(enc)}, shape {shape} has rank {len(shape)}")
    for s in shape:
        log2(s)
    if enc.kind == "slice":
        d = enc.get("dim")
        parent = _thread_map(enc.get("parent"), shape[:d] + (1,) + shape[d:])
        dims = parent.dims[:d] + parent.dims[d + 1:]
        offsets = tuple(o[:d] + o[d + 1:] for o in parent.reg_offsets)
        return ThreadMap(dims, parent.hidden + (parent.dims[d],), offsets, parent.num_warps)
    if enc.kind in ("mma", "dot_op"):
        from .mma_layouts import dot_operand_thread_map, mma_thread_map  # it builds on this module

        return (mma_thread_map if enc.kind == "mma" else dot_operand_thread_map)(enc, shape)
    check_blocked(enc)
    spt, tpw, wpc, order = (enc.get(k) for k in ("sizePerThread", "threadsPerWarp", "warpsPerCTA", "order"))
    lane_shift, warp_shift = [0] * len(shape), [0] * len(shape)
    ls = ws = 0
    for d in order:
        lane_shift[d], warp_shift[d] = ls, ws
        ls += log2(tpw[d])
        ws += log2(wpc[d])
    dims = tuple(DimMap(shape[d], spt[d], tpw[d], wpc[d], lane_shift[d], warp_shift[d]) for d in range(len(shape)))
    offsets = []
    counts = [dims[d].per_thread for d in order]
    total = 1
    for c in counts:
        total *= c
    for r in range(total):
        local, rest = [0] * len(shape), r
        for d, c in zip(order, counts):  # order[0] varies fastest
            rest, local[d] = divmod(rest, c)
        offsets.append(tuple(dims[d].offset(local[d]) for d in range(len(shape))))
    return ThreadMap(dims, (), tuple(offsets), num_warps_of(enc))


def vector_groups(tmap: ThreadMap, dim: int, width: int) -> list[list[int]]:
    """Registers in groups of `width` that hold `width` consecutive elements along `dim` (first register lowest),
    for vectorized memory access. Raises ValueError when the registers do not group that way."""
    if tmap.num_regs % width:
        raise ValueError(f"{tmap.num_regs} registers do not split into vectors of {width}")
    groups = []
    for start in range(0, tmap.num_regs, width):
        group = list(range(start, start + width))
        first = tmap.reg_offsets[start]
        for k, r in enumerate(group):
            want = tuple(o + (k if d == dim else 0) for d, o in enumerate(first))
            if tmap.reg_offsets[r] != want:
                raise ValueError(f"registers {group} are not {width} consecutive elements along dim {dim}")
        groups.append(group)
    return groups


def linear_index(coord: Sequence[int], shape: Sequence[int]) -> int:
    """Row-major index of `coord` in `shape`."""
    idx = 0
    for c, s in zip(coord, shape):
        idx = idx * s + c
    return idx


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


# ------------------------------------------------------------------------------------------- equivalence


def layouts_equivalent(a: LayoutAttr, b: LayoutAttr, shape: Sequence[int]) -> bool:
    """Whether `a` and `b` over `shape` put every element in the same thread and register (exactly: every thread's
    elements are compared register by register). A conversion between them is then a register rename."""
    if a == b:
        return True
    return _equivalent(a, b, tuple(shape))


@lru_cache(maxsize=4096)
def _equivalent(a: LayoutAttr, b: LayoutAttr, shape: tuple[int, ...]) -> bool:
    try:
        ta, tb = _thread_map(a, shape), _thread_map(b, shape)
    except ValueError:
        return False
    if ta.num_warps != tb.num_warps or ta.num_regs != tb.num_regs:
        return False
    if ta.reg_offsets != tb.reg_offsets:
        return all(ta.elements(t) == tb.elements(t) for t in range(ta.num_threads))
    return all(ta.base(t) == tb.base(t) for t in range(ta.num_threads))


def blocked_equivalent(enc: LayoutAttr, shape: Sequence[int]) -> LayoutAttr | None:
    """A blocked layout equivalent to `enc` over `shape` (enc itself when it is blocked), or None. For a slice of a
    blocked layout, the sliced-away dim's lanes and warps are merged into each other dim in turn and the first
    candidate that `layouts_equivalent` accepts is taken (a blocked layout is what vectorized memory access needs)."""
    if is_blocked(enc):
        return enc
    if not is_slice(enc) or not is_blocked(enc.get("parent")):
        return None
    d, parent = enc.get("dim"), enc.get("parent")
    spt, tpw, wpc, order = (list(parent.get(k)) for k in ("sizePerThread", "threadsPerWarp", "warpsPerCTA",
                                                         "order"))
    keep = [e for e in range(len(order)) if e != d]
    new_order = [keep.index(e) for e in order if e != d]
    for e in keep:
        cand = blocked([spt[x] for x in keep],
                       [tpw[x] * (tpw[d] if x == e else 1) for x in keep],
                       [wpc[x] * (wpc[d] if x == e else 1) for x in keep], new_order)
        if layouts_equivalent(cand, enc, shape):
            return cand
    return None


def subtile_layout(enc: LayoutAttr, shape: Sequence[int], offsets: Sequence[int],
                   sizes: Sequence[int]) -> LayoutAttr | None:
    """The layout of the static sub-tile shape[offsets : offsets + sizes] of a tile laid out as `enc`, when taking
    it is a register selection: `enc` itself over `sizes` (a blocked layout keeps its parameters; a slice layout
    its parent's), provided every thread holds each sub-tile element, in every thread the same source register
    (`subtile_registers`). None otherwise (the elements must then move between threads)."""
    if not (is_blocked(enc) or (is_slice(enc) and is_blocked(enc.get("parent")))):
        return None
    found = _subtile_registers(enc, tuple(shape), tuple(offsets), tuple(sizes))
    return None if found is None else enc


def subtile_registers(enc: LayoutAttr, shape: Sequence[int], offsets: Sequence[int],
                      sizes: Sequence[int]) -> list[int] | None:
    """For each register of `enc` over `sizes`, the register of `enc` over `shape` holding the same element (the
    sub-tile at `offsets`) in every thread; None when some thread does not hold it there."""
    found = _subtile_registers(enc, tuple(shape), tuple(offsets), tuple(sizes))
    return None if found is None else list(found)


@lru_cache(maxsize=256)
def registers_in_box(tmap: ThreadMap, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> frozenset[int]:
    """The registers whose element lies in the box [offsets, offsets + sizes) in some thread: the only ones a
    slice's exchange has to write (a one-row slice of a tile whose rows run along each thread's registers needs
    one register in eight)."""
    def inside(coord: tuple[int, ...]) -> bool:
        return all(o <= c < o + z for c, o, z in zip(coord, offsets, sizes))

    threads = range(tmap.num_threads)
    return frozenset(r for r in range(tmap.num_regs) if any(inside(tmap.element(t, r)) for t in threads))


@lru_cache(maxsize=1024)
def _subtile_registers(enc: LayoutAttr, shape: tuple[int, ...], offsets: tuple[int, ...],
                       sizes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        src, dst = _thread_map(enc, shape), _thread_map(enc, sizes)
    except ValueError:
        return None
    found = register_permutation(src, dst, lambda c: tuple(x + o for x, o in zip(c, offsets)))
    return None if found is None else tuple(found)


Coord = tuple[int, ...]


def register_permutation(src: ThreadMap, dst: ThreadMap, index: Callable[[Coord], Coord]) -> list[int] | None:
    """For each dst register, the src register holding element index(dst element) in every thread; None when some
    thread does not hold it (the elements must then move between threads)."""
    if src.num_warps != dst.num_warps:
        return None
    if index is identity and src == dst:
        return list(range(dst.num_regs))
    perm = []
    holder0 = {src.element(0, r): r for r in range(src.num_regs)}
    for r in range(dst.num_regs):
        got = holder0.get(index(dst.element(0, r)))
        if got is None:
            return None
        perm.append(got)
    for tid in range(1, dst.num_threads):
        sb, db = src.base(tid), dst.base(tid)
        for r, s in enumerate(perm):
            want = index(tuple(b + o for b, o in zip(db, dst.reg_offsets[r])))
            if want != tuple(b + o for b, o in zip(sb, src.reg_offsets[s])):
                return None
    return perm


def identity(c: Coord) -> Coord:
    return c


def split_layout(enc: LayoutAttr, src_shape: Sequence[int], dst_shape: Sequence[int]) -> LayoutAttr | None:
    """A blocked layout of `dst_shape` that puts every element of a row-major reshape src_shape -> dst_shape in
    the thread that holds it in `enc` over src_shape (the reshape is then a register rename), or None. Only for
    reshapes that split dims (each source dim becomes consecutive result dims of the same total size): each
    source dim's run, lanes, warps and repeats are handed out to its parts from the innermost one, and the
    candidate is checked thread by thread."""
    if not is_blocked(enc) or tuple(src_shape) == tuple(dst_shape):
        return None
    return _split_layout(enc, tuple(src_shape), tuple(dst_shape))


@lru_cache(maxsize=1024)
def _split_layout(enc: LayoutAttr, src: tuple[int, ...], dst: tuple[int, ...]) -> LayoutAttr | None:
    groups = _reshape_groups(src, dst)  # the result dims each source dim becomes
    if groups is None:
        return None
    spt, tpw, wpc = ([0] * len(dst) for _ in range(3))
    for d, group in enumerate(groups):
        left = [enc.get("sizePerThread")[d], enc.get("threadsPerWarp")[d], enc.get("warpsPerCTA")[d]]
        for e in reversed(group):  # innermost part first: it takes the run, then lanes, then warps
            rem, took = dst[e], []
            for i in range(3):
                take = min(rem, left[i]) if all(left[k] == 1 for k in range(i)) else 1
                if rem % take or left[i] % take:
                    return None
                rem, left[i] = rem // take, left[i] // take
                took.append(take)
            spt[e], tpw[e], wpc[e] = took
        outer = group[0]  # what a small dim leaves over (replication) goes to its outermost part
        spt[outer], tpw[outer], wpc[outer] = spt[outer] * left[0], tpw[outer] * left[1], wpc[outer] * left[2]
    order = [e for d in enc.get("order") for e in reversed(groups[d])]
    cand = blocked(spt, tpw, wpc, order)
    return cand if _same_thread_elements(enc, src, cand, dst) else None


def merge_layout(enc: LayoutAttr, src_shape: Sequence[int], dst_shape: Sequence[int]) -> LayoutAttr | None:
    """split_layout's inverse: a blocked layout of `dst_shape` for a row-major reshape that merges consecutive dims
    of src_shape (each result dim is a run of source dims of the same total size) with every element in the
    thread that holds it in `enc`, or None. A run merges when, from its innermost dim outwards, the distribution
    stays register -> lanes -> warps (a dim spread over lanes or warps leaves the dims outside it only the same
    level or above), checked thread by thread."""
    if not is_blocked(enc) or tuple(src_shape) == tuple(dst_shape) or len(dst_shape) >= len(src_shape):
        return None
    return _merge_layout(enc, tuple(src_shape), tuple(dst_shape))


@lru_cache(maxsize=1024)
def _merge_layout(enc: LayoutAttr, src: tuple[int, ...], dst: tuple[int, ...]) -> LayoutAttr | None:
    groups = _reshape_groups(dst, src)  # the source dims each result dim is made of
    if groups is None:
        return None
    levels = ("sizePerThread", "threadsPerWarp", "warpsPerCTA")
    spt, tpw, wpc = [], [], []
    for group in groups:
        merged, level = [1, 1, 1], 0
        for d in reversed(group):  # innermost source dim first
            parts = [enc.get(name)[d] for name in levels]
            lowest = next((k for k in range(3) if parts[k] > 1), level)
            if lowest < level:
                return None  # this dim lives below what an inner dim already spread to
            for k in range(3):
                merged[k] *= parts[k]
            level = max(level, max((k for k in range(3) if parts[k] > 1), default=level))
        spt.append(merged[0])
        tpw.append(merged[1])
        wpc.append(merged[2])
    where = {d: r for r, group in enumerate(groups) for d in group}
    order: list[int] = []
    for d in enc.get("order"):
        if where[d] not in order:
            order.append(where[d])
    cand = blocked(spt, tpw, wpc, order)
    return cand if _same_thread_elements(enc, src, cand, dst) else None


def _reshape_groups(wide: tuple[int, ...], fine: tuple[int, ...]) -> list[list[int]] | None:
    """For a row-major reshape between `wide` and `fine`: for each dim of `wide`, the consecutive dims of `fine`
    whose sizes multiply to it, or None when the reshape is not such a split (a size-1 dim of `fine` joins the
    next group)."""
    groups: list[list[int]] = []
    j = 0
    for size in wide:
        group, prod = [], 1
        while j < len(fine) and (prod < size or (fine[j] == 1 and not group)):
            group.append(j)
            prod *= fine[j]
            j += 1
        if prod != size or not group:
            return None
        groups.append(group)
    return groups if j == len(fine) else None


def _same_thread_elements(enc: LayoutAttr, src: tuple[int, ...], cand: LayoutAttr, dst: tuple[int, ...]) -> bool:
    """Whether every thread holds the same row-major elements under `enc` over src as under `cand` over dst (a
    reshape between them is then a register rename)."""
    try:
        ts, td = _thread_map(enc, src), _thread_map(cand, dst)
    except ValueError:
        return False
    if ts.num_regs != td.num_regs or ts.num_warps != td.num_warps:
        return False
    src_strides = [1] * len(src)
    for i in range(len(src) - 2, -1, -1):
        src_strides[i] = src_strides[i + 1] * src[i + 1]
    dst_strides = [1] * len(dst)
    for i in range(len(dst) - 2, -1, -1):
        dst_strides[i] = dst_strides[i + 1] * dst[i + 1]

    def linear(c: tuple[int, ...], strides: list[int]) -> int:
        return sum(x * s for x, s in zip(c, strides))

    return all(sorted(linear(c, src_strides) for c in ts.elements(tid)) == sorted(
        linear(c, dst_strides) for c in td.elements(tid)) for tid in range(ts.num_threads))
