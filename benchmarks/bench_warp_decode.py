"""Benchmark: WarpDecode MXFP4 MoE decode (minitriton.kernels.warp_decode) against triton_kernels, bf16 and
dequantize-then-matmul, at Kimi-K3 shapes.

    python benchmarks/bench_warp_decode.py [--batches 1,4,16,64] [--experts 896] [--graph] [--skip bf16,...]
                                           [--no-save]

Shape: D = 3584 (latent hidden), I = 3072, E = 896 experts, top-16, one MoE layer of random MXFP4 weights
(15.7 GB: far larger than the 60 MB L2), uniform random routing, B tokens of bf16 activations.
Rows (B = 1, 4, 16, 64): ours = moe_decode from topk ids (routing prep + the two kernels), in microseconds.
Peers, measured in the same run:
  ours_kernels    our two kernels alone (routing prepared outside the timing)
  ours_cuda_cores moe_decode with the CUDA-core inner products forced at every B
  ours_dot        moe_decode with the mt.dot inner products forced at every B (tensor cores once the codegen lowers
                  mt.dot to mma.sync; until then mt.dot is FMA loops through shared memory)
  triton_kernels  OpenAI triton_kernels matmul_ogs with the Hopper MXFP4 value/scale layouts (v3.5.1 API, as vendored
                  in vLLM 0.24.0): routing from logits + gate/up matmul + torch silu*up + down matmul with the
                  scatter and gate scales. Imported from a carried `triton_kernels/` folder (repository root, or the
                  folder $TRITON_KERNELS_PATH points at); skipped when absent or of another API generation.
  torch_bf16      experts in bf16 (4x the bytes; random values, not our weights), per-expert torch matmuls on the
                  routed tokens
  dequant_matmul  the routed experts dequantized to bf16 with torch ops (8 at a time), then torch matmuls
floor = unique MXFP4 weight + scale bytes the batch routes to / measured copy bandwidth (read + write), so
floor/ours is the fraction of copy bandwidth; the notes give the effective bandwidth (those bytes / time) per method.
Targets (issue 7): floor/ours >= 0.8 at B = 1 and 4; triton_kernels/ours >= 1.2 at B = 16 and 64.
--graph captures every method in a CUDA graph first (where capture works) so host overhead is left out.
The mt.dot variants (warp_decode.DOT_VARIANTS: ours / ours_dot use the default one) are timed side by side by
tools/warp_decode_ab.py.

Importable without a GPU or triton_kernels (the tests import it); both are needed only to run.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

try:
    from benchmarks import harness
except ImportError:  # run as a script: benchmarks/ is not a package on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
BATCHES = (1, 4, 16, 64)
MX_BLOCK = 32


@dataclass(frozen=True)
class MoEShape:
    hidden: int = 3584  # D: the latent width the routed experts work in
    intermediate: int = 3072  # I
    experts: int = 896
    topk: int = 16

    @property
    def expert_bytes(self) -> int:
        """MXFP4 bytes of one expert: 3 * D * I weights at 4 bits plus one scale byte per 32."""
        weights = 2 * self.intermediate * self.hidden + self.hidden * self.intermediate
        return weights // 2 + weights // MX_BLOCK

    def describe(self) -> str:
        return f"D{self.hidden} I{self.intermediate} E{self.experts} k{self.topk}"


SHAPE = MoEShape()


def unique_weight_bytes(topk_ids: torch.Tensor, shape: MoEShape) -> int:
    """Bytes a batch must read at least: every routed expert's weights and scales once."""
    return int(torch.unique(topk_ids).numel()) * shape.expert_bytes


# ------------------------------------------------------------------------------------------ problem


@dataclass
class Layer:
    """One MoE layer of random MXFP4 experts on the GPU, natural layout (HF / compressed-tensors)."""

    shape: MoEShape
    w13_blocks: torch.Tensor  # uint8 [E, 2I, D/2]
    w13_scales: torch.Tensor  # uint8 [E, 2I, D/32]
    w2_blocks: torch.Tensor  # uint8 [E, D, I/2]
    w2_scales: torch.Tensor  # uint8 [E, D, I/32]


def make_layer(shape: MoEShape, device: str = "cuda", seed: int = 0) -> Layer:
    """Uniform random bytes are uniform random E2M1 codes; scale bytes 118..127 keep values O(0.01 .. 1)."""
    torch.manual_seed(seed)
    E, D, I = shape.experts, shape.hidden, shape.intermediate

    def blocks(n: int, k: int) -> torch.Tensor:
        return torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device=device)

    def scales(n: int, k: int) -> torch.Tensor:
        return torch.randint(118, 128, (E, n, k // MX_BLOCK), dtype=torch.uint8, device=device)

    return Layer(shape, blocks(2 * I, D), scales(2 * I, D), blocks(D, I), scales(D, I))


def make_batch(shape: MoEShape, batch: int, device: str = "cuda", seed: int = 1
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x bf16 [B, D], uniform random top-k ids int32 [B, k] (distinct per token), softmax weights fp32 [B, k]."""
    gen = torch.Generator(device=device).manual_seed(seed + batch)
    x = torch.randn(batch, shape.hidden, generator=gen, device=device).to(torch.bfloat16)
    ids = torch.rand(batch, shape.experts, generator=gen, device=device).topk(shape.topk, dim=1).indices
    weights = torch.softmax(torch.randn(batch, shape.topk, generator=gen, device=device), dim=1)
    return x, ids.to(torch.int32), weights


# ------------------------------------------------------------------------------------------ methods


def ours(layer: Layer, use_dot: bool | None = None
         ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Callable[[], torch.Tensor]]:
    """moe_decode on prepared weights: returns make(x, ids, weights) -> a no-argument call. use_dot None is the
    default choice (mt.dot from B = DOT_MIN_BATCH), True / False force one inner-product path (the CUDA-core path
    reads the v5 layout; otherwise prepare_experts picks it, "auto")."""
    from minitriton.kernels import warp_decode as wd

    layout = "v5" if use_dot is False else "auto"
    w13 = wd.prepare_experts(layer.w13_blocks, layer.w13_scales, layout=layout)
    w2 = wd.prepare_experts(layer.w2_blocks, layer.w2_scales, layout=layout)

    def make(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Callable[[], torch.Tensor]:
        return lambda: wd.moe_decode(x, ids, weights, w13, w2, use_dot=use_dot)

    return make


def ours_kernels(layer: Layer) -> Callable[..., Callable[[], torch.Tensor]]:
    """Our two kernels with the routing (work items) prepared outside the timed call."""
    from minitriton.kernels import warp_decode as wd

    w13 = wd.prepare_experts(layer.w13_blocks, layer.w13_scales)
    w2 = wd.prepare_experts(layer.w2_blocks, layer.w2_scales)

    def make(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Callable[[], torch.Tensor]:
        variant = wd.default_variant(ids.shape[0], "bf16", w13.layout)  # what moe_decode runs on these experts
        method = wd.DOT_VARIANTS[variant][0].get("routing", "torch")  # and its routing (v7: the DSL kernel)
        routing, use_dot = wd.plan_routing(ids, weights, method=method, num_experts=w13.num_experts)
        c13 = wd.pick_config(w13.row_blocks, routing.n_pairs, use_dot, variant)
        c2 = wd.pick_config(w2.row_blocks, routing.n_pairs, use_dot, variant, "down")
        return lambda: wd.down(wd.gate_up(x, routing, w13, c13, parts=use_dot), routing, w2, torch.bfloat16, c2)

    return make


def e2m1_byte_table(device: torch.device | str) -> torch.Tensor:
    """bf16 [256, 2]: the two values of a packed byte (low nibble = even element)."""
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    byte = torch.arange(256)
    return torch.stack([values[byte & 15], values[byte >> 4]], dim=1).to(torch.bfloat16).to(device)


def dequantize_bf16(blocks: torch.Tensor, scales: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """[..., N, K/2] + [..., N, K/32] -> bf16 [..., N, K] with torch ops (scale bytes < 255 assumed)."""
    v = table[blocks.int()].reshape(*blocks.shape[:-1], -1, MX_BLOCK)
    s = torch.exp2(scales.float() - 127).to(torch.bfloat16)
    return (v * s[..., None]).reshape(*blocks.shape[:-1], -1)


def _routed_experts(ids: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(expert, token indices, slot-major pair indices) per distinct expert; computed once, outside timing."""
    k = ids.shape[1]
    flat = ids.reshape(-1).long()
    out = []
    for e in torch.unique(flat).tolist():
        pairs = (flat == e).nonzero().reshape(-1)
        out.append((e, pairs // k, pairs))
    return out


def _torch_moe(x: torch.Tensor, weights: torch.Tensor, routed, w13_of: Callable[[list[int]], Any],
               w2_of: Callable[[list[int]], Any], chunk: int) -> torch.Tensor:
    """Per distinct expert: gate/up matmul on its tokens, silu * up, down matmul, weighted scatter-add."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_w = weights.reshape(-1)
    for c0 in range(0, len(routed), chunk):
        part = routed[c0:c0 + chunk]
        w13s, w2s = w13_of([e for e, _, _ in part]), w2_of([e for e, _, _ in part])
        for i, (_, tokens, pairs) in enumerate(part):
            gu = x[tokens] @ w13s[i].T
            half = gu.shape[1] // 2  # rows [0, I) gate, [I, 2I) up
            h = torch.nn.functional.silu(gu[:, :half]) * gu[:, half:]
            out.index_add_(0, tokens, (h @ w2s[i].T).float() * flat_w[pairs, None])
    return out.to(torch.bfloat16)


def dequant_matmul(layer: Layer) -> Callable[..., Callable[[], torch.Tensor]]:
    table = e2m1_byte_table(layer.w13_blocks.device)

    def make(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Callable[[], torch.Tensor]:
        routed = _routed_experts(ids)

        def w13_of(es: list[int]) -> torch.Tensor:
            idx = torch.tensor(es, device=x.device)
            return dequantize_bf16(layer.w13_blocks[idx], layer.w13_scales[idx], table)

        def w2_of(es: list[int]) -> torch.Tensor:
            idx = torch.tensor(es, device=x.device)
            return dequantize_bf16(layer.w2_blocks[idx], layer.w2_scales[idx], table)

        return lambda: _torch_moe(x, weights, routed, w13_of, w2_of, chunk=8)

    return make


def torch_bf16(layer: Layer) -> Callable[..., Callable[[], torch.Tensor]]:
    """bf16 experts (random values of the same magnitude: the timing does not depend on them)."""
    s, dev = layer.shape, layer.w13_blocks.device
    w13 = torch.empty(s.experts, 2 * s.intermediate, s.hidden, dtype=torch.bfloat16, device=dev).uniform_(-.1, .1)
    w2 = torch.empty(s.experts, s.hidden, s.intermediate, dtype=torch.bfloat16, device=dev).uniform_(-.1, .1)

    def make(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Callable[[], torch.Tensor]:
        routed = _routed_experts(ids)
        return lambda: _torch_moe(x, weights, routed, lambda es: [w13[e] for e in es], lambda es: [w2[e] for e in es],
                                  chunk=max(1, len(routed)))

    return make


def import_triton_kernels() -> Any:
    """The triton_kernels package from a carried folder: $TRITON_KERNELS_PATH (the folder holding triton_kernels/,
    or triton_kernels/ itself) or the repository root. Raises ImportError when it is not there."""
    candidates = [os.environ.get("TRITON_KERNELS_PATH", ""), str(REPO), str(REPO / "third_party")]
    for c in candidates:
        if not c:
            continue
        p = Path(c)
        if p.name == "triton_kernels":
            p = p.parent
        if (p / "triton_kernels" / "__init__.py").exists() and str(p) not in sys.path:
            sys.path.insert(0, str(p))
    import triton_kernels  # noqa: F401

    return triton_kernels


def triton_kernels_moe(layer: Layer) -> Callable[..., Callable[[], torch.Tensor]]:
    """matmul_ogs (v3.5.1 API) with the Hopper MXFP4 layouts, as vLLM's _swizzle_mxfp4 sets them up."""
    import_triton_kernels()
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig, matmul_ogs
    from triton_kernels.numerics import InFlexData
    from triton_kernels.routing import routing
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout

    opt_flags.update_opt_flags_constraints({"split_k": 1})  # what vLLM sets on SM90

    def class_and_options(made: Any) -> tuple[Any, dict]:  # v3.5.x returns (class, kwargs), later an instance
        return made if isinstance(made, tuple) else (made, {})

    def swizzle(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[Any, Any]:
        value_layout, value_opts = class_and_options(layout.make_default_matmul_mxfp4_w_layout(mx_axis=1))
        scale_layout, scale_opts = class_and_options(
            layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8))
        w = convert_layout(wrap_torch_tensor(blocks.transpose(-2, -1), dtype=FP4), value_layout, **value_opts)
        s = convert_layout(wrap_torch_tensor(scales.transpose(-2, -1)), scale_layout, **scale_opts)
        return w, PrecisionConfig(weight_scale=s, flex_ctx=FlexCtx(rhs_data=InFlexData()))

    w13, pc13 = swizzle(layer.w13_blocks, layer.w13_scales)  # K-major [E, D, 2I] for matmul_ogs
    w2, pc2 = swizzle(layer.w2_blocks, layer.w2_scales)
    s = layer.shape

    def make(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Callable[[], torch.Tensor]:
        # Logits whose top-k are our ids and whose softmax over them is our (normalised) weights.
        logits = torch.full((x.shape[0], s.experts), -1e4, dtype=torch.float32, device=x.device)
        logits.scatter_(1, ids.long(), torch.log(weights / weights.sum(1, keepdim=True)))

        def run() -> torch.Tensor:
            rdata, gather, scatter = routing(logits, s.topk)
            gu = matmul_ogs(x, w13, None, rdata, gather_indx=gather, precision_config=pc13)
            h = torch.nn.functional.silu(gu[..., :s.intermediate]) * gu[..., s.intermediate:]
            return matmul_ogs(h, w2, None, rdata, scatter_indx=scatter, precision_config=pc2,
                              gammas=rdata.gate_scal).reshape(x.shape)

        return run

    return make


METHODS: dict[str, Callable[[Layer], Callable[..., Callable[[], torch.Tensor]]]] = {
    "ours": ours, "ours_kernels": ours_kernels,
    "ours_cuda_cores": lambda layer: ours(layer, use_dot=False), "ours_dot": lambda layer: ours(layer, use_dot=True),
    "triton_kernels": triton_kernels_moe,
    "dequant_matmul": dequant_matmul, "torch_bf16": torch_bf16,
}


# ------------------------------------------------------------------------------------------ running


def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], Any]:
    """fn captured in a CUDA graph (after a warm-up call that compiles everything); replay is the call."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def measure(name: str, layer: Layer, batches: dict[int, tuple], use_graph: bool, notes: dict[str, Any],
            check: dict[int, torch.Tensor]) -> dict[int, float | None]:
    """Milliseconds per call for each batch (None where the method is unavailable or fails)."""
    times: dict[int, float | None] = {b: None for b in batches}
    try:
        make = METHODS[name](layer)
    except Exception as e:  # a peer that cannot be set up (not installed, other API version, out of memory)
        notes[f"{name}_skipped"] = f"{type(e).__name__}: {e}"
        harness.log(f"{name}: skipped ({type(e).__name__}: {e})")
        return times
    for b, (x, ids, weights) in batches.items():
        try:
            fn = make(x, ids, weights)
            out = fn()
            if b in check and name not in ("torch_bf16", "dequant_matmul"):  # every row must do the same work
                ref = check[b].float()
                notes[f"{name}_B{b}_rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()
            timed = fn
            if use_graph:
                try:
                    timed = graphed(fn)
                except Exception as e:
                    notes[f"{name}_B{b}_graph"] = f"eager ({type(e).__name__}: {e})"
            times[b] = harness.do_bench(timed)
        except Exception as e:
            notes[f"{name}_B{b}_error"] = f"{type(e).__name__}: {e}"
            harness.log(f"{name} B={b}: failed ({type(e).__name__}: {e})")
    return times


def run(batches: tuple[int, ...] = BATCHES, shape: MoEShape = SHAPE, use_graph: bool = False,
        skip: tuple[str, ...] = ()) -> harness.Table:
    """The table: one row per batch size, times in microseconds."""
    copy_bw = harness.copy_bandwidth()
    layer = make_layer(shape)
    problems = {b: make_batch(shape, b) for b in batches}
    unique_bytes = {b: unique_weight_bytes(problems[b][1], shape) for b in batches}
    notes: dict[str, Any] = {"copy_bandwidth_TBps": copy_bw / 1e12, "graph": use_graph,
                             "unique_experts": {b: unique_bytes[b] // shape.expert_bytes for b in batches}}
    # The reference result for the correctness cross-check: dequantize-then-matmul (exact weights, bf16 math).
    check: dict[int, torch.Tensor] = {}
    if "dequant_matmul" not in skip:
        make = dequant_matmul(layer)
        check = {b: make(*problems[b])() for b in batches}
    times = {name: measure(name, layer, problems, use_graph, notes, check) for name in METHODS if name not in skip}
    table = harness.Table("warp_decode", f"WarpDecode MXFP4 MoE decode, {shape.describe()}", unit="us",
                          notes=notes)
    for b in batches:
        ms = times.get("ours", {}).get(b)
        if ms is None:
            continue
        peers = {n: (t[b] * 1e3 if t.get(b) is not None else None) for n, t in times.items() if n != "ours"}
        floor_us = unique_bytes[b] / copy_bw * 1e6
        table.add(f"B={b}", shape.describe(), ms * 1e3, peers, floor=floor_us)
        notes[f"B{b}_effective_TBps"] = {n: unique_bytes[b] / (t[b] * 1e-3) / 1e12 for n, t in times.items()
                                         if t.get(b) is not None}
        notes[f"B{b}_fraction_of_copy"] = {n: unique_bytes[b] / (t[b] * 1e-3) / copy_bw for n, t in times.items()
                                           if t.get(b) is not None}
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--experts", type=int, default=SHAPE.experts)
    parser.add_argument("--graph", action="store_true", help="capture each method in a CUDA graph")
    parser.add_argument("--skip", default="", help=f"methods to leave out: {', '.join(METHODS)}")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.stderr.write("this benchmark needs a CUDA GPU\n")
        return 1
    shape = MoEShape(experts=args.experts)
    table = run(tuple(int(b) for b in args.batches.split(",")), shape, args.graph,
                tuple(s for s in args.skip.split(",") if s))
    print(table.format(), flush=True)
    if not args.no_save:
        table.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
