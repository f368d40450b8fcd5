"""Layout equivalence (minitriton/ir/layouts.py: layouts_equivalent, blocked_equivalent), warps kept off reduced
axes (blocked_for_shape's keep_in_warp), and what the tiling pass makes of them on whole kernels: the conversions
it leaves between equivalent layouts lower to register renames (no shared memory), and a reduced state tile gets
its warps off the reduced axis."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitriton as mt
from minitriton.compiler import build_ir
from minitriton.ir.types import SCALAR_TYPES, PointerType
from minitriton.ir.layouts import (WARP_SIZE, blocked, blocked_equivalent, blocked_for_shape, layouts_equivalent,
                                   slice_of, thread_map)
from test_tiling import layouts_and_shapes


def same_placement_by_definition(a, b, shape) -> bool:  # type: ignore[no-untyped-def]
    """Equivalence read literally: same warp count and, in every thread, the same element list register by
    register."""
    ta, tb = thread_map(a, shape), thread_map(b, shape)
    if ta.num_warps != tb.num_warps:
        return False
    return all(ta.elements(t) == tb.elements(t) for t in range(ta.num_threads))


# ------------------------------------------------------------------------------------------ equivalence


@settings(max_examples=40, deadline=None)
@given(layouts_and_shapes(), layouts_and_shapes())
def test_equivalence_matches_the_definition(first, second) -> None:  # type: ignore[no-untyped-def]
    (a, shape), (b, _) = first, second
    if len(b.get("order")) != len(shape):
        b = a
    assert layouts_equivalent(a, b, shape) == same_placement_by_definition(a, b, shape)
    assert layouts_equivalent(a, a, shape)


@settings(max_examples=40, deadline=None)
@given(layouts_and_shapes(max_rank=3), st.data())
def test_blocked_equivalent_of_a_slice_places_every_element_alike(case, data) -> None:  # type: ignore
    enc, shape = case
    if len(shape) < 2:
        return
    d = data.draw(st.integers(0, len(shape) - 1))
    sliced_shape = shape[:d] + shape[d + 1:]
    sl = slice_of(d, enc)
    got = blocked_equivalent(sl, sliced_shape)
    if got is not None:
        assert got.kind == "blocked"
        assert same_placement_by_definition(got, sl, sliced_shape)
    if enc.get("threadsPerWarp")[d] == 1 and enc.get("warpsPerCTA")[d] == 1:
        assert got is not None, "a sliced dim with no lanes or warps drops out"


def test_the_known_equivalent_pairs() -> None:
    """The pairs docs/kernels/warp_decode.md names: slice(3, [1,1,1,16]/[1,T,L,1]/[R,1,1,1]) is [1,1,1]/[1,T,L]/
    [R,1,1] on every shape; and a K vector in slice(0, [1,4]/[1,32]/[8,1]) is [4]/[32]/[8] (replicated warps)."""
    for T, L, R in ((1, 32, 8), (2, 16, 8), (4, 8, 1)):
        parent = blocked([1, 1, 1, 16], [1, T, L, 1], [R, 1, 1, 1], [3, 2, 1, 0])
        flat = blocked([1, 1, 1], [1, T, L], [R, 1, 1], [2, 1, 0])
        for shape in ((8, 1, 32), (16, 2, 8), (8, 4, 16)):
            assert layouts_equivalent(slice_of(3, parent), flat, shape)
            assert blocked_equivalent(slice_of(3, parent), shape) is not None
    state = blocked([1, 4], [1, 32], [8, 1], [1, 0])
    assert blocked_equivalent(slice_of(0, state), (128,)) == blocked([4], [32], [8], [0])
    assert blocked_equivalent(slice_of(1, state), (128,)) is None  # rows over warps, copies over lanes
    assert not layouts_equivalent(blocked([4], [32], [8], [0]), blocked([1], [32], [8], [0]), (128,))


# ------------------------------------------------------------------------------------------ warps off axes


@pytest.mark.parametrize("shape, num_warps, spt, order, keep, wpc", [
    ((128, 128), 8, [1, 4], [1, 0], [1], [8, 1]),     # kda_decode's state: rows over warps, K within a warp
    ((128, 128), 8, [1, 1], [1, 0], [1], [8, 1]),     # same, unaligned (scalar accesses)
    ((128, 128), 8, [1, 4], [1, 0], [0], [8, 1]),     # reduced along the rows, but lanes already cover K
    ((128, 128), 8, [4, 1], [0, 1], [0], [1, 8]),     # reduced along the rows, contiguous rows: warps along K
    ((2, 1024), 8, [1, 4], [1, 0], [1], [2, 4]),      # only 2 rows: the other warps must go along the axis
    ((8192,), 8, [4], [0], [0], [8]),                 # one dim, reduced: nothing else to put warps on
    ((64, 64), 4, [1, 4], [1, 0], [], [4, 1]),        # nothing reduced: Triton's placement
])
def test_keep_in_warp_moves_warps_off_reduced_axes(shape, num_warps, spt, order, keep, wpc) -> None:
    enc = blocked_for_shape(shape, num_warps, spt, order, keep_in_warp=keep)
    assert list(enc.get("warpsPerCTA")) == wpc
    plain = blocked_for_shape(shape, num_warps, spt, order)
    assert enc.get("threadsPerWarp") == plain.get("threadsPerWarp")  # lanes (coalescing) are untouched
    tmap = thread_map(enc, shape)
    covered = {e for t in range(tmap.num_threads) for e in tmap.elements(t)}
    assert len(covered) == tmap.dims[0].size * (tmap.dims[1].size if len(shape) > 1 else 1)
    assert tmap.num_threads == num_warps * WARP_SIZE


# ------------------------------------------------------------------------------------------ on kernels


@mt.kernel
def row_norms(s_ptr, w_ptr, out_ptr, R: mt.constexpr, K: mt.constexpr):
    """out[r] = sum_k s[r, k] * w[k] / sqrt(sum_k s[r, k]^2): two reductions along K of one [R, K] tile and a K
    vector broadcast over the rows (kda_decode's pattern)."""
    rows = mt.arange(0, R)
    cols = mt.arange(0, K)
    s = mt.load(s_ptr + rows[:, None] * K + cols[None, :])
    w = mt.load(w_ptr + cols)
    dotw = mt.sum(s * w[None, :], axis=1)
    norm = mt.sqrt(mt.sum(s * s, axis=1))
    mt.store(out_ptr + rows, dotw / norm)


F32_PTR = PointerType(SCALAR_TYPES["f32"])
ROW_NORMS_ARGS = {"s_ptr": F32_PTR, "w_ptr": F32_PTR, "out_ptr": F32_PTR}


def tiled(fn, arg_types, constexprs, num_warps):  # type: ignore[no-untyped-def]
    module, _ = build_ir(fn.fn, arg_types, constexprs, divisibility={n: 16 for n in arg_types},
                         num_warps=num_warps, pipeline=["canonicalize", "tiling"])
    return module.functions[0]


def test_reduced_tile_keeps_its_axis_in_a_warp_and_the_vector_takes_its_slice() -> None:
    func = tiled(row_norms, ROW_NORMS_ARGS, {"R": 128, "K": 128}, 8)
    loads = [op for op in func.walk() if op.name == "mt.load"]
    state, vec = loads
    enc = state.result.type.encoding
    assert list(enc.get("warpsPerCTA")) == [8, 1] and list(enc.get("sizePerThread")) == [1, 4]
    assert state.attrs["vector_width"] == 4
    # the K vector is small: it is loaded in (a blocked equivalent of) slice(0, state layout), 16-byte vectors
    assert layouts_equivalent(vec.result.type.encoding, slice_of(0, enc), (128,))
    assert vec.attrs["vector_width"] == 4
    moves = []  # conversions that move data: only the [R] result, to the (coalesced) store's layout
    for op in func.walk():
        if op.name == "mt.convert_layout":
            src, dst = op.operands[0].type, op.result.type
            if not layouts_equivalent(src.encoding, dst.encoding, src.shape):
                moves.append(op)
    assert len(moves) == 1 and moves[0].result.type.shape == (128,)
    assert [u.name for u in func.walk() if moves[0].result in u.operands][0] == "mt.store"


def test_equivalent_conversions_lower_to_renames() -> None:
    """Compiled, the kernel goes through shared memory once, for the [R] result's conversion to the store's layout:
    the vector's conversions are renames and both reductions stay within warps (shuffles only)."""
    from minitriton.compiler import compile_kernel

    compiled = compile_kernel(row_norms.fn, ROW_NORMS_ARGS, {"R": 128, "K": 128},
                              divisibility={n: 16 for n in ROW_NORMS_ARGS}, num_warps=8, target="ptx")
    ptx = compiled.ptx
    assert ptx.count("shfl.sync.bfly") >= 2 * 5  # two reductions over 32 lanes
    assert ptx.count("bar.sync") <= 2, "one conversion (two barriers) at most"
    first_shared = min(ptx.find(x) for x in ("st.shared", "ld.shared", "bar.sync") if x in ptx)
    assert first_shared > ptx.rfind("shfl.sync.bfly"), "shared memory only after both reductions"


def test_reduction_aware_placement_minimizes_elements_combined_across_warps() -> None:
    from minitriton.passes.tiling import reduction_aware

    # kda_decode's state: reduced over K (axis 1) per token, and its [V] results over V (axis 0) once
    enc = reduction_aware((128, 128), 8, [1, 4], [1, 0], [(1, 128 * 128), (1, 128 * 128), (0, 128)])
    assert list(enc.get("warpsPerCTA")) == [8, 1]
    # a small [4, 1, 8, 4] K tile reduced over axes 3, then 0, then 2: every warp holds a copy instead of
    # splitting axis 0 over warps
    enc = reduction_aware((4, 1, 8, 4), 8, [1, 1, 1, 1], [3, 2, 1, 0], [(3, 128), (0, 32), (2, 8)])
    dims = thread_map(enc, (4, 1, 8, 4)).dims
    assert all(dims[d].distinct_warps == 1 for d in (0, 2, 3))
    # nothing reduced: Triton's placement
    assert reduction_aware((64, 64), 4, [1, 4], [1, 0], []) == blocked_for_shape((64, 64), 4, [1, 4], [1, 0])
