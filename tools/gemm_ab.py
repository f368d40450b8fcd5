"""A/B of the GEMM's main-loop variants on the GPU, next to torch.matmul (cuBLAS) in the same process.

    python tools/gemm_ab.py                 every variant, every shape (8192^3, 4096^3, 64x8192x8192)
    python tools/gemm_ab.py --shapes 4096^3 --variants cp.async-ring
    python tools/gemm_ab.py --list          the variants and their configs (no GPU needed)
    python tools/gemm_ab.py --variants tma-ws --configs 128x256x64_w8_s3 --rounds 5 --steady 20
                                            one config, ours and cuBLAS alternated 5 times after 20 s of load

Variants (each a kernel of minitriton.kernels.examples and the configs it is timed with; the row reports each
config and the best):
  cp.async-ring   matmul.py's matmul_kernel, every MATMUL_CONFIG: cp.async from every thread into the wgmma-laid-out
                  ring (passes/pipeline.py), wgmma reading the slots in place (docs/kernels/gemm.md v1)
  tma-ring        matmul.py's matmul_tma_ring (matmul_tma_ring_kernel), the same four configs: the same ring and
                  schedule filled by TMA from thread 0 (16 [8, 64] A boxes + BLOCK_N / 64 [64, 64] B boxes per
                  stage, one mbarrier per slot; docs/kernels/gemm.md v2)
  tma-unpipelined matmul_tma.py's matmul_tma_kernel at 128x128x64 / 8 warps: one TMA box per operand per K step,
                  waited for at once (no ring): the TMA datapath without overlap
  tma-ws          matmul.py's matmul_tma_ws (matmul_tma_ws_kernel = matmul_tma_ring_kernel compiled with
                  @mt.kernel(warp_specialize=True)), the same four configs: a producer warpgroup issues the TMA
                  boxes, the num_warps consumer warps run the wgmmas (setmaxnreg 40 / 232, full + empty mbarriers
                  per slot, no block barrier in the loop; docs/kernels/gemm.md v3); num_warps + 4 warps per block.
                  Last: a protocol bug would hang rather than fail (measured 2026-11-29: 83.0% of cuBLAS).
  tma-ws-paired   the same with A in rank-4 boxes of two permuted row groups each (tma_ring_descriptors paired_a:
                  8 instead of 16 A boxes a stage at 128 rows); M a multiple of 64, else the rank-2 boxes
                  (measured 2026-12-01: 98.1% / 94.3% of cuBLAS at 8192^3 / 4096^3)
  triton          the peer: Triton 3.6's tutorial matmul, autotuned (benchmarks/triton_peers.py matmul; its autotuner
                  runs on the first call, before timing)
  triton-tma      the peer: Triton's TMA persistent matmul (tutorial 09 form: host tensor descriptors, one program
                  per SM, grouped tile order), each of TMA_GEMM_CONFIGS (with / without Triton's warp_specialize)
  persistent      matmul.py's matmul_persistent (matmul_persistent_kernel, warp-specialized by hand with
                  mt.warp_specialize and mt.ring): one program per resident slot loops over the C tiles; the
                  producer warpgroup fills the next tile's stages while the consumers store the current one;
                  paired A boxes; the 128-row configs and the warp-specialized extras
  persistent-tma-store  the same with C written by TMA stores straight from the accumulator registers
                  ([BLOCK_M, 64] boxes, 32 KB a round; the copy engine writes C while the consumers start the next
                  tile)

Every result is checked against torch on the same inputs before it is timed (relative Frobenius error of the bf16
output against the float64 product <= 1e-2); a failing or crashing config is reported, not timed. Times are
medians of benchmarks/harness.py do_bench (L2 flushed per call), TFLOP/s = 2 M N K / time; `% cuBLAS` is
torch's time over ours, with torch timed again right after each row (neighbours in time: clocks drift in a run).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"8192^3": (8192, 8192, 8192), "4096^3": (4096, 4096, 4096), "64x8192x8192": (64, 8192, 8192)}
REL_TOL = 1e-2

Launch = Callable[[Any, Any], Any]  # (a, b) -> c


@dataclass(frozen=True)
class Variant:
    """A kernel variant: named configs, each a function (a, b) -> c that allocates C and launches."""

    name: str
    doc: str
    configs: Callable[[], dict[str, Launch]]


# Skinny tiles for the cp.async ring (M = 64: one warpgroup, m64 wgmma; 64x8192x8192 runs 128 programs, one wave,
# where 128x256 tiles run 32 half-empty ones). ptxas: 135 registers, no spills; 64x128 spills at 4 warps. The
# 8-stage one (99.3% of cuBLAS at 64x8192x8192 on 2026-11-30; 6 stages 89.6%) is in MATMUL_CONFIGS too.
RING_EXTRA_CONFIGS = [((64, 64, 64), 4, 6), ((64, 64, 64), 4, 8)]


def _ring_configs() -> dict[str, Launch]:
    import torch

    import minitriton as mt
    from minitriton.kernels.examples import matmul as mm

    out: dict[str, Launch] = {}
    extra = [mt.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st)
             for (bm, bn, bk), w, st in RING_EXTRA_CONFIGS]
    for config in [c for c in mm.MATMUL_CONFIGS if c.kwargs["BLOCK_M"] >= 128] + extra:
        meta = dict(config.kwargs)
        name = f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{config.num_warps} s{config.num_stages}"

        def launch(a: Any, b: Any, meta: dict = meta, config: Any = config) -> Any:
            (m, k), n = a.shape, b.shape[1]
            c = torch.empty((m, n), dtype=a.dtype, device=a.device)
            tiles = (mt.cdiv(m, meta["BLOCK_M"]), mt.cdiv(n, meta["BLOCK_N"]))
            grid = (tiles[0] * tiles[1],) if meta.get("GROUP_M", 0) else tiles
            mm.matmul_kernel[grid](a, b, c, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                   c.stride(0), c.stride(1), **meta, num_warps=config.num_warps,
                                   num_stages=config.num_stages)
            return c

        out[name] = launch
    return out


def _tma_ring_configs(warp_specialized: bool = False, paired_a: bool = False) -> dict[str, Launch]:
    from minitriton.kernels.examples import matmul as mm

    def wrapper(a: Any, b: Any, config: Any) -> Any:
        if warp_specialized:
            return mm.matmul_tma_ws(a, b, config, paired_a=paired_a)
        return mm.matmul_tma_ring(a, b, config)

    out: dict[str, Launch] = {}
    for config in mm.MATMUL_CONFIGS:
        meta = dict(config.kwargs)
        if meta["BLOCK_M"] < 128:
            continue
        name = f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{config.num_warps} s{config.num_stages}"
        out[name] = lambda a, b, config=config: wrapper(a, b, config)
    return out


# Extra tiles for the warp-specialized kernel only (ptxas: 168 registers before setmaxnreg, 0 spills): 256 x 128
# (each consumer warpgroup two m64n128 blocks: half the B bytes per FLOP of 128 x 128, A boxes doubled) and a wider
# L2 group. Checked like every row before timing.
WS_EXTRA_CONFIGS = [((256, 128, 64, 8), 3), ((256, 128, 64, 8), 4), ((128, 256, 64, 16), 3)]


def _tma_ws_configs(paired_a: bool = False) -> dict[str, Launch]:
    """The warp-specialized configs; paired_a: A in rank-4 boxes of two row groups (matmul_tma_ws paired_a:
    20 -> 12 TMA instructions a stage at 128 x 256, 34 -> 18 at 256 x 128)."""
    import minitriton as mt
    from minitriton.kernels.examples import matmul as mm

    out = _tma_ring_configs(warp_specialized=True, paired_a=paired_a)
    for (bm, bn, bk, group), stages in WS_EXTRA_CONFIGS:
        config = mt.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group}, num_warps=8,
                           num_stages=stages)
        out[f"{bm}x{bn}x{bk} w8 s{stages} G{group}"] = (
            lambda a, b, config=config: mm.matmul_tma_ws(a, b, config, paired_a=paired_a))
    return out


def _tma_unpipelined_configs() -> dict[str, Launch]:
    import torch

    import minitriton as mt
    from minitriton.kernels.examples import matmul_tma as mtma

    bm, bn, bk, warps = 128, 128, 64, 8

    def launch(a: Any, b: Any) -> Any:
        (m, k), n = a.shape, b.shape[1]
        c = torch.empty((m, n), dtype=a.dtype, device=a.device)
        a_desc = mt.TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = mt.TensorDescriptor.from_tensor(b, [bk, bn])
        mtma.matmul_tma_kernel[(mt.cdiv(m, bm), mt.cdiv(n, bn))](a_desc, b_desc, c, c, m, n, k, c.stride(0),
                                                                 c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                                 num_warps=warps)
        return c

    return {f"{bm}x{bn}x{bk} w{warps}": launch}


def _persistent_configs(tma_store: bool = False) -> dict[str, Launch]:
    import minitriton as mt
    from minitriton.kernels.examples import matmul as mm

    out: dict[str, Launch] = {}
    configs = [c for c in mm.MATMUL_CONFIGS if c.kwargs["BLOCK_M"] >= 128] + [
        mt.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group}, num_warps=8, num_stages=stages)
        for (bm, bn, bk, group), stages in WS_EXTRA_CONFIGS]
    for config in configs:
        meta = dict(config.kwargs)
        name = f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{config.num_warps} s{config.num_stages}"
        if meta.get("GROUP_M", 8) != 8:
            name += f" G{meta['GROUP_M']}"
        out[name] = lambda a, b, config=config: mm.matmul_persistent(a, b, config, tma_store=tma_store)
    return out


def _triton_configs() -> dict[str, Launch]:
    def launch(a: Any, b: Any) -> Any:
        from benchmarks import triton_peers  # triton only where the GPU is

        return triton_peers.matmul(a, b)

    return {"autotuned": launch}


# Triton's TMA persistent matmul configs: (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps, Triton's warp_specialize).
TRITON_TMA_CONFIGS = [(128, 256, 64, 3, 8, False), (128, 256, 64, 4, 8, False), (128, 128, 64, 4, 8, False),
                      (128, 256, 64, 3, 8, True), (128, 128, 64, 4, 4, True)]


def _triton_tma_configs() -> dict[str, Launch]:
    def launch(a: Any, b: Any, config: tuple) -> Any:
        from benchmarks import triton_peers

        return triton_peers.matmul_tma_persistent(a, b, config)

    out: dict[str, Launch] = {}
    for config in TRITON_TMA_CONFIGS:
        bm, bn, bk, stages, warps, ws = config
        out[f"{bm}x{bn}x{bk} w{warps} s{stages}{' ws' if ws else ''}"] = (
            lambda a, b, config=config: launch(a, b, config))
    return out


VARIANTS = [
    Variant("cp.async-ring", "matmul.py, cp.async ring + in-place wgmma (today's default)", _ring_configs),
    Variant("tma-unpipelined", "matmul_tma.py, one TMA box per operand per K step, no ring", _tma_unpipelined_configs),
    Variant("tma-ring", "matmul.py matmul_tma_ring: the same ring filled by TMA, one mbarrier per slot",
            _tma_ring_configs),
    Variant("tma-ws", "matmul.py matmul_tma_ws: the TMA ring warp-specialized (producer warpgroup + consumers)",
            _tma_ws_configs),
    Variant("tma-ws-paired", "matmul_tma_ws(paired_a=True): A in rank-4 boxes of two row groups",
            lambda: _tma_ws_configs(paired_a=True)),
    Variant("persistent", "matmul.py matmul_persistent: explicit mt.warp_specialize, persistent over C tiles",
            _persistent_configs),
    Variant("persistent-tma-store", "matmul_persistent(tma_store=True): C by TMA stores of [BLOCK_M, 64] boxes",
            lambda: _persistent_configs(tma_store=True)),
    Variant("triton", "the peer: Triton 3.6's autotuned matmul (benchmarks/triton_peers.py)", _triton_configs),
    Variant("triton-tma", "the peer: Triton's TMA persistent matmul, per config", _triton_tma_configs),
]


def relative_error(c: Any, ref: Any) -> float:
    return ((c.double() - ref).norm() / ref.norm()).item()


def time_checked(launch: Launch, a: Any, b: Any, ref: Any) -> tuple[float | None, str]:
    """(microseconds, note): None and the reason when the result is wrong or the launch fails."""
    import torch

    from benchmarks.harness import do_bench

    try:
        err = relative_error(launch(a, b), ref)
        torch.cuda.synchronize()
    except Exception as e:  # one broken config must not hide the others
        return None, f"failed: {type(e).__name__}: {str(e)[:160]}"
    if not err <= REL_TOL:
        return None, f"wrong: relative error {err:.3g} > {REL_TOL}"
    return do_bench(lambda: launch(a, b)) * 1e3, f"rel err {err:.1e}"


def cublas(a: Any, b: Any) -> Any:
    return a @ b


def steady_state(seconds: float, a: Any, b: Any) -> None:
    """Run cuBLAS for `seconds` first: a cold H200 boosts, and under sustained GEMM load its clocks settle lower
    (cuBLAS at 8192^3: 1494 us in the first timing of the 2026-11-30 01:08 run, about 1610 us in every paired
    timing after it). Timing both sides in the settled state compares them under the load a serving GPU sees."""
    import time

    import torch

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            cublas(a, b)
        torch.cuda.synchronize()


def alternate(launch: Launch, a: Any, b: Any, rounds: int, first: tuple[float, float]) -> tuple[float, float, str]:
    """(our median us, cuBLAS median us, spread note) over `rounds` alternating timings of ours then cuBLAS
    (`first`: the first pair, already timed): drift within the run then hits both sides alike."""
    from statistics import median

    from benchmarks.harness import do_bench

    ours, theirs = [first[0]], [first[1]]
    for _ in range(rounds - 1):
        ours.append(do_bench(lambda: launch(a, b)) * 1e3)
        theirs.append(do_bench(lambda: cublas(a, b)) * 1e3)
    note = (f"{rounds} rounds: ours {min(ours):.0f}-{max(ours):.0f}, cuBLAS {min(theirs):.0f}-{max(theirs):.0f} us"
            if rounds > 1 else "")
    return median(ours), median(theirs), note


def run(shapes: list[str], variants: list[Variant], configs: list[str] | None = None, rounds: int = 1,
        steady_s: float = 0.0) -> list[tuple[str, str, str, float | None, float | None, str]]:
    """Rows (shape, variant, config, us, torch us, note), torch us timed right after each row's own timing:
    torch on every shape first, then variant by variant in
    VARIANTS order (the TMA variants last: a fault loses the process's CUDA context, and with it every later row,
    which then reports the error instead of a time). configs: only the configs whose name contains one of these
    strings; rounds > 1: ours and cuBLAS alternated that many times, medians of each (`alternate`); steady_s:
    seconds of cuBLAS before any timing (`steady_state`)."""
    import torch

    from benchmarks.harness import log

    problems, torch_us, rows = {}, {}, []
    for shape in shapes:
        m, n, k = SHAPES[shape]
        gen = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)
        a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn(k, n, device="cuda", generator=gen).to(torch.bfloat16)
        problems[shape] = (a, b, a.double() @ b.double())
        if steady_s > 0 and len(problems) == 1:
            log(f"gemm_ab: {steady_s:.0f} s of cuBLAS first (steady clocks)")
            steady_state(steady_s, a, b)
        torch_us[shape], note = time_checked(cublas, *problems[shape])
        rows.append((shape, "torch", "cuBLAS", torch_us[shape], torch_us[shape], note))
    for variant in variants:
        for config, launch in variant.configs().items():
            if configs and not any(c in config for c in configs):
                continue
            for shape in shapes:
                log(f"gemm_ab: {shape} {variant.name} {config}")
                us, note = time_checked(launch, *problems[shape])
                # cuBLAS again right after: the ratio then compares two neighbours in time (the H200's clocks and
                # temperature drift over a run; cuBLAS moved 771 -> 792 TFLOP/s between runs on 2026-11-29)
                paired, _ = time_checked(cublas, *problems[shape]) if us is not None else (None, "")
                if us is not None and paired is not None and rounds > 1:
                    us, paired, spread = alternate(launch, *problems[shape][:2], rounds, (us, paired))
                    note = f"{note}; {spread}"
                rows.append((shape, variant.name, config, us, paired or torch_us[shape], note))
    order = {shape: i for i, shape in enumerate(shapes)}
    return sorted(rows, key=lambda r: order[r[0]])  # stable: per shape, torch then the variants in order


def format_table(rows: list[tuple[str, str, str, float | None, float | None, str]]) -> str:
    header = ("shape", "variant", "config", "us", "TFLOP/s", "% cuBLAS", "best", "note")
    best: dict[tuple[str, str], float] = {}
    for shape, variant, _, us, _, _ in rows:
        if us is not None:
            best[(shape, variant)] = min(us, best.get((shape, variant), us))
    lines = [header]
    for shape, variant, config, us, torch_us, note in rows:
        m, n, k = SHAPES[shape]
        tflops = f"{2.0 * m * n * k / (us * 1e-6) / 1e12:.1f}" if us else "-"
        pct = f"{100.0 * torch_us / us:.1f}" if us and torch_us else "-"
        star = "*" if us is not None and best.get((shape, variant)) == us and variant != "torch" else ""
        lines.append((shape, variant, config, f"{us:.1f}" if us else "-", tflops, pct, star, note))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--variants", nargs="+", default=[v.name for v in VARIANTS],
                        choices=[v.name for v in VARIANTS])
    parser.add_argument("--configs", nargs="+", default=None,
                        help="only the configs whose name contains one of these strings, '_' for a space "
                             "(e.g. 128x256x64_w8_s3)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate ours and cuBLAS this many times per row, report the medians")
    parser.add_argument("--steady", type=float, default=0.0, metavar="SECONDS",
                        help="run cuBLAS this long before timing, so the clocks settle under load")
    parser.add_argument("--list", action="store_true", help="print the variants and their configs, then exit")
    args = parser.parse_args(argv)
    args.configs = [c.replace("_", " ") for c in args.configs] if args.configs else None
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    chosen = [v for v in VARIANTS if v.name in args.variants]
    if args.list:
        for v in chosen:
            print(f"{v.name}: {v.doc}")
            for config in v.configs():
                if not args.configs or any(c in config for c in args.configs):
                    print(f"    {config}")
        return 0
    print(format_table(run(args.shapes, chosen, args.configs, args.rounds, args.steady)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
