"""A/B timing of the WarpDecode mt.dot variants (minitriton.kernels.warp_decode.DOT_VARIANTS) on the GPU, next to
triton_kernels when it is there, at K3 shapes (D 3584, I 3072, E 896, top-16), in one table.

    python tools/warp_decode_ab.py [--batches 1,4,16,64] [--variants v3,v4_fold,...] [--graph] [--no-triton]
    python tools/warp_decode_ab.py --sass        # no GPU: SASS per weight and registers of each variant's K loop
    python tools/warp_decode_ab.py --sass --variants v5_p2_lb_h16_u3c,v6_u3c [--batches 16,64]
                                                 # the same for named variants, compiled as moe_decode launches them
    python tools/warp_decode_ab.py --graph --variants v6_u3c,v7_u3c,v7_u3c_x_cg_vpf   # CUDA-graph replays

Per batch it first checks every variant against dequantize-then-matmul (bf16 torch math on the exact weights:
rel_err <= CHECK_BOUND) and against the v3 variant (fp32 outputs: rel_err <= AGREE_BOUND); a variant that fails is
not timed. Then it times each one (benchmarks/harness.do_bench, L2 flushed) and prints one table: microseconds,
the fraction of the copy-bandwidth floor (unique routed MXFP4 bytes / measured copy bandwidth) and the speed-up
over triton_kernels (found as benchmarks/bench_warp_decode.py finds it: $TRITON_KERNELS_PATH, <repo>/triton_kernels
or <repo>/third_party). Targets (issue 7): floor/time >= 0.8 at B = 1 and 4; triton_kernels/time >= 1.2 at 16, 64.

--sass compiles each variant's K3 AOT specialization (ptxas on PATH) and counts the SASS of its innermost loop
with nvdisasm ($NVDISASM, or on PATH): instructions per weight (an mt.dot step is 128 weights per thread),
registers, spills. With --variants it compiles those variants instead, with the constexprs moe_decode gives them
at K3 (warp_decode.gate_up_launch / down_launch; the down kernel at each batch's BT), and reports the K loop per
step (an unrolled loop holds 3 steps).

Variants of the v6 family (warp_decode.V6_VARIANTS) read experts prepared with layout "v6": the timing prepares
that copy of the layer too (another 15.7 GB on the GPU) when one is asked for. The v7 family (V7_VARIANTS) reads
v7 experts, made from the v6 copy by wd.with_scale_words (its blocks and scales shared, +1/16 for the scale
words); its routing is route_sort_kernel (B > 1) or none (B = 1), timed as part of the call like the others'.
--graph times CUDA-graph replays (no host launch overhead: what a serving loop sees).
"""
from __future__ import annotations

import argparse
import dataclasses
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_warp_decode as bench  # noqa: E402
import harness  # noqa: E402

from minitriton.kernels import warp_decode as wd  # noqa: E402

CHECK_BOUND = 2e-2  # against dequantize-then-matmul, which rounds h and the products to bf16
AGREE_BOUND = 1e-4  # fp32 outputs of two variants: the same math up to the summation order and bf16 parts of h
AGREE_BOUND_H16 = 5e-3  # the opt-in h16 variants round h to one bf16 part (2**-9 relative per element)
WEIGHTS_PER_STEP = 128  # an mt.dot K step: 16 rows x 256 weights per warp = 128 per thread


# ------------------------------------------------------------------------------------------ GPU timing


def variant_call(experts: dict[str, tuple[wd.PreparedExperts, wd.PreparedExperts]], variant: str,
                 x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
                 ) -> Callable[[], torch.Tensor]:
    """moe_decode with the mt.dot variant on the experts of its layout (experts: layout -> (w13, w2)); "NAME@S13:S2"
    forces the item splits of the two kernels (e.g. v5_p2@6:10, the splits before the wave model) to A/B the split
    choice."""
    name, _, forced = variant.partition("@")
    w13, w2 = experts[wd.variant_layout(name)]
    if not forced:
        return lambda: wd.moe_decode(x, ids, weights, w13, w2, out_dtype=out_dtype, use_dot=True, variant=name)
    s13, s2 = (int(s) for s in forced.split(":"))

    def call() -> torch.Tensor:
        routing, _ = wd.plan_routing(ids, weights, use_dot=True)
        c13 = dataclasses.replace(wd.pick_config(w13.row_blocks, routing.n_pairs, True, name), splits=s13)
        c2 = dataclasses.replace(wd.pick_config(w2.row_blocks, routing.n_pairs, True, name, "down"), splits=s2)
        return wd.down(wd.gate_up(x, routing, w13, c13, parts=True), routing, w2, out_dtype, c2)

    return call


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def time_call(fn: Callable[[], Any], use_graph: bool) -> float:
    """Microseconds per call (CUDA-graph replay when asked and capturable)."""
    timed = fn
    if use_graph:
        try:
            timed = bench.graphed(fn)
        except Exception as e:  # noqa: BLE001 - fall back to eager, say so
            harness.log(f"graph capture failed ({type(e).__name__}: {e}); timing eagerly")
    return harness.do_bench(timed) * 1e3


def kernel_split(fn: Callable[[], Any]) -> str:
    """Each CUDA kernel's GPU time in one call (torch.profiler, no L2 flush: at K3 the weights exceed L2 anyway)."""
    rows = harness.kernel_times(fn)
    parts = ", ".join(f"{name.split('(')[0][:28]} {t:.1f}" for name, t in rows[:6])
    return f"{sum(t for _, t in rows):.1f} us of kernels = {parts}"


def run_ab(batches: tuple[int, ...], variants: list[str], use_graph: bool, with_triton: bool,
           split_kernels: bool = False) -> str:
    shape = bench.SHAPE
    copy_bw = harness.copy_bandwidth()
    layer = bench.make_layer(shape)
    layouts = {"v5"} | {wd.variant_layout(v.partition("@")[0]) for v in variants}  # each variant reads one
    if "v7" in layouts:  # v7 experts share v6's blocks and scales (with_scale_words adds 1/16)
        layouts.add("v6")
    experts = {layout: (wd.prepare_experts(layer.w13_blocks, layer.w13_scales, layout=layout),
                        wd.prepare_experts(layer.w2_blocks, layer.w2_scales, layout=layout))
               for layout in sorted(layouts - {"v7"})}
    if "v7" in layouts:
        experts["v7"] = tuple(wd.with_scale_words(w) for w in experts["v6"])
    w13, w2 = experts["v5"]
    harness.log(f"bias foldable: w13 {w13.folds_bias}, w2 {w2.folds_bias}")
    triton_make = None
    if with_triton:
        try:
            triton_make = bench.triton_kernels_moe(layer)
        except Exception as e:  # noqa: BLE001 - a peer that is not installed is a note, not a failure
            harness.log(f"triton_kernels skipped ({type(e).__name__}: {e})")
    reference = bench.dequant_matmul(layer)
    rows = []
    for b in batches:
        x, ids, weights = bench.make_batch(shape, b)
        floor_us = bench.unique_weight_bytes(ids, shape) / copy_bw * 1e6
        check = reference(x, ids, weights)().float()
        base = variant_call(experts, "v3", x, ids, weights, torch.float32)()
        row: dict[str, Any] = {"B": b, "floor": floor_us}
        for v in variants:
            out32 = variant_call(experts, v, x, ids, weights, torch.float32)()
            err_ref, err_v3 = rel_err(out32, check), rel_err(out32, base)
            agree = AGREE_BOUND_H16 if v.partition("@")[0] in wd.H16_VARIANTS else AGREE_BOUND
            if not (err_ref <= CHECK_BOUND and err_v3 <= agree):
                row[v] = f"FAIL ({err_ref:.1e} / {err_v3:.1e})"
                continue
            row[v] = time_call(variant_call(experts, v, x, ids, weights), use_graph)
            if split_kernels:
                harness.log(f"B={b} {v}: {kernel_split(variant_call(experts, v, x, ids, weights))}")
        if triton_make is not None:
            try:
                fn = triton_make(x, ids, weights)
                row["triton_kernels"] = time_call(fn, use_graph)
                row["tk_err"] = rel_err(fn().float(), check)
            except Exception as e:  # noqa: BLE001
                row["triton_kernels"] = f"error ({type(e).__name__})"
        rows.append(row)
    return format_table(rows, variants, copy_bw)


def format_table(rows: list[dict[str, Any]], variants: list[str], copy_bw: float) -> str:
    """One line per batch: floor, each variant (us, % of the copy floor), triton_kernels, best speed-up."""
    head = ["B", "floor us"] + [f"{v} us (floor%)" for v in variants] + ["triton_kernels us", "best", "tk/best"]
    lines = [f"WarpDecode mt.dot variants, K3 {bench.SHAPE.describe()}, copy bandwidth {copy_bw / 1e12:.2f} TB/s",
             " | ".join(head)]
    for row in rows:
        cells = [str(row["B"]), f"{row['floor']:.1f}"]
        timed = {}
        for v in variants:
            t = row.get(v)
            if isinstance(t, float):
                timed[v] = t
                cells.append(f"{t:.1f} ({100 * row['floor'] / t:.0f}%)")
            else:
                cells.append(str(t))
        tk = row.get("triton_kernels")
        cells.append(f"{tk:.1f}" if isinstance(tk, float) else str(tk or "-"))
        best = min(timed, key=timed.get) if timed else None
        cells.append(best or "-")
        cells.append(f"{tk / timed[best]:.2f}x" if best and isinstance(tk, float) else "-")
        lines.append(" | ".join(cells))
    lines.append(f"checks: rel_err vs dequant_matmul <= {CHECK_BOUND}, vs v3 (fp32) <= {AGREE_BOUND} "
                 f"({AGREE_BOUND_H16} for the h16 variants); "
                 "targets: floor% >= 80 at B = 1, 4; tk/best >= 1.2x at B = 16, 64")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ SASS (no GPU)


def nvdisasm() -> str | None:
    return os.environ.get("NVDISASM") or shutil.which("nvdisasm")


def k_loop_counts(cubin: Path, tool: str) -> tuple[int, collections.Counter]:
    """Opcode counts of the innermost loop holding the mma (HMMA) of a cubin: the K loop."""
    text = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout.splitlines()
    labels = {m.group(1): i for i, line in enumerate(text) if (m := re.match(r"^(\.L_x_\d+):", line))}
    best: list[str] | None = None
    for i, line in enumerate(text):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = [x for x in text[labels[m.group(1)]:i + 1] if re.search(r"/\*[0-9a-f]{4}\*/", x)]
            if any("HMMA" in x for x in body) and (best is None or len(body) < len(best)):
                best = body
    counts: collections.Counter = collections.Counter()
    for x in best or []:
        op = re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", x).split()[0].split(".")[0]
        counts[op] += 1
    return sum(counts.values()), counts


def sass_report() -> str:
    """Compile warp_decode's AOT specializations and report each mt.dot variant's K loop."""
    tool = nvdisasm()
    if tool is None:
        return "nvdisasm not found (set NVDISASM or put it on PATH)"
    out = Path(tempfile.mkdtemp(prefix="warp_decode_sass_"))
    subprocess.run([sys.executable, "-m", "minitriton.cli", "compile", str(REPO / "kernels_src" / "warp_decode.py"),
                    "-o", str(out), "--emit", "cubin"], check=True, capture_output=True)
    lines = ["kernel | variant | K-loop SASS | per weight | registers | spill stores / loads (B) | top opcodes"]
    for meta_path in sorted(out.glob("*USE_DOTTrue*.json")):
        meta = json.loads(meta_path.read_text())
        n, counts = k_loop_counts(meta_path.with_suffix(".cubin"), tool)
        top = ", ".join(f"{k} {v}" for k, v in counts.most_common(6))
        lines.append(f"{meta['name']} | {variant_name(meta['constexprs'])} | {n} | {n / WEIGHTS_PER_STEP:.2f} | "
                     f"{meta.get('registers')} | {meta.get('spill_stores')} / {meta.get('spill_loads')} | {top}")
    return "\n".join(lines)


def k3_experts(kind: str, layout: str) -> wd.PreparedExperts:
    """A stand-in for K3 experts of one kernel (one expert of uninitialized bytes, scales foldable): what the launch
    constexprs depend on (row length, blocks, layout), without preparing 15.7 GB."""
    rows, k = ((2 * bench.SHAPE.intermediate, bench.SHAPE.hidden) if kind == "gate_up"
               else (bench.SHAPE.hidden, bench.SHAPE.intermediate))
    nb = k // 32
    words = None
    if layout == "v7":
        tiles, steps = -(-wd.v7_half(rows) // wd.V7_GROUP), -(-nb // wd.V7_STEP)
        words = torch.empty((1, tiles, steps, 32), dtype=torch.int32)
    return wd.PreparedExperts(torch.empty((1, rows, nb * 16), dtype=torch.uint8),
                              torch.empty((1, rows, nb), dtype=torch.uint8), k, 127, layout, words)


def v7_signature(kind: str, batch: int) -> str:
    """AOT signature of the v7 kernels as moe_decode launches them: int32 pairs (route_sort_kernel's; at B = 1 the
    ids stand in), int32 weight and scale words, bf16 h, fp32 per-pair contributions."""
    tables = "ids_ptr:*i32:16,pairs_ptr:*i32:16,first_ptr:*i32:16,n_items_ptr:*i32:16,wq_ptr:*i32:16,sw_ptr:*i32:16"
    if kind == "gate_up":
        return (f"x_ptr:*bf16:16,{tables},h_ptr:*bf16:16,n_pairs:i32:16,topk:i32:16,D:i32:16,I:i32:16,"
                "row_blocks:i32:16")
    return (f"h_ptr:*bf16:16,{tables.replace('pairs_ptr', 'wts_ptr:*fp32:16,pairs_ptr')},part_ptr:*fp32:16,"
            f"out_ptr:*bf16:16,flag_ptr:*{'i32' if batch == 1 else 'fp32'}:16,"
            f"n_pairs:i32:16,topk:i32:16,batch:i32{':16' if batch % 16 == 0 else ''},D:i32:16,I:i32:16,"
            "row_blocks:i32:16")


def compile_variant(kind: str, variant: str, batch: int) -> Any:
    """The gate_up or down kernel of `variant` compiled (cubin) with the constexprs moe_decode launches it with at
    K3 and this batch (mt.dot path: items of 8 pairs, h as bf16 parts or one bf16 part as the variant says)."""
    w = k3_experts(kind, wd.variant_layout(variant))
    config = wd.pick_config(w.row_blocks, batch * bench.SHAPE.topk, True, variant, kind)
    h_bf16 = bool(wd.DOT_VARIANTS[variant][0].get("h_bf16"))
    if config.layout == "v7":  # B = 1: items are the pairs (DEDUP off); else route_sort_kernel's tables
        dedup = batch > 1
        launch = (wd.gate_up_launch(w, config, 8, dedup, parts=False) if kind == "gate_up"
                  else wd.down_launch(w, config, 8, dedup, batch, False, True))
        kernel, meta = launch
        if kind == "gate_up" and batch == 1:  # the wave model gives B = 1 gate_up one item a program: no XITEM
            meta["XITEM"] = False
        num_warps = meta.pop("num_warps")
        return kernel.aot_spec(v7_signature(kind, batch), num_warps, None, None, **meta).compile(target="cubin")
    if kind == "gate_up":
        kernel, meta = wd.gate_up_launch(w, config, 8, True, parts=True)
    else:
        kernel, meta = wd.down_launch(w, config, 8, True, batch, parts=not h_bf16, h_bf16=h_bf16)
    num_warps = meta.pop("num_warps")
    signature = wd._signature(kind, "i64", "bf16", "i32" if config.words else "u8")
    return kernel.aot_spec(signature, num_warps, None, None, **meta).compile(target="cubin")


def variants_sass_report(variants: list[str], batches: tuple[int, ...]) -> str:
    """SASS of the K loop per step (the loop body over the steps it holds: 3 when unrolled), registers and spills of
    each named variant's two kernels as moe_decode launches them (down at each batch's BT)."""
    tool = nvdisasm()
    if tool is None:
        return "nvdisasm not found (set NVDISASM or put it on PATH)"
    out = Path(tempfile.mkdtemp(prefix="warp_decode_sass_"))
    lines = ["kernel | variant | BT | K-loop SASS per step | per weight | registers | spill stores / loads (B) | "
             "per step: top opcodes"]
    for v in variants:
        steps = 3 if wd.DOT_VARIANTS[v][0].get("unroll") else 1
        gate_up_batches, down_batches = (batches[0],), batches
        if wd.variant_layout(v) == "v7":  # B = 1 (items = pairs, no tables) and B > 1 compile differently, and
            gate_up_batches = down_batches = tuple(dict.fromkeys(min(b, 2) for b in batches))  # nothing else does
        for kind, bts in (("gate_up", gate_up_batches), ("down", down_batches)):
            for b in bts:
                compiled = compile_variant(kind, v, b)
                cubin = out / f"{kind}_{v}_{b}.cubin"
                cubin.write_bytes(compiled.cubin)
                n, counts = k_loop_counts(cubin, tool)
                steps_here = steps if kind == "gate_up" or wd.DOT_VARIANTS[v][1].get("unroll") else 1
                meta = compiled.metadata
                top = ", ".join(f"{k} {c / steps_here:g}" for k, c in counts.most_common(8))
                bt = "-" if kind == "gate_up" else str(1 << (b - 1).bit_length())
                if wd.variant_layout(v) == "v7":  # no BT accumulator: the column says the routing form
                    bt = "B=1" if b == 1 else "B>1"
                lines.append(f"{kind} | {v} | {bt} | {n / steps_here:.1f} | {n / steps_here / WEIGHTS_PER_STEP:.2f} | "
                             f"{meta.get('registers')} | {meta.get('spill_stores')} / {meta.get('spill_loads')} | "
                             f"{top}")
    return "\n".join(lines)


def variant_name(constexprs: dict[str, str]) -> str:
    """The DOT_VARIANTS key an AOT specialization's constexprs correspond to."""
    if constexprs.get("PAIRS") != "True":
        return "v3"
    if constexprs.get("WORD_ORDER") == "True":
        return "v5_p2" if constexprs.get("PREFETCH") == "2" else "v5"
    if constexprs.get("WORDS") == "True":
        return "v4_words_p2" if constexprs.get("PREFETCH") == "2" else "v4_words"
    return "v4_fold" if constexprs.get("FOLD_BIAS") == "True" else "v4"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--variants", default=",".join(wd.DOT_VARIANTS), help=f"of {', '.join(wd.DOT_VARIANTS)}")
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="also each kernel's GPU time (torch.profiler)")
    parser.add_argument("--sass", action="store_true", help="SASS per weight of each variant (no GPU needed)")
    args = parser.parse_args(argv)
    if args.sass:
        named = args.variants != parser.get_default("variants")
        print(variants_sass_report([v for v in args.variants.split(",") if v],
                                   tuple(int(b) for b in args.batches.split(",")))
              if named else sass_report())
        return 0
    if not torch.cuda.is_available():
        sys.stderr.write("the A/B timing needs a CUDA GPU (--sass works without)\n")
        return 1
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v.partition("@")[0] not in wd.DOT_VARIANTS]
    if unknown:
        sys.stderr.write(f"unknown variants {unknown}; known: {list(wd.DOT_VARIANTS)}\n")
        return 1
    print(run_ab(tuple(int(b) for b in args.batches.split(",")), variants, args.graph, not args.no_triton,
                 args.kernels),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
