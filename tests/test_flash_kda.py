"""FlashKDA (kernels_src/flash_kda.py) against the float64 references of kernels_src/kda_ref.py.

Error figure: relative_error = ||out - ref||_2 / ||ref||_2 over all elements (fla's assert_close ratio). Bounds (issue
5): output <= 1e-2, final state <= 5e-3. The kernels run through the interpreter (MINITRITON_INTERPRET=1) at small
shapes with every output and intermediate buffer poisoned with NaN first; the GPU tests run the issue's shapes.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from minitriton.kernels import flash_kda, kda_ref

OUT_BOUND = 1e-2
STATE_BOUND = 5e-3
REF_BOUND = 1e-10  # float64 reference against float64 reference


def make_inputs(B: int, T: int, H: int, K: int, V: int, *, seed: int, n_states: int | None = None,
                init: bool = True, gate_bias: float = 0.0, state_v_first: bool = False, device: str = "cpu",
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """Fresh random inputs (raw gate, beta logits, A_log, dt_bias and an fp32 initial state)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    n = B if n_states is None else n_states
    state_shape = (n, H, V, K) if state_v_first else (n, H, K, V)
    return dict(
        q=randn(B, T, H, K).to(dtype).to(device), k=randn(B, T, H, K).to(dtype).to(device),
        v=randn(B, T, H, V).to(dtype).to(device), g=randn(B, T, H, K).to(dtype).to(device),
        beta=randn(B, T, H).to(dtype).to(device),
        A_log=(torch.rand(H, generator=gen) * 2 - 1).to(device), dt_bias=(randn(H * K) + gate_bias).to(device),
        initial_state=randn(*state_shape).to(device) if init else None,
    )


def check(inputs: dict, *, out_bound: float = OUT_BOUND, state_bound: float = STATE_BOUND, **options) -> tuple:
    """Run chunk_kda and the token-by-token float64 reference; assert the bounds; return the two errors."""
    o, state = flash_kda.chunk_kda(**inputs, output_final_state=True, **options)
    ours_only = ("context_parallel", "cp_segment_len", "intra_variant")
    ref_options = {k: v for k, v in options.items() if k not in ours_only}
    ref_o, ref_state = kda_ref.kda_recurrent_reference(**inputs, output_final_state=True, **ref_options)
    assert o.dtype == inputs["q"].dtype and o.shape == inputs["v"].shape
    assert state.dtype == torch.float32 and state.shape == ref_state.shape
    assert torch.isfinite(o.float()).all() and torch.isfinite(state).all()
    o_err, s_err = kda_ref.relative_error(ref_o, o), kda_ref.relative_error(ref_state, state)
    assert o_err <= out_bound, f"output relative error {o_err:.3e} > {out_bound}"
    assert s_err <= state_bound, f"final state relative error {s_err:.3e} > {state_bound}"
    return o_err, s_err


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")
    monkeypatch.setattr(flash_kda, "POISON_BUFFERS", True)


# --------------------------------------------------------------------------------------- references


@pytest.mark.parametrize("state_v_first", [False, True])
def test_chunked_reference_matches_recurrence(state_v_first):
    x = make_inputs(1, 150, 2, 16, 32, seed=1, n_states=3, state_v_first=state_v_first)
    cu = torch.tensor([0, 70, 70, 150])
    a = kda_ref.kda_recurrent_reference(**x, output_final_state=True, cu_seqlens=cu, state_v_first=state_v_first)
    b = kda_ref.kda_chunked_reference(**x, output_final_state=True, cu_seqlens=cu, state_v_first=state_v_first)
    assert kda_ref.relative_error(a[0], b[0]) < REF_BOUND
    assert kda_ref.relative_error(a[1], b[1]) < REF_BOUND


def test_segment_maps_compose_to_the_unsplit_state():
    x = make_inputs(1, 200, 2, 16, 16, seed=2)
    bounds = [(0, 64), (64, 128), (128, 200)]
    maps = kda_ref.segment_transitions(x["q"], x["k"], x["v"], x["g"], x["beta"], bounds, A_log=x["A_log"],
                                       dt_bias=x["dt_bias"])
    states = kda_ref.compose_transitions(maps, x["initial_state"][0].double())
    _, final = kda_ref.kda_recurrent_reference(**x, output_final_state=True)
    assert kda_ref.relative_error(final[0], states[-1]) < REF_BOUND
    _, mid = kda_ref.kda_recurrent_reference(**{**x, **{n: x[n][:, :128] for n in ("q", "k", "v", "g", "beta")}},
                                             output_final_state=True)
    assert kda_ref.relative_error(mid[0], states[2]) < REF_BOUND


def test_gate_is_the_floored_sigmoid_form():
    g = torch.randn(3, 2, 4)
    A_log, dt_bias = torch.randn(2), torch.randn(8)
    want = -5.0 * torch.sigmoid(A_log.double().exp()[:, None] * (g.double() + dt_bias.double().view(2, 4)))
    assert torch.allclose(kda_ref.kda_gate(g, A_log, dt_bias, -5.0), want)
    wide = kda_ref.kda_gate(g * 10, A_log, dt_bias, -5.0)
    assert ((wide >= -5.0) & (wide <= 0.0)).all()


# ------------------------------------------------------------------------------------ the kernels (CPU)


@pytest.mark.parametrize("T,H,K,V,init", [
    (1, 1, 16, 16, True), (63, 1, 16, 32, False), (64, 2, 32, 16, True), (130, 2, 16, 16, True),
    (130, 1, 32, 32, False),
])
def test_chunk_kda_matches_reference(interpret, T, H, K, V, init):
    check(make_inputs(1, T, H, K, V, seed=T * 7 + H, init=init))


@pytest.mark.parametrize("variant", flash_kda.INTRA_VARIANTS)
def test_intra_chunk_variants_agree(interpret, monkeypatch, variant):
    """Every phase-1 kernel (INTRA_VARIANT, or the intra_variant keyword) meets the oracle bounds, and each agrees
    with another to within bf16 noise on the same inputs (a partial last chunk, varlen boundaries, fast and slow
    gates mixed through dt_bias)."""
    x = make_inputs(1, 150, 2, 32, 16, seed=21, n_states=2)
    x["dt_bias"] = x["dt_bias"] * 3  # per-channel gates from ~no decay to the -5 floor: the range tests both paths
    cu = torch.tensor([0, 70, 150])
    monkeypatch.setattr(flash_kda, "INTRA_VARIANT", variant)
    check(x, cu_seqlens=cu)
    o, s = flash_kda.chunk_kda(**x, output_final_state=True, cu_seqlens=cu)
    other = "sub16" if variant != "sub16" else "sliced"
    o2, s2 = flash_kda.chunk_kda(**x, output_final_state=True, cu_seqlens=cu, intra_variant=other)
    assert kda_ref.relative_error(o2.double(), o) <= 5e-3  # measured 1.7e-3 and 1.2e-3 (bf16 intermediates)
    assert kda_ref.relative_error(s2.double(), s) <= 5e-3


def test_sliced_variant_on_wide_heads(interpret):
    """The sliced phase 1 at K = V = 128 (the K3 head size: two column blocks in its WY products) and a partial
    chunk, against the oracle."""
    check(make_inputs(1, 100, 1, 128, 128, seed=23), intra_variant="sliced")


def test_intra_variant_choice():
    assert [flash_kda.intra_variant_for(v, 128) for v in flash_kda.INTRA_VARIANTS] == list(flash_kda.INTRA_VARIANTS)
    assert flash_kda.intra_variant_for("sliced", 256) == "sub16"  # its gate scan would need 64 KB of shared memory
    assert flash_kda.intra_variant_for("chunk64", 256) == "chunk64"


def test_blocks_per_sm_knobs():
    """INTRA_BLOCKS_PER_SM / WG_BLOCKS_PER_SM: the kernel itself at its own .minnctapersm, a cached copy at another,
    a ValueError naming the knob outside 1..4."""
    sliced, wg = flash_kda.kda_intra_chunk_sliced_kernel, flash_kda.kda_intra_chunk_wg_kernel
    assert flash_kda._with_blocks_per_sm(sliced, 1, "INTRA_BLOCKS_PER_SM") is sliced
    assert flash_kda._with_blocks_per_sm(wg, 2, "WG_BLOCKS_PER_SM") is wg
    copy = flash_kda._with_blocks_per_sm(wg, 3, "WG_BLOCKS_PER_SM")
    assert copy.min_blocks_per_sm == 3 and copy.options == wg.options and copy.fn is wg.fn
    assert flash_kda._with_blocks_per_sm(wg, 3, "WG_BLOCKS_PER_SM") is copy
    with pytest.raises(ValueError, match="WG_BLOCKS_PER_SM must be 1, 2, 3 or 4"):
        flash_kda._with_blocks_per_sm(wg, 5, "WG_BLOCKS_PER_SM")


def test_unknown_intra_variant_is_an_error(interpret):
    with pytest.raises(ValueError, match="phase-1 variant"):
        flash_kda.chunk_kda(**make_inputs(1, 8, 1, 16, 16, seed=24), intra_variant="chunk32")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("MINITRITON_INTERPRET", "0") != "0",
                    reason="needs a CUDA GPU (and MINITRITON_INTERPRET unset)")
@pytest.mark.parametrize("variant", flash_kda.INTRA_VARIANTS)
def test_gpu_intra_variant(variant):
    check(make_inputs(1, 1000, 4, 128, 128, seed=22, device="cuda"), intra_variant=variant)


def test_recurrence_warps_choice(monkeypatch):
    # 4 warps, measured faster whether or not the programs outnumber the SMs (recurrence_warps)
    assert flash_kda.recurrence_warps(96 * 2, 132) == 4  # B1 T32768 H96
    assert flash_kda.recurrence_warps(8 * 32 * 2, 132) == 4
    assert flash_kda.recurrence_warps(12 * 2 * 5, 132) == 4  # B1 T8192 H12 with 5 CP segments
    assert flash_kda.recurrence_warps(132, 132) == 4
    monkeypatch.setattr(flash_kda, "RECURRENCE_WARPS", 8)
    assert flash_kda.recurrence_warps(1000, 132) == 8


def test_batch_and_v_first_state(interpret):
    check(make_inputs(2, 100, 2, 16, 16, seed=3, state_v_first=True), state_v_first=True)


def test_varlen_with_empty_and_short_sequences(interpret):
    cu = torch.tensor([0, 1, 64, 64, 130, 200])
    check(make_inputs(1, 200, 2, 16, 16, seed=4, n_states=5), cu_seqlens=cu)


def test_slow_decay_long_memory(interpret):
    # dt_bias - 6 drives the gate toward 0 (almost no decay), the regime where errors accumulate over chunks
    check(make_inputs(1, 300, 1, 32, 32, seed=5, gate_bias=-6.0))


def test_float32_inputs_and_custom_scale(interpret):
    check(make_inputs(1, 80, 1, 16, 16, seed=6, dtype=torch.float32), scale=0.3)


def test_no_final_state_and_no_initial_state(interpret):
    x = make_inputs(1, 70, 1, 16, 16, seed=7, init=False)
    o, state = flash_kda.chunk_kda(**x)
    assert state is None
    ref, _ = kda_ref.kda_recurrent_reference(**x)
    assert kda_ref.relative_error(ref, o) <= OUT_BOUND


@pytest.mark.parametrize("state_v_first", [False, True])
def test_context_parallel_segments(interpret, state_v_first):
    """Forced splitting into 64-token segments: transitions composed exactly, the same answer as unsplit."""
    cu = torch.tensor([0, 150, 170, 300])
    x = make_inputs(1, 300, 2, 16, 32, seed=8, n_states=3, state_v_first=state_v_first)
    check(x, cu_seqlens=cu, state_v_first=state_v_first, context_parallel=True, cp_segment_len=64)
    o_cp, s_cp = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True, state_v_first=state_v_first,
                                     context_parallel=True, cp_segment_len=128)
    o, s = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True, state_v_first=state_v_first,
                               context_parallel=False)
    assert kda_ref.relative_error(s, s_cp) <= 1e-3
    assert kda_ref.relative_error(o, o_cp) <= 1e-3


@pytest.mark.parametrize("knob, value", [("RECURRENCE_TRANSPOSED", True), ("RECURRENCE_FUSED_WQ", False),
                                         ("RECURRENCE_SPLIT_UPDATE", True)])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_recurrence_forms(interpret, monkeypatch, knob, value, state_v_first):
    """The other forms of the recurrence's products: RECURRENCE_TRANSPOSED (opt-in: the state held as S^T, the A
    operand of its products in place; context-parallel transitions transpose the augmented [M | E] state too) and
    RECURRENCE_FUSED_WQ off (w S and qg S as two dots; the default fuses them), RECURRENCE_SPLIT_UPDATE (the
    bf16x2 update as two dots on one kg^T). Against the float64 reference,
    and the same answer as the default recurrence, varlen with initial states and context parallelism."""
    cu = torch.tensor([0, 150, 170, 300])
    x = make_inputs(1, 300, 2, 16, 32, seed=12, n_states=3, state_v_first=state_v_first)
    o, s = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True, state_v_first=state_v_first,
                               context_parallel=True, cp_segment_len=64)
    monkeypatch.setattr(flash_kda, knob, value)
    check(x, cu_seqlens=cu, state_v_first=state_v_first, context_parallel=True, cp_segment_len=64)
    o_t, s_t = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True, state_v_first=state_v_first,
                                   context_parallel=True, cp_segment_len=64)
    assert kda_ref.relative_error(s, s_t) <= 1e-6
    assert kda_ref.relative_error(o, o_t) <= 1e-6


def test_accumulator_stores_match_the_coalesced_stores(interpret, monkeypatch):
    """ACC_STORES (phase 1's w, u and Aqk rows and the recurrence's o stored from their accumulators' layouts, row
    indices and masks made there): against the float64 reference, and the same output and final state as the
    coalesced stores, varlen with ragged chunk ends, two state column blocks (a wrong column offset shows)."""
    cu = torch.tensor([0, 150, 170, 300])
    x = make_inputs(1, 300, 2, 16, 128, seed=16, n_states=3)  # V = 128: two state column blocks
    o, s = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True)
    monkeypatch.setattr(flash_kda, "ACC_STORES", True)
    check(x, cu_seqlens=cu)
    o2, s2 = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(s, s2)


@pytest.mark.parametrize("precision", ["bf16", "bf16x2"])
def test_state_update_precisions(interpret, monkeypatch, precision):
    """STATE_PRECISION of the recurrence's kg^T v_new: "bf16" (v_new rounded to 8 bits) and "bf16x2" (v_new as
    hi + lo bf16 halves in one K = 2 BT dot: 16 bits) both meet the float64 oracle's bounds; bf16x2 lands closer to the
    tf32 form than bf16 does (a dropped lo half would make it bf16), varlen with context parallelism."""
    cu = torch.tensor([0, 150, 170, 300])
    x = make_inputs(1, 300, 2, 16, 32, seed=19, n_states=3)
    kw = dict(cu_seqlens=cu, output_final_state=True, context_parallel=True, cp_segment_len=64)
    monkeypatch.setattr(flash_kda, "STATE_PRECISION", "tf32")
    _, s_tf32 = flash_kda.chunk_kda(**x, **kw)
    monkeypatch.setattr(flash_kda, "STATE_PRECISION", "bf16")
    _, s_bf16 = flash_kda.chunk_kda(**x, **kw)
    monkeypatch.setattr(flash_kda, "STATE_PRECISION", precision)
    check(x, cu_seqlens=cu, context_parallel=True, cp_segment_len=64)
    _, s = flash_kda.chunk_kda(**x, **kw)
    if precision == "bf16x2":
        assert kda_ref.relative_error(s_tf32, s) < 0.5 * kda_ref.relative_error(s_tf32, s_bf16)


def test_tf32x3_merge_matches_the_f32_merge(interpret, monkeypatch):
    """MERGE_PRECISION "tf32x3" (the default) composes the segment maps to f32-level accuracy: the same final state
    and output as the CUDA-core merge ("ieee") within 1e-5, varlen with initial states."""
    cu = torch.tensor([0, 150, 170, 300])
    x = make_inputs(1, 300, 2, 16, 32, seed=14, n_states=3)
    assert flash_kda.MERGE_PRECISION == "tf32x3"
    monkeypatch.setattr(flash_kda, "MERGE_PRECISION", "ieee")
    o, s = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True, context_parallel=True, cp_segment_len=64)
    monkeypatch.setattr(flash_kda, "MERGE_PRECISION", "tf32x3")
    o3, s3 = flash_kda.chunk_kda(**x, cu_seqlens=cu, output_final_state=True, context_parallel=True,
                                 cp_segment_len=64)
    assert kda_ref.relative_error(s, s3) <= 1e-5
    assert kda_ref.relative_error(o, o3) <= 1e-5


def test_tf32x3_merge_ptx_on_tensor_cores():
    """The merge at K = V = 64 in 32-row blocks (two tf32x3 mma.sync dots a step, joined with mt.cat): its PTX on the
    simulator against the interpreter, and both against the float64 composition S_{j+1} = M_j S_j + E_j."""
    helpers = pytest.importorskip("ptx_helpers")
    from minitriton.ir.types import PointerType, ScalarType

    gen = torch.Generator().manual_seed(31)
    K = V = BV = 64
    H, steps = 1, 3
    maps = torch.randn(steps, H, K, K + V, generator=gen) * 0.15
    h0 = torch.randn(1, H, K, V, generator=gen)
    seq = torch.tensor([0, steps + 1, 0], dtype=torch.int32)
    s_in = torch.full((steps + 1, H, K, V), float("nan"))
    args = [maps, h0, s_in, seq, H, *h0.stride()]
    f32, i32 = ScalarType("f32"), ScalarType("i32")
    types = {n: (PointerType(f32) if i < 3 else PointerType(i32) if i == 3 else i32)
             for i, n in enumerate(flash_kda.kda_merge_kernel.runtime_params)}
    make = helpers.dsl(flash_kda.kda_merge_kernel.fn, types,
                       dict(K=K, V=V, BV=BV, HAS_H0=True, PRECISION="tf32x3", MB=32), num_warps=8)
    ptx, _, _ = helpers.lower(make)
    assert ptx.count("mma.sync.aligned.m16n8k8") > 0 and "fma.rn.f32" not in ptx
    want = helpers.run_interpreted(make, (1,), args)
    got = helpers.run_simulated(make, (1,), args)
    assert helpers.rel_err(got[2], want[2]) <= 1e-6
    ref = [h0[0, 0].double()]
    for j in range(steps):
        m, e = maps[j, 0, :, :K].double(), maps[j, 0, :, K:].double()
        ref.append(m @ ref[-1] + e)
    assert kda_ref.relative_error(torch.stack(ref)[:, None], want[2]) <= 1e-5


def test_context_parallel_without_initial_state(interpret):
    check(make_inputs(1, 190, 1, 16, 16, seed=9, init=False), context_parallel=True)


def test_error_figure_detects_a_wrong_gate_convention(interpret):
    """The comparison can fail: the reference with the gate in log2 instead of natural units is far off."""
    x = make_inputs(1, 64, 1, 16, 16, seed=10)
    o, _ = flash_kda.chunk_kda(**x)
    wrong, _ = kda_ref.kda_recurrent_reference(**x, lower_bound=-5.0 / math.log(2))
    assert kda_ref.relative_error(wrong, o) > 10 * OUT_BOUND


# ------------------------------------------------------------------------- compiled PTX on the simulator

PHASE1_KERNELS = {"chunk64": "kda_intra_chunk_kernel", "sub16": "kda_intra_chunk_sub16_kernel",
                  "sliced": "kda_intra_chunk_sliced_kernel", "wg": "kda_intra_chunk_wg_kernel"}
KERNEL_OUTPUTS = {  # the pointer arguments each kernel writes
    **{name: ("w_ptr", "u_ptr", "kg_ptr", "qg_ptr", "aqk_ptr", "decay_ptr")
       for name in PHASE1_KERNELS.values()},
    "kda_recurrence_kernel": ("o_ptr", "ht_ptr"),
    "kda_merge_kernel": ("s_in_ptr",),
}


@pytest.mark.parametrize("variant", [*flash_kda.INTRA_VARIANTS, "sliced_coalesced_gate", "sliced_acc_stores",
                                     "sliced_state_tf32", "sliced_structured_solve", "sliced_no_prefetch",
                                     "sliced_split_update",
                                     "sliced_k128_recurrence_wgmma", "sliced_k128_recurrence_wgmma_8_warps",
                                     "sliced_k128_recurrence_transposed_wgmma",
                                     "sliced_k128_recurrence_transposed_wgmma_unfused",
                                     "sliced_k128_merge_prefetch", "wg_k128"])
def test_compiled_ptx_matches_the_interpreter(interpret, monkeypatch, variant):
    """Every launch of a context-parallel chunk_kda (all three kernels, both recurrence modes, each phase-1
    variant) is replayed from its inputs as PTX on tests/ptx_sim.py, outputs poisoned; the results must equal the
    interpreter's."""
    helpers = pytest.importorskip("ptx_helpers")
    from minitriton.ir.types import PointerType, ScalarType

    names = {torch.bfloat16: "bf16", torch.float32: "f32", torch.int32: "i32"}
    launches = []
    launch = flash_kda._launch

    def record(kernel, grid, args, **constexprs):
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        launch(kernel, grid, args, **constexprs)
        launches.append((kernel, grid, before, list(args), constexprs))

    monkeypatch.setattr(flash_kda, "_launch", record)
    if variant == "sliced_coalesced_gate":  # the sliced phase 1 with its gate loaded coalesced (not the scan layout)
        variant = "sliced"
        monkeypatch.setattr(flash_kda, "INTRA_SCAN_LAYOUT", False)
    if variant == "sliced_acc_stores":  # w, u and the Aqk rows stored from their accumulators' layouts
        variant = "sliced"
        monkeypatch.setattr(flash_kda, "ACC_STORES", True)
    if variant == "sliced_state_tf32":  # the state update in tf32 (the default: bf16x2, v_new's hi and lo halves)
        variant = "sliced"
        monkeypatch.setattr(flash_kda, "STATE_PRECISION", "tf32")
    if variant == "sliced_structured_solve":  # the UT inverse as block-structured dots (the default: dense)
        variant = "sliced"
        monkeypatch.setattr(flash_kda, "STRUCTURED_SOLVE", True)
    if variant == "sliced_split_update":  # the bf16x2 update as two dots sharing kg^T
        variant = "sliced"
        monkeypatch.setattr(flash_kda, "RECURRENCE_SPLIT_UPDATE", True)
    if variant == "sliced_no_prefetch":  # without the L1 prefetch of its rows, the score dots in one chain each
        variant = "sliced"
        monkeypatch.setattr(flash_kda, "INTRA_PREFETCH", False)
        monkeypatch.setattr(flash_kda, "SCORE_CHAINS", 1)
    head = 16
    if variant == "sliced_k128_merge_prefetch":  # K3's head size, the merge prefetching each next map into L1
        variant, head = "sliced", 128
        monkeypatch.setattr(flash_kda, "MERGE_PREFETCH", True)
        monkeypatch.setattr(flash_kda, "RECURRENCE_WS", False)  # the launch list below; WS has its own test
    if variant == "wg_k128":  # phase 1 on one warpgroup at K3's head size (8 x 8 elements a thread, 16 lanes a row)
        variant, head = "wg", 128
        monkeypatch.setattr(flash_kda, "RECURRENCE_WS", False)  # the launch list below; WS has its own test
    if variant.startswith("sliced_k128_recurrence"):  # K3's head size: the recurrence's big dots on wgmma
        if variant.endswith("8_warps"):  # two warpgroups: the [2 BT, K] dots on wgmma, the [BT, ...] ones not
            monkeypatch.setattr(flash_kda, "RECURRENCE_WARPS", 8)
        if "transposed_wgmma" in variant:  # S^T and v_new^T the wgmmas' A operands from registers
            monkeypatch.setattr(flash_kda, "RECURRENCE_TRANSPOSED", True)
            monkeypatch.setattr(flash_kda, "RECURRENCE_FUSED_WQ", not variant.endswith("unfused"))
        variant, head = "sliced", 128
        monkeypatch.setattr(flash_kda, "RECURRENCE_WGMMA", True)
        monkeypatch.setattr(flash_kda, "RECURRENCE_WS", False)  # the default at K = 128 (its own PTX test below)
    monkeypatch.setattr(flash_kda, "INTRA_VARIANT", variant)
    x = make_inputs(1, 140, 1, head, head, seed=15)
    flash_kda.chunk_kda(**x, output_final_state=True, context_parallel=True, cp_segment_len=64)
    assert [k.__name__ for k, *_ in launches] == [PHASE1_KERNELS[variant], "kda_recurrence_kernel", "kda_merge_kernel",
                                                 "kda_recurrence_kernel"]
    for kernel, grid, before, after, constexprs in launches:
        params = kernel.runtime_params
        types = {n: PointerType(ScalarType(names[a.dtype])) if isinstance(a, torch.Tensor) else
                 ScalarType("f32" if isinstance(a, float) else "i32") for n, a in zip(params, before)}
        options = dict(constexprs)
        make = helpers.dsl(kernel.fn, types, options, num_warps=options.pop("num_warps"))
        outputs = [i for i, n in enumerate(params) if n in KERNEL_OUTPUTS[kernel.__name__]
                   and not (n == "o_ptr" and constexprs.get("TRANSITION"))]
        for i in outputs:
            before[i] = before[i].clone().fill_(float("nan"))
        simulated = helpers.run_simulated(make, grid, before)
        for i in outputs:
            err = helpers.rel_err(simulated[i], after[i])
            # the mma accumulation order differs from the interpreter's float64 sums: a few bf16 outputs may round
            # one ulp apart, more of them at K = 128 (a wrong index or mask would be O(1) off)
            bound = 1e-4 if head == 16 else 2e-3
            assert err <= bound, f"{kernel.__name__} {params[i]}: PTX vs interpreter {err}"


# ---------------------------------------------------------------------------------- planning, errors


def test_context_parallel_choice_for_the_issue_shapes():
    def seg(lengths, heads, force=None):
        return flash_kda.segment_length(lengths, len(lengths) * heads * 2, 132, force, None)

    assert seg([32768], 96) is None  # 192 programs already fill 132 SMs
    assert seg([4096] * 8, 32) is None
    assert seg([131072], 4) == 8192  # 8 programs: 16 segments of 8192
    assert seg([32768], 16) == 8192  # 32 programs: 4 segments
    assert seg([8192], 12) == 1664  # 24 programs: 5 segments
    assert seg([2048], 4) is None  # too short to be worth it
    assert seg([32768], 96, force=False) is None
    assert seg([200], 96, force=True) == 128  # forced: at least two segments
    p = flash_kda.plan([(0, 200), (200, 200), (200, 300)], 128)
    assert p.segments == [[(0, 128), (128, 200)], [(200, 200)], [(200, 300)]]
    assert p.chunks == [(0, 64), (64, 128), (128, 192), (192, 200), (200, 264), (264, 300)]
    assert p.first_chunk == [0, 4, 4]


@pytest.mark.parametrize("change,message", [
    (dict(K=24), "power of two"),
    (dict(lower_bound=-6.0), "lower_bound"),
    (dict(state_dtype=torch.float16), "float32"),
    (dict(batch_varlen=True), "batch size must be 1"),
    (dict(a_log_len=3), "A_log"),
])
def test_validation(interpret, change, message):
    K = change.get("K", 16)
    x = make_inputs(2 if change.get("batch_varlen") else 1, 8, 2, K, 16, seed=11)
    if "state_dtype" in change:
        x["initial_state"] = x["initial_state"].to(change["state_dtype"])
    if "a_log_len" in change:
        x["A_log"] = torch.zeros(change["a_log_len"])
    cu = torch.tensor([0, 8]) if change.get("batch_varlen") else None
    with pytest.raises(ValueError, match=message):
        flash_kda.chunk_kda(**x, lower_bound=change.get("lower_bound", -5.0), cu_seqlens=cu)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("MINITRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="MINITRITON_INTERPRET"):
        flash_kda.chunk_kda(**make_inputs(1, 8, 1, 16, 16, seed=12))


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("MINITRITON_INTERPRET", "0") != "0",
                                reason="needs a CUDA GPU (and MINITRITON_INTERPRET unset)")


@gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 63, 64, 1000, 8192])
@pytest.mark.parametrize("H", [1, 4, 32])
@pytest.mark.parametrize("init", [False, True])
def test_gpu_matches_reference(T, H, init):
    check(make_inputs(1, T, H, 128, 128, seed=T + H, init=init, device="cuda"))


@gpu
@needs_cuda
@pytest.mark.parametrize("knob, value", [("INTRA_SCAN_LAYOUT", False), ("MERGE_PRECISION", "ieee"),
                                         ("RECURRENCE_FUSED_WQ", False), ("ACC_STORES", True),
                                         ("STATE_PRECISION", "bf16"), ("STATE_PRECISION", "tf32")])
def test_gpu_other_forms_t1000(monkeypatch, knob, value):
    """The non-default FlashKDA forms (the former defaults, and the opt-in ACC_STORES) on the H200
    (K = V = 128, T = 1000 H = 4, an initial state, context parallelism
    forced so that the merge runs): the oracle's bounds, and the same answer as the defaults within 1e-3."""
    x = make_inputs(1, 1000, 4, 128, 128, seed=6, init=True, device="cuda")
    o, s = flash_kda.chunk_kda(**x, output_final_state=True, context_parallel=True)
    monkeypatch.setattr(flash_kda, knob, value)
    check(x, context_parallel=True)
    o2, s2 = flash_kda.chunk_kda(**x, output_final_state=True, context_parallel=True)
    assert kda_ref.relative_error(o, o2) <= 1e-3 and kda_ref.relative_error(s, s2) <= 1e-3


@gpu
@needs_cuda
@pytest.mark.parametrize("context_parallel", [False, True])
@pytest.mark.parametrize("wgmma", [False, True])
def test_gpu_transposed_recurrence(monkeypatch, context_parallel, wgmma):
    """RECURRENCE_TRANSPOSED on the H200 (K = V = 128, T = 1000 H = 4, an initial state; with and without the
    context-parallel transitions), on mma.sync and (RECURRENCE_WGMMA) on wgmma with S^T and v_new^T as register
    A operands: the oracle's bounds."""
    monkeypatch.setattr(flash_kda, "RECURRENCE_TRANSPOSED", True)
    monkeypatch.setattr(flash_kda, "RECURRENCE_WGMMA", wgmma)
    check(make_inputs(1, 1000, 4, 128, 128, seed=5, init=True, device="cuda"), context_parallel=context_parallel)


@gpu
@needs_cuda
@pytest.mark.parametrize("context_parallel", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_gpu_warp_specialized_recurrence(monkeypatch, context_parallel, varlen):
    """RECURRENCE_WS on the GPU (K = V = 128; T = 1000 H = 4 with an initial state, or varlen sequences whose ends
    fall inside chunks, V-first states): the oracle's bounds, with and without the context-parallel transitions."""
    monkeypatch.setattr(flash_kda, "RECURRENCE_WS", True)
    if varlen:
        cu = torch.tensor([0, 1, 64, 1000, 3000, 4096], device="cuda")
        x = make_inputs(1, 4096, 4, 128, 128, seed=14, n_states=5, device="cuda", state_v_first=True)
        check(x, cu_seqlens=cu, state_v_first=True, context_parallel=context_parallel,
              cp_segment_len=1024 if context_parallel else None)
    else:
        check(make_inputs(1, 1000, 4, 128, 128, seed=5, init=True, device="cuda"), context_parallel=context_parallel)


@gpu
@needs_cuda
@pytest.mark.parametrize("context_parallel", [False, True])
def test_gpu_varlen(context_parallel):
    cu = torch.tensor([0, 1, 64, 1000, 5000, 8192], device="cuda")
    x = make_inputs(1, 8192, 4, 128, 128, seed=13, n_states=5, device="cuda", state_v_first=True)
    check(x, cu_seqlens=cu, state_v_first=True, context_parallel=context_parallel,
          cp_segment_len=1024 if context_parallel else None)


@gpu
@needs_cuda
@pytest.mark.parametrize("T,H", [(1000, 4), (8192, 32)])
def test_gpu_matches_fla(T, H):
    fla_kda = pytest.importorskip("fla.ops.kda")
    x = make_inputs(1, T, H, 128, 128, seed=14, device="cuda")
    o, s = flash_kda.chunk_kda(**x, output_final_state=True)
    with torch.inference_mode():
        ref_o, ref_s = fla_kda.chunk_kda(
            x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
            initial_state=x["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0)
    assert kda_ref.relative_error(ref_o, o) <= OUT_BOUND
    assert kda_ref.relative_error(ref_s, s) <= STATE_BOUND


# ------------------------------------------------------------- phase 2 with carried pointers (pipelined)


@pytest.mark.parametrize("k_dim,bt,bv,tokens,dynamic,mode", [
    (32, 16, 16, 40, False, "carried"),   # small tiles: the rings fit static shared memory
    (64, 64, 32, 130, True, "carried"),   # 24 KB a stage: the rings go to dynamic shared memory; a ragged last chunk
    (64, 64, 32, 130, False, "prefetch"),  # the next chunk's lines prefetched; its masks stop at the ragged end
    (64, 64, 64, 130, False, "transposed"),  # the state held as S^T [64, 64] on warps [4, 1]: A of its products
    (64, 64, 64, 130, False, "fused"),  # w S and qg S as one [w; qg] S dot
])
def test_carried_recurrence_ptx_matches_interpreter(monkeypatch: pytest.MonkeyPatch, k_dim: int, bt: int, bv: int,
                                                    tokens: int, dynamic: bool, mode: str) -> None:
    """kda_recurrence_kernel with CARRIED (RECURRENCE_CARRIED): its w / qg / Aqk loads become cp.async rings (the
    pipeline pass), and the compiled PTX, run on the PTX simulator (groups, ring slots and races checked), gives
    the interpreter's o and final state (to fp32 reassociation: 1e-6). With PREFETCH (RECURRENCE_PREFETCH) instead:
    the interpreter checks that every unmasked prefetch points into its tensor (one past the last chunk would not),
    and the PTX has one prefetch.global.L1 per operand tile and the same results. TRANSPOSED and FUSED_WQ: the
    same results from their forms of the products."""
    from ptx_helpers import clone_args
    from ptx_sim import run_ptx

    from minitriton import compiler
    from minitriton.runtime.specialize import parse_arg_spec

    gen = torch.Generator().manual_seed(k_dim + tokens)
    H, warps = 1, 4

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.5

    chunks = -(-tokens // bt)
    args = [r(tokens * H, k_dim).bfloat16(), r(tokens * H, k_dim).bfloat16(), r(tokens * H, k_dim).bfloat16(),
            r(tokens * H, k_dim).bfloat16(), r(tokens * H, bt).bfloat16(),
            torch.rand(chunks * H, k_dim, generator=gen) * 0.5 + 0.5,
            torch.full((tokens * H, k_dim), float("nan")).bfloat16(), r(1, H, k_dim, k_dim),
            torch.full((1, H, k_dim, k_dim), float("nan")), torch.tensor([[0, tokens, 0, 0]], dtype=torch.int32)]
    strides = args[7].stride()
    args += [H, *strides, *strides]
    const = dict(K=k_dim, V=k_dim, BT=bt, BV=bv, TRANSITION=False, HAS_H0=True, STORE_HT=True,
                 STATE_PRECISION="tf32", CARRIED=mode == "carried", PREFETCH=mode == "prefetch",
                 LINES_K=flash_kda._lines(k_dim), LINES_V=flash_kda._lines(bv), LINES_T=flash_kda._lines(bt),
                 TRANSPOSED=mode == "transposed", FUSED_WQ=mode == "fused")
    programs = k_dim // bv * H
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")
    want = clone_args(args)
    flash_kda.kda_recurrence_kernel[(programs,)](*want, **const, num_warps=warps)
    kernel = flash_kda.kda_recurrence_kernel
    codes = {torch.bfloat16: "*bf16:16", torch.float32: "*fp32:16", torch.int32: "*i32:16"}
    types = {n: parse_arg_spec(codes[a.dtype] if isinstance(a, torch.Tensor) else "i32").type
             for n, a in zip(kernel.runtime_params, args)}
    compiled = compiler.compile_kernel(kernel.fn, types, const, num_warps=warps, num_stages=3, target="ptx",
                                       divisibility={n: 16 for n, a in zip(kernel.runtime_params, args)
                                                     if isinstance(a, torch.Tensor)}, keep_ir=True)
    if mode == "prefetch":
        assert compiled.ptx.count("prefetch.global.L1") == 5 and "cp.async" not in compiled.ptx
    elif mode == "transposed":  # S^T renamed into the A operands: the only staged tiles are w, qg, Aqk and kg
        lowered = list(compiled.ir.values())[-1]
        assert "kPairs = 1" in lowered and "cp.async" not in compiled.ptx
    elif mode == "fused":  # one state product per chunk besides Aqk v_new and the update: 3 dots, not 4
        lowered = list(compiled.ir.values())[-1]
        assert lowered.count('"mt.dot"') == 3 and "cp.async" not in compiled.ptx
    else:
        assert compiled.ptx.count("cp.async.cg") > 0
    assert (compiled.metadata.get("dynamic_shared") or 0) > 0 if dynamic else not compiled.metadata.get("dynamic_shared")
    got = clone_args(args)
    run_ptx(compiled.ptx, compiled.metadata["name"], (programs,), got, 32 * warps)
    for i in (6, 8):  # o, final state
        assert ((got[i].float() - want[i].float()).abs().max() / want[i].float().abs().max()).item() <= 1e-6


def test_flash_kda_ptx_tool_compiles_every_launched_kernel() -> None:
    """tools/flash_kda_ptx.py (no GPU): chunk_kda's launches are recorded, not run, and each kernel compiles with its
    launch's types and constexprs; the bar.sync count per loop is attributed (phase 1, the recurrence's chunk
    loop). Small heads keep it fast."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "flash_kda_ptx.py"
    spec = importlib.util.spec_from_file_location("flash_kda_ptx", path)
    tool = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tool)  # type: ignore[union-attr]
    launches = tool.recorded_launches(128, 1, 16, 16, None)
    names = [kernel.__name__ for kernel, *_ in launches]
    assert names[0].startswith("kda_intra_chunk") and "kda_recurrence_kernel" in names
    for kernel, _, args, constexprs in launches[:2]:
        compiled, loops = tool.compile_launch(kernel, args, constexprs)
        assert compiled.ptx and sum(loops.values()) == compiled.ptx.count("bar.sync")
    # at K = V = 64 the recurrence is the warp-specialized kernel, whose TMA operands are TensorDescriptors
    ws = [x for x in tool.recorded_launches(128, 1, 64, 64, None) if x[0].__name__ == "kda_recurrence_ws_kernel"]
    assert ws
    kernel, _, args, constexprs = ws[0]
    assert "cp.async.bulk.tensor" in tool.compile_launch(kernel, args, constexprs)[0].ptx


WS_OUTPUTS = ("o_ptr", "ht_ptr")


@pytest.mark.parametrize("head,policy", [(64, "round_robin"), (64, "greedy"), (128, "round_robin")])
def test_warp_specialized_recurrence_ptx_matches_the_interpreter(interpret, monkeypatch, head, policy):
    """RECURRENCE_WS (kda_recurrence_ws_kernel: TMA producer warpgroup, consumers holding S^T as wgmma register A,
    B^T and B ring slots read in place): both of a context-parallel call's recurrence launches replayed as PTX on
    the warp-specialized simulator (partitions on their own program counters, its TMA / mbarrier / wgmma / race
    checks; outputs poisoned) at K = V = 64 (one consumer warpgroup) and 128 (two: K3's heads) with a ragged last
    chunk; they must equal the interpreter's, and the call must match the float64 reference and the default
    recurrence."""
    helpers = pytest.importorskip("ptx_helpers")
    from ptx_sim_ws import run_ws_ptx
    from test_pipeline import ptx_of
    from minitriton.compiler import PIPELINE
    from minitriton.frontend import compile_to_ir
    from minitriton.ir.types import PointerType, ScalarType, TensorDescType, TensorType, bf16
    from minitriton.passes import run_passes
    from minitriton.runtime.tma import TensorDescriptor

    x = make_inputs(1, 140, 1, head, head, seed=16)
    o_ref, s_ref = flash_kda.chunk_kda(**x, output_final_state=True, context_parallel=True, cp_segment_len=64)
    names = {torch.bfloat16: "bf16", torch.float32: "f32", torch.int32: "i32"}
    launches = []
    launch = flash_kda._launch

    def record(kernel, grid, args, **constexprs):
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        launch(kernel, grid, args, **constexprs)
        if kernel is flash_kda.kda_recurrence_ws_kernel:
            launches.append((kernel, grid, before, list(args), constexprs))

    monkeypatch.setattr(flash_kda, "RECURRENCE_WS", True)
    check(x, context_parallel=True, cp_segment_len=64)
    monkeypatch.setattr(flash_kda, "_launch", record)
    o, s = flash_kda.chunk_kda(**x, output_final_state=True, context_parallel=True, cp_segment_len=64)
    assert kda_ref.relative_error(s_ref, s) <= 1e-6 and kda_ref.relative_error(o_ref, o) <= 1e-6
    assert [c["TRANSITION"] for *_, c in launches] == [True, False]
    for kernel, grid, before, after, constexprs in launches:
        types = {n: TensorDescType(TensorType(tuple(a.block_shape), bf16)) if isinstance(a, TensorDescriptor)
                 else PointerType(ScalarType(names[a.dtype])) if isinstance(a, torch.Tensor) else ScalarType("i32")
                 for n, a in zip(kernel.runtime_params, before)}
        options = dict(constexprs)
        warps = options.pop("num_warps")
        module = run_passes(compile_to_ir(kernel.fn, types, options, num_warps=warps), PIPELINE)
        ptx, name = ptx_of(module)
        outputs = [i for i, n in enumerate(kernel.runtime_params) if n in WS_OUTPUTS
                   and not (n == "o_ptr" and constexprs["TRANSITION"])]
        for i in outputs:
            before[i] = before[i].clone().fill_(float("nan"))
        run_ws_ptx(ptx, name, grid, before, 32 * warps, policy=policy)
        for i in outputs:
            err = helpers.rel_err(before[i], after[i])
            assert err <= 1e-4, f"{kernel.__name__} {kernel.runtime_params[i]}: PTX vs interpreter {err}"


def test_context_parallel_plan_counts_warp_specialized_programs(monkeypatch):
    """The automatic split fills the SMs with the recurrence that runs: the WS kernel holds 128 state columns a
    program (one a head at V = 128), the default 64, so at T8192 H12 on 132 SMs WS splits in 8 segments, not 5."""
    def segments() -> int:
        block = flash_kda._planned_block(128, 128, flash_kda.STATE_BLOCK)
        seg = flash_kda.segment_length([8192], 12 * (128 // block), 132, None, None)
        return -(-8192 // seg)

    monkeypatch.setattr(flash_kda, "RECURRENCE_WS", False)
    assert segments() == 5
    monkeypatch.setattr(flash_kda, "RECURRENCE_WS", True)
    assert segments() == 8
    monkeypatch.setattr(flash_kda, "WS_CP_PROGRAMS", False)
    assert segments() == 5
    monkeypatch.setattr(flash_kda, "WS_CP_PROGRAMS", True)
    assert flash_kda._planned_block(32, 32, 32) == 32  # narrow heads: the plain recurrence and its own block


def test_warp_specialized_recurrence_falls_back_on_narrow_heads(interpret, monkeypatch):
    """RECURRENCE_WS at K = V = 16 (below its 64-column TMA boxes): the plain recurrence runs, same answer."""
    monkeypatch.setattr(flash_kda, "RECURRENCE_WS", True)
    assert not flash_kda.ws_recurrence_fits(16, 16) and flash_kda.ws_recurrence_fits(128, 128)
    launched = []
    launch = flash_kda._launch

    def record(kernel, *args, **constexprs):
        launched.append(kernel)
        launch(kernel, *args, **constexprs)

    monkeypatch.setattr(flash_kda, "_launch", record)
    check(make_inputs(1, 100, 2, 16, 16, seed=17))
    assert flash_kda.kda_recurrence_kernel in launched and flash_kda.kda_recurrence_ws_kernel not in launched
