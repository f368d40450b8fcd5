"""FlashKDA's phase-1 variants (flash_kda.INTRA_VARIANTS: sliced, chunk64, sub16) side by side, in one GPU run.

    python tools/flash_kda_variants.py [--variants=sliced,...] [--state-blocks=64,32] [--carried=yes] [--prefetch=yes]
                                       [--transposed=yes] [--recurrence-warps=4,8] [--scan-layout=yes]
                                       [--merge-precision=ieee] [--fused-wq=yes] [--segment-lens=1408,1664]
                                       [--acc-stores=yes] [--knob=NAME=VALUE ...]
                                                          [BxTxH ...]
                                                          GPU: correctness first, then per-kernel times
    python tools/flash_kda_variants.py --static           no GPU: ptxas registers / spills and instruction counts

GPU mode, per variant: (1) the oracle check of tests/test_flash_kda.py at T=1000 H=4 K=V=128 with an initial state
(float64 token-by-token reference; bounds 1e-2 output / 5e-3 final state), and at every benchmark shape the output
and final state against the sub16 variant's (same bounds); (2) per-kernel GPU time (torch.profiler, mean of
5 calls) at each shape (default B1 T32768 H16 and B1 T8192 H12, K=V=128), ours for each
variant and fla's chunk_kda on the same tensors. A variant that fails its check is reported and not timed.
--scan-layout=yes, --fused-wq=yes and --acc-stores=yes time the form of that knob (INTRA_SCAN_LAYOUT,
RECURRENCE_FUSED_WQ, ACC_STORES) that the default is not; --merge-precision=P times the merge in P;
--segment-lens=L,... times the defaults with the context-parallel segment length forced to each L (tokens, a
multiple of 64) at every shape; --knob=NAME=VALUE (repeatable) times the defaults with flash_kda's module constant
NAME set to VALUE (an int, True / False, or a string), e.g. --knob=STATE_PRECISION=bf16; several constants of
one variant are joined by commas, e.g. --knob=INTRA_PREFETCH=False,SCORE_CHAINS=1.

--static compiles each phase-1 kernel ahead of time at K=V=128 with 16-byte aligned pointers (the runtime's
specialization), 8 warps, and prints ptxas's registers and spill bytes, the PTX instruction count (per thread;
phase 1 has no loops, so static = dynamic), bar.sync, mma.sync, cvt.rn.tf32, and, when nvdisasm is on PATH, the
SASS counts (total, HMMA, BAR, STL/LDL, MUFU) that docs/kernels/flash_kda.md's performance model takes.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_flash_kda import parse_knob  # noqa: E402,F401  (prebuild_cache imports it from here)
from minitriton.kernels import flash_kda, kda_ref  # noqa: E402

OUT_BOUND, STATE_BOUND = 1e-2, 5e-3
DEFAULT_SHAPES = [(1, 32768, 16), (1, 8192, 12)]
ORACLE_SHAPE = (1, 1000, 4, 128)  # B, T, H, K = V of the oracle check (as tests/test_flash_kda.py's GPU tests)
PHASE1 = {"sliced": flash_kda.kda_intra_chunk_sliced_kernel, "chunk64": flash_kda.kda_intra_chunk_kernel,
          "sub16": flash_kda.kda_intra_chunk_sub16_kernel, "wg": flash_kda.kda_intra_chunk_wg_kernel}


# ---------------------------------------------------------------------------------------------------- GPU


def oracle_check(variant: str) -> str | None:
    """None when the variant meets the bounds at T=1000 H=4 against the float64 oracle, else the failure."""
    gen = torch.Generator().manual_seed(22)
    B, T, H, K = ORACLE_SHAPE

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    x = dict(q=randn(B, T, H, K).bfloat16().cuda(), k=randn(B, T, H, K).bfloat16().cuda(),
             v=randn(B, T, H, K).bfloat16().cuda(), g=randn(B, T, H, K).bfloat16().cuda(),
             beta=randn(B, T, H).bfloat16().cuda(), A_log=(torch.rand(H, generator=gen) * 2 - 1).cuda(),
             dt_bias=randn(H * K).cuda(), initial_state=randn(B, H, K, K).cuda())
    flash_kda.INTRA_VARIANT = variant
    o, s = flash_kda.chunk_kda(**x, output_final_state=True)
    ref_o, ref_s = kda_ref.kda_recurrent_reference(**x, output_final_state=True)
    o_err, s_err = kda_ref.relative_error(ref_o, o), kda_ref.relative_error(ref_s, s)
    print(f"  {variant}: oracle B={B} T={T} H={H} K=V={K}: output {o_err:.2e}, state {s_err:.2e}")
    if not (o_err <= OUT_BOUND and s_err <= STATE_BOUND):
        return f"oracle errors {o_err:.2e} / {s_err:.2e} over the bounds"
    return None


def time_against_sub16(label: str, p: "object", base: tuple[torch.Tensor, torch.Tensor],
                       cp_segment_len: int | None = None) -> None:
    """Run ours as flash_kda's knobs now stand, check output and final state against the sub16 run `base`, then
    print the per-kernel times (or why it was not timed). cp_segment_len: the context-parallel segment length
    forced (None: chosen by chunk_kda)."""
    from benchmarks import bench_flash_kda as bench
    from benchmarks.harness import kernel_times

    call = bench.ours(p, None, cp_segment_len)  # type: ignore[arg-type]
    o, s = call()
    o_err, s_err = kda_ref.relative_error(base[0], o), kda_ref.relative_error(base[1], s)
    if not (o_err <= OUT_BOUND and s_err <= STATE_BOUND):
        print(f"{label}: differs from sub16 ({o_err:.2e} / {s_err:.2e}): not timed")
        return
    rows = kernel_times(call)
    print(f"{label}: {sum(t for _, t in rows):9.1f} us (vs sub16 {o_err:.1e} / {s_err:.1e})  "
          + ", ".join(f"{k} {t:.1f}" for k, t in rows))


@contextlib.contextmanager
def knob(name: str, value: object) -> Iterator[None]:
    """flash_kda's module constant `name` set to `value` for the block, then restored."""
    old = getattr(flash_kda, name)
    setattr(flash_kda, name, value)
    try:
        yield
    finally:
        setattr(flash_kda, name, old)


def gpu(shapes: list[tuple[int, int, int]], state_blocks: tuple[int, ...] = (),
        variants: tuple[str, ...] = tuple(PHASE1), carried: bool = False, prefetch: bool = False,
        transposed: bool = False, recurrence_warps: tuple[int, ...] = (), scan_layout: bool = False,
        merge_precision: str = "", fused_wq: bool = False, segment_lens: tuple[int, ...] = (),
        acc_stores: bool = False, knobs: tuple[tuple[tuple[str, object], ...], ...] = ()) -> None:
    from benchmarks import bench_flash_kda as bench
    from benchmarks.harness import kernel_times

    defaults = flash_kda.INTRA_VARIANT, flash_kda.STATE_BLOCK, flash_kda.RECURRENCE_CARRIED, \
        flash_kda.RECURRENCE_PREFETCH, flash_kda.RECURRENCE_TRANSPOSED
    failed: dict[str, str] = {}
    for variant in variants:
        err = oracle_check(variant)
        if err:
            failed[variant] = err
    for B, T, H in shapes:
        p = bench.make_problem(B, T, H)
        flash_kda.INTRA_VARIANT = "sub16"
        base = bench.ours(p, None)()
        for variant in variants:
            if variant in failed:
                print(f"B={B} T={T} H={H} {variant}: not timed ({failed[variant]})")
                continue
            flash_kda.INTRA_VARIANT = variant
            time_against_sub16(f"B={B} T={T} H={H} {variant:8s}", p, base)
        flash_kda.INTRA_VARIANT = "sliced"
        for block in state_blocks:  # phase 2's state columns per program (flash_kda.STATE_BLOCK)
            flash_kda.STATE_BLOCK = block
            time_against_sub16(f"B={B} T={T} H={H} sliced, state block {block:3d}", p, base)
            # the same block with the default block's segment split, so the chain length is held
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            held = flash_kda.segment_length([T] * B, B * H * (p.v.shape[-1] // defaults[1]), sms, None, None)
            if held is not None and block != defaults[1]:
                time_against_sub16(f"B={B} T={T} H={H} sliced, state block {block:3d}, segments of {held}", p, base,
                                   held)
        flash_kda.STATE_BLOCK = defaults[1]
        if carried:  # phase 2's operands through carried pointers: cp.async rings (flash_kda.RECURRENCE_CARRIED)
            flash_kda.RECURRENCE_CARRIED = True
            time_against_sub16(f"B={B} T={T} H={H} sliced, carried recurrence", p, base)
        flash_kda.RECURRENCE_CARRIED = defaults[2]
        if prefetch:  # phase 2 prefetches the next chunk's operand lines into L1 (flash_kda.RECURRENCE_PREFETCH)
            flash_kda.RECURRENCE_PREFETCH = True
            time_against_sub16(f"B={B} T={T} H={H} sliced, prefetched recurrence", p, base)
        if scan_layout:  # the sliced phase 1's gate in the other layout than the default's
            scan = not flash_kda.INTRA_SCAN_LAYOUT
            with knob("INTRA_SCAN_LAYOUT", scan):
                time_against_sub16(f"B={B} T={T} H={H} sliced, gate {'in the scan layout' if scan else 'coalesced'}",
                                   p, base)
        if acc_stores:  # phase 1's w, u, Aqk stored from their accumulators' layouts, or converted first
            direct = not flash_kda.ACC_STORES
            with knob("ACC_STORES", direct):
                form = "stores from the accumulators" if direct else "coalesced stores"
                time_against_sub16(f"B={B} T={T} H={H} sliced, {form}", p, base)
        if merge_precision:  # the context-parallel merge's compositions
            with knob("MERGE_PRECISION", merge_precision):
                time_against_sub16(f"B={B} T={T} H={H} sliced, merge in {merge_precision}", p, base)
        if fused_wq:  # the output pass's w S and qg S fused or not, whichever the default is not
            fused = not flash_kda.RECURRENCE_FUSED_WQ
            with knob("RECURRENCE_FUSED_WQ", fused):
                time_against_sub16(f"B={B} T={T} H={H} sliced, {'fused [w; qg] S' if fused else 'w S and qg S apart'}",
                                   p, base)
        for seg_len in segment_lens:  # the context-parallel split forced: chain length against program count
            time_against_sub16(f"B={B} T={T} H={H} sliced, segments of {seg_len}", p, base, seg_len)
        for settings in knobs:  # any module constants in other values, together
            with contextlib.ExitStack() as stack:
                for name, value in settings:
                    stack.enter_context(knob(name, value))
                label = ", ".join(f"{name} = {value!r}" for name, value in settings)
                time_against_sub16(f"B={B} T={T} H={H} sliced, {label}", p, base)
        for warps in recurrence_warps:  # phase 2's warps forced for every launch
            with knob("RECURRENCE_WARPS", warps):
                time_against_sub16(f"B={B} T={T} H={H} sliced, recurrence on {warps} warps", p, base)
        if transposed:  # phase 2 holds its state transposed, in place as its products' A operand
            flash_kda.RECURRENCE_TRANSPOSED = True
            time_against_sub16(f"B={B} T={T} H={H} sliced, transposed recurrence", p, base)
        (flash_kda.INTRA_VARIANT, flash_kda.STATE_BLOCK, flash_kda.RECURRENCE_CARRIED,
         flash_kda.RECURRENCE_PREFETCH, flash_kda.RECURRENCE_TRANSPOSED) = defaults
        try:
            rows = kernel_times(bench.fla(p))
            print(f"B={B} T={T} H={H} fla     : {sum(t for _, t in rows):9.1f} us  "
                  + ", ".join(f"{k[:40]} {t:.1f}" for k, t in rows[:8]))
        except Exception as e:  # fla missing or its API changed: report and go on
            print(f"B={B} T={T} H={H} fla: FAILED {type(e).__name__}: {str(e)[:200]}")
        del p, base
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------- static


POINTERS = dict(q_ptr="bf16", k_ptr="bf16", v_ptr="bf16", g_ptr="bf16", beta_ptr="bf16", a_log_ptr="f32",
                dt_bias_ptr="f32", chunk_ptr="i32", w_ptr="bf16", u_ptr="bf16", kg_ptr="bf16", qg_ptr="bf16",
                aqk_ptr="bf16", decay_ptr="f32")
FLOATS = ("scale", "lower_bound", "diag_up", "diag_down")


def signature(kernel) -> str:  # type: ignore[no-untyped-def]
    """The runtime's specialization at the benchmark: 16-byte aligned pointers, i32 H, f32 scalars."""
    parts = []
    for name in kernel.runtime_params:
        if name in POINTERS:
            parts.append(f"{name}:*{POINTERS[name]}:16")
        else:
            parts.append(f"{name}:{'f32' if name in FLOATS else 'i32'}")
    return ",".join(parts)


def static_counts(kernel, K: int = 128, V: int = 128) -> dict[str, int]:  # type: ignore[no-untyped-def]
    spec = kernel.aot_spec(signature(kernel), flash_kda.INTRA_WARPS, None, K=K, V=V, BT=flash_kda.CHUNK,
                           SOLVE_PRECISION="tf32")
    compiled = spec.compile(target="cubin")
    meta = compiled.metadata
    lines = [ln.strip() for ln in compiled.ptx.splitlines()]
    ptx = [ln for ln in lines if ln.endswith(";") and not ln.startswith((".", "//"))]
    out = dict(registers=meta["registers"], spill_stores=meta["spill_stores"], spill_loads=meta["spill_loads"],
               ptx=len(ptx), **{name: sum(1 for ln in ptx if key in ln) for name, key in (
                   ("bar.sync", "bar.sync"), ("mma.sync", "mma.sync"), ("cvt.rn.tf32", "cvt.rn.tf32"))})
    disasm = shutil.which("nvdisasm")
    if disasm and compiled.cubin:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.cubin)
            f.flush()
            sass = subprocess.run([disasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
        ins = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
        out["sass"] = len(ins)
        for op in ("HMMA", "BAR", "STL", "LDL", "MUFU"):
            out[op] = sum(1 for ln in ins if re.search(rf"\b{op}\b", ln))
    return out


def static() -> None:
    for variant, kernel in PHASE1.items():
        c = static_counts(kernel)
        print(f"{variant:8s} " + " ".join(f"{k} {v}" for k, v in c.items()), flush=True)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return
    if args == ["--static"]:
        static()
        return
    options = {"--state-blocks": "", "--variants": ",".join(PHASE1), "--carried": "no", "--prefetch": "no",
               "--transposed": "no", "--recurrence-warps": "", "--scan-layout": "no", "--merge-precision": "",
               "--fused-wq": "no", "--segment-lens": "", "--acc-stores": "no"}
    knobs: list[tuple[tuple[str, object], ...]] = []
    while args and args[0].startswith("--"):  # --state-blocks=64,32 also times phase 2's column blocks
        name, _, value = args.pop(0).partition("=")
        if name == "--knob":
            knobs.append(parse_knob(value))
        elif name in options:
            options[name] = value
        else:
            sys.exit(f"unknown option {name} (see --help)")
    blocks = tuple(int(b) for b in options["--state-blocks"].split(",") if b)
    variants = tuple(v for v in options["--variants"].split(",") if v in PHASE1)
    gpu([tuple(int(x) for x in s.split("x")) for s in args] or DEFAULT_SHAPES, blocks, variants,  # type: ignore[misc]
        options["--carried"] != "no", options["--prefetch"] != "no", options["--transposed"] != "no",
        tuple(int(w) for w in options["--recurrence-warps"].split(",") if w), options["--scan-layout"] != "no",
        options["--merge-precision"], options["--fused-wq"] != "no",
        tuple(int(n) for n in options["--segment-lens"].split(",") if n), options["--acc-stores"] != "no",
        tuple(knobs))


if __name__ == "__main__":
    main()
