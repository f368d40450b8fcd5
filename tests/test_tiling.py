"""Layouts (minitriton/ir/layouts.py), the axis analysis (passes/axis_info.py) and the tiling pass (passes/tiling.py).

1. The thread maps against a brute-force reading of the layout definition, on every thread of small shapes:
   coverage, exactly one owner per element, slices = projections of their parent, expand_dims and trans keep
   registers, vector runs are consecutive registers, Triton's thread/warp distribution.
2. Axis facts (contiguity, divisibility, constancy) of typical index math.
3. The pass on real kernels: every tensor gets a layout, ties hold (verify_layouts), cheap index math is
   recomputed instead of converted, tiled IR is rejected as input. Text tests with CHECK lines are in
   tests/passes/tiling.mtir.
"""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitriton as mt
from minitriton.compiler import build_ir
from minitriton.ir import Builder, Module, function_body, make_function, tensor
from minitriton.ir.layouts import (WARP_SIZE, blocked, blocked_for_shape, default_layout, log2, permute_layout,
                                   slice_of, thread_map, vector_groups)
from minitriton.ir.types import PointerType, SCALAR_TYPES, TensorType
from minitriton.passes import run_passes
from minitriton.passes.axis_info import MAX_DIV, AxisAnalysis
from minitriton.passes.tiling import verify_layouts

f32, bf16, i32 = SCALAR_TYPES["f32"], SCALAR_TYPES["bf16"], SCALAR_TYPES["i32"]

# ---------------------------------------------------------------------------------- 1. thread maps


def reference_elements(spt, tpw, wpc, order, shape, tid):  # type: ignore[no-untyped-def]
    """The docstring's definition read literally: per dim, the thread's coordinate from its lane / warp bits
    (dims in `order`, fastest first), then its elements (base + rep * tile + s) % size; registers run over the
    per-dim lists with order[0] fastest."""
    lane, warp = tid % WARP_SIZE, tid // WARP_SIZE
    lane_c, warp_c = {}, {}
    for d in order:
        lane_c[d], lane = lane % tpw[d], lane // tpw[d]
        warp_c[d], warp = warp % wpc[d], warp // wpc[d]
    per_dim = {}
    for d, size in enumerate(shape):
        t = lane_c[d] + tpw[d] * warp_c[d]
        tile = spt[d] * tpw[d] * wpc[d]
        per_dim[d] = [(spt[d] * t + rep * tile + s) % size
                      for rep in range(max(1, size // tile)) for s in range(min(spt[d], size))]
    slow_first = list(reversed(order))
    out = []
    for combo in itertools.product(*[per_dim[d] for d in slow_first]):
        coord = [0] * len(shape)
        for d, c in zip(slow_first, combo):
            coord[d] = c
        out.append(tuple(coord))
    return out


def splits(total: int, parts: int) -> st.SearchStrategy[list[int]]:
    """Powers of two, `parts` of them, multiplying to `total`."""
    bits = log2(total)
    return st.lists(st.integers(0, parts - 1), min_size=bits, max_size=bits).map(
        lambda picks: [1 << picks.count(i) for i in range(parts)])


@st.composite
def layouts_and_shapes(draw, max_rank: int = 3):  # type: ignore[no-untyped-def]
    rank = draw(st.integers(1, max_rank))
    num_warps = draw(st.sampled_from([1, 2, 4, 8]))
    spt = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=rank, max_size=rank))
    tpw = draw(splits(WARP_SIZE, rank))
    wpc = draw(splits(num_warps, rank))
    order = draw(st.permutations(list(range(rank))))
    shape = draw(st.lists(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), min_size=rank, max_size=rank))
    return blocked(spt, tpw, wpc, order), tuple(shape)


def params(enc):  # type: ignore[no-untyped-def]
    return [list(enc.get(k)) for k in ("sizePerThread", "threadsPerWarp", "warpsPerCTA", "order")]


def numel(shape) -> int:  # type: ignore[no-untyped-def]
    n = 1
    for s in shape:
        n *= s
    return n


@settings(max_examples=150, deadline=None)
@given(layouts_and_shapes())
def test_blocked_thread_map_matches_the_definition(case) -> None:  # type: ignore[no-untyped-def]
    enc, shape = case
    tmap = thread_map(enc, shape)
    holders: dict[tuple[int, ...], list[int]] = {}
    owners: dict[tuple[int, ...], list[int]] = {}
    for tid in range(tmap.num_threads):
        elems = tmap.elements(tid)
        assert elems == reference_elements(*params(enc), shape, tid), f"thread {tid}"
        assert len(set(elems)) == len(elems), "a thread holds an element twice"
        for e in elems:
            assert all(0 <= c < s for c, s in zip(e, shape))
            holders.setdefault(e, []).append(tid)
            if tmap.is_owner(tid):
                owners.setdefault(e, []).append(tid)
    assert len(holders) == numel(shape), "some element is held by no thread"
    assert all(len(o) == 1 for o in owners.values()) and len(owners) == numel(shape), "one owner per element"
    assert tmap.replicated == any(len(h) > 1 for h in holders.values())
    for d, dm in enumerate(tmap.dims):  # distinct lanes / warps along each dim, counted
        lanes = {dm.base(lane, 0) for lane in range(WARP_SIZE)}
        warps = {dm.base(0, w) for w in range(tmap.num_warps)}
        assert len(lanes) == dm.distinct_lanes and len(warps) == dm.distinct_warps, f"dim {d}"


@settings(max_examples=100, deadline=None)
@given(layouts_and_shapes(), st.data())
def test_slice_is_the_parent_projection_and_expand_dims_keeps_registers(case, data) -> None:  # type: ignore
    enc, shape = case
    d = data.draw(st.integers(0, len(shape) - 1))
    sliced_shape = shape[:d] + shape[d + 1:]
    if not sliced_shape:
        return
    sl = slice_of(d, enc)
    smap = thread_map(sl, sliced_shape)
    parent = thread_map(enc, shape[:d] + (1,) + shape[d + 1:])
    owners: dict[tuple[int, ...], int] = {}
    for tid in range(smap.num_threads):
        assert smap.elements(tid) == [e[:d] + e[d + 1:] for e in parent.elements(tid)], f"thread {tid}"
        if smap.is_owner(tid):
            for e in smap.elements(tid):
                assert e not in owners, f"{e} owned by {owners[e]} and {tid}"
                owners[e] = tid
    assert len(owners) == numel(sliced_shape)


@settings(max_examples=100, deadline=None)
@given(layouts_and_shapes(), st.data())
def test_permuted_layout_keeps_every_element_in_its_register(case, data) -> None:  # type: ignore
    enc, shape = case
    perm = data.draw(st.permutations(list(range(len(shape)))))
    out = thread_map(permute_layout(enc, perm), tuple(shape[p] for p in perm))
    src = thread_map(enc, shape)
    for tid in range(src.num_threads):
        assert out.elements(tid) == [tuple(e[p] for p in perm) for e in src.elements(tid)]


def test_vector_groups_are_runs_of_consecutive_registers() -> None:
    tmap = thread_map(blocked([1, 4], [2, 16], [4, 1], [1, 0]), (64, 64))
    groups = vector_groups(tmap, 1, 4)
    assert len(groups) == tmap.num_regs // 4
    for tid in (0, 17, 100):
        for g in groups:
            first = tmap.element(tid, g[0])
            assert [tmap.element(tid, r) for r in g] == [(first[0], first[1] + k) for k in range(4)]
            assert first[1] % 4 == 0, "a run starts at a multiple of its width"
    with pytest.raises(ValueError):
        vector_groups(tmap, 0, 4)  # along the rows each thread holds single elements
    with pytest.raises(ValueError):
        vector_groups(thread_map(blocked([1, 2], [2, 16], [4, 1], [1, 0]), (64, 64)), 1, 4)


@pytest.mark.parametrize("shape, num_warps, spt, order, tpw, wpc", [
    ((1024,), 4, [4], [0], [32], [4]),
    ((64, 64), 4, [1, 4], [1, 0], [2, 16], [4, 1]),
    ((32, 128), 8, [1, 8], [1, 0], [2, 16], [8, 1]),
    ((16, 4), 4, [1, 1], [1, 0], [8, 4], [4, 1]),
    ((32, 32), 4, [4, 1], [0, 1], [8, 4], [1, 4]),
    ((128,), 4, [1], [0], [32], [4]),
    ((2, 2, 256), 4, [1, 1, 4], [2, 1, 0], [1, 1, 32], [1, 2, 2]),  # 64 runs of 4: two warps' worth
])
def test_blocked_for_shape_spreads_threads_like_triton(shape, num_warps, spt, order, tpw, wpc) -> None:  # type: ignore
    enc = blocked_for_shape(shape, num_warps, spt, order)
    assert params(enc) == [spt, tpw, wpc, order]


def test_default_layout_and_malformed_layouts() -> None:
    assert params(default_layout((8, 64), 4)) == [[1, 1], [1, 32], [2, 2], [1, 0]]
    for bad in ([[1], [16], [4], [0]], [[3], [32], [4], [0]], [[1, 1], [32, 1], [4, 1], [0, 0]]):
        with pytest.raises(ValueError):
            blocked(*bad)
    with pytest.raises(ValueError):
        thread_map(default_layout((8, 64), 4), (8,))  # rank mismatch


# ------------------------------------------------------------------------------------- 2. axis facts


@mt.kernel
def index_math(x_ptr, out_ptr, n, stride, BLOCK: mt.constexpr):
    offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    mask = offs < n
    rows = mt.arange(0, 16)
    tile_ptrs = x_ptr + rows[:, None] * stride + mt.arange(0, BLOCK)[None, :]
    v = mt.load(x_ptr + offs, mask=mask)
    mt.store(out_ptr + offs, v + mt.sum(mt.load(tile_ptrs), axis=0), mask=mask)


def square_tile(x_ptr, out_ptr, stride, BLOCK: mt.constexpr):
    r = mt.arange(0, BLOCK)  # one arange for the rows and the columns: one of the two uses is a layout conversion
    x = mt.load(x_ptr + r[:, None] * stride + r[None, :])
    mt.store(out_ptr + r, mt.sum(x, axis=1))


def _ir(fn, types, constexprs, divisibility, num_warps=4, equal_to_one=()):  # type: ignore[no-untyped-def]
    from minitriton.frontend import compile_to_ir

    module = compile_to_ir(fn, types, constexprs, divisibility=divisibility, num_warps=num_warps,
                           equal_to_one=set(equal_to_one))
    return run_passes(module, ["canonicalize"])


def _ops(func, name):  # type: ignore[no-untyped-def]
    return [op for op in func.walk() if op.name == name]


def test_axis_facts_pass_through_layout_conversions() -> None:
    """A convert_layout moves values between threads and keeps them: what is known of an arange holds after its
    conversion (the FlashKDA recurrence's carried pointers, built from a converted arange, were not seen as 16-byte
    rows without this, so the pipeline pass left their loop alone)."""
    from minitriton.ir import Operation

    types = {"x_ptr": PointerType(f32), "out_ptr": PointerType(f32), "stride": i32}
    module = run_passes(_ir(square_tile, types, {"BLOCK": 64}, {"x_ptr": 16, "out_ptr": 16, "stride": 16}),
                        ["tiling"])
    func = module.functions[0]
    arange = _ops(func, "mt.arange")[0]
    block = arange.parent
    convert = Operation("mt.convert_layout", [arange.result], [arange.result.type], {}, loc=arange.loc)
    block.insert(block.ops.index(arange) + 1, convert)
    facts = AxisAnalysis(func)
    assert facts.info(convert.result) == facts.info(arange.result)
    assert facts.info(convert.result).contiguity == (64,)


@pytest.mark.parametrize("n_div", [16, 1])
def test_axis_facts_of_index_math(n_div: int) -> None:
    types = {"x_ptr": PointerType(f32), "out_ptr": PointerType(f32), "n": i32, "stride": i32}
    module = _ir(index_math, types, {"BLOCK": 64}, {"x_ptr": 16, "out_ptr": 16, "n": n_div, "stride": 16})
    func = module.functions[0]
    facts = AxisAnalysis(func)
    arange = next(op for op in _ops(func, "mt.arange") if op.attrs["end"] == 64)
    assert facts.info(arange.result).contiguity == (64,) and facts.info(arange.result).divisibility == (MAX_DIV,)
    loads = _ops(func, "mt.load")
    flat = next(op for op in loads if op.operands[0].type.rank == 1)
    tile = next(op for op in loads if op.operands[0].type.rank == 2)
    p = facts.info(flat.operands[0])
    assert p.contiguity == (64,) and p.divisibility == (16,)  # 16-byte aligned base + 64 * pid floats
    mask = facts.info(flat.operands[1])
    assert mask.constancy == ((16,) if n_div == 16 else (1,))
    t = facts.info(tile.operands[0])
    # along the rows every element is its own run: x + 4 * (r * stride + j) is only 4-byte aligned
    assert t.contiguity == (1, 64) and t.divisibility == (4, 16) and t.constancy[0] == 1
    assert facts.info(flat.result).contiguity == (1,), "loaded values are unknown"


# --------------------------------------------------------------------------------------- 3. the pass


def example_specs():  # type: ignore[no-untyped-def]
    from minitriton.kernels.examples import attention, cumsum, matmul, rmsnorm, softmax, vector_add

    out = []
    for module in (vector_add, softmax, rmsnorm, cumsum, matmul, attention):
        for name in dir(module):
            for spec in getattr(getattr(module, name), "specializations", []):
                out.append(pytest.param(spec, id=f"{module.__name__.rsplit('.', 1)[-1]}-{spec.describe()}"))
    return out


@pytest.mark.parametrize("spec", example_specs())
def test_every_tensor_of_the_examples_gets_a_layout(spec) -> None:  # type: ignore[no-untyped-def]
    module, _ = build_ir(spec.kernel.fn, {n: s.type for n, s in spec.args.items()}, dict(spec.constexprs),
                         divisibility={n: s.divisibility for n, s in spec.args.items()},
                         equal_to_one={n for n, s in spec.args.items() if s.equal_to_one}, num_warps=spec.num_warps)
    func = module.functions[0]
    verify_layouts(func)  # also run by the pass; here it is the test's assertion
    for op in func.walk():
        for v in list(op.results) + [a for r in op.regions for b in r.blocks for a in b.args]:
            assert not isinstance(v.type, TensorType) or v.type.encoding is not None
        if op.name in ("mt.load", "mt.store"):
            assert op.attrs.get("vector_width", 0) >= 1


def test_matmul_index_math_is_recomputed_not_converted() -> None:
    from minitriton.kernels.examples import matmul

    names = "a_ptr,b_ptr,c_ptr,bias_ptr,M,N,K,stride_am,stride_ak,stride_bk,stride_bn,stride_cm,stride_cn".split(",")
    types = {n: PointerType(bf16) if n.endswith("ptr") else i32 for n in names}
    module = _ir(matmul.matmul_kernel, types, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32},
                 {n: 16 for n in names}, equal_to_one={"stride_ak", "stride_bn", "stride_cn"})
    before = len(_ops(module.functions[0], "mt.arange"))
    run_passes(module, ["tiling"])
    func = module.functions[0]
    assert not _ops(func, "mt.convert_layout")
    assert len(_ops(func, "mt.arange")) > before, "rm / rn / rk feed loads of different layouts"
    assert {op.attrs["vector_width"] for op in _ops(func, "mt.load")} == {8}  # 16 bytes of bf16, in the K loop


def test_tiling_rejects_tiled_input_and_verify_catches_broken_ties() -> None:
    func = make_function("k", [PointerType(f32)], ["x"], num_warps=4, divisibility=[16])
    b = Builder(function_body(func))
    offs = b.create1("mt.arange", [], tensor([128], i32), start=0, end=128)
    ptrs = b.create1("mt.addptr", [b.create1("mt.splat", [function_body(func).args[0]], tensor([128],
                                                                                             PointerType(f32))), offs],
                     tensor([128], PointerType(f32)))
    v = b.create1("mt.load", [ptrs], tensor([128], f32))
    b.create("mt.store", [ptrs, b.create1("mt.add", [v, v], tensor([128], f32))])
    b.create("mt.return")
    module = run_passes(Module([func]), ["tiling"])
    with pytest.raises(ValueError, match="already has layouts"):
        run_passes(module, ["tiling"])
    add = _ops(func, "mt.add")[0]
    add.results[0].type = add.results[0].type.with_encoding(default_layout((64, 2), 4))  # a wrong rank and tie
    with pytest.raises(ValueError, match="share one layout"):
        verify_layouts(func)


def test_a_short_run_is_not_replication() -> None:
    """One thread along a dim whose extent is below sizePerThread holds it alone (found by hypothesis)."""
    tmap = thread_map(blocked([1, 1, 2], [32, 1, 1], [1, 1, 1], [0, 1, 2]), (32, 1, 1))
    assert not tmap.replicated and all(tmap.is_owner(t) for t in range(32))
    assert thread_map(blocked([1, 1, 2], [16, 2, 1], [1, 1, 1], [0, 1, 2]), (32, 1, 1)).replicated
