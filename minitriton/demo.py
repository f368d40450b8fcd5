"""`make demo`: compile every kernel's ahead-of-time specializations, then run the kernels and say how close each
result is to its float64 reference. On a machine with a CUDA GPU the kernels launch there at real sizes; elsewhere
they run through the interpreter (MINITRITON_INTERPRET=1) at small sizes."""
from __future__ import annotations

import importlib
import math
import os
import shutil
import sys
import time
from typing import Callable

import torch

EXAMPLES = ["vector_add", "softmax", "rmsnorm", "matmul", "attention", "cumsum"]
K3_MODULES = ["flash_kda", "kda_decode", "warp_decode"]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def example_cases(dev: str, big: bool) -> list[tuple[str, float, Callable[[], float]]]:
    """(name, error bound, run -> relative error) for each example."""
    from minitriton.kernels.examples import attention, cumsum, matmul, rmsnorm, softmax, vector_add as va

    n = 1 << 24 if big else 5000
    rows, cols = (4096, 8192) if big else (4, 1000)
    mm = (2048, 2048, 2048) if big else (70, 50, 90)
    bh, t, d = (16, 1024, 64) if big else (2, 40, 16)

    def randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=dev).to(dtype)

    def case_add() -> float:
        x, y = randn(n, dtype=torch.float32), randn(n, dtype=torch.float32)
        return rel_err(va.add(x, y), va.reference(x, y))

    def case_softmax() -> float:
        x = randn(rows, cols)
        return rel_err(softmax.softmax(x), softmax.reference(x))

    def case_rmsnorm() -> float:
        x, r, w = randn(rows, cols), randn(rows, cols), randn(cols)
        return rel_err(rmsnorm.rmsnorm(x, w, r)[0], rmsnorm.reference(x, w, r)[0])

    def case_matmul() -> float:
        a, b = randn(mm[0], mm[2]), randn(mm[2], mm[1])
        blocks = (64, 64, 32) if big else (32, 32, 32)
        return rel_err(matmul.matmul(a, b, block=blocks), matmul.reference(a, b))

    def case_attention() -> float:
        q, k, v = randn(bh, t, d), randn(bh, t, d), randn(bh, t, d)
        blocks = (64, 32) if big else (16, 16)
        return rel_err(attention.attention(q, k, v, *blocks), attention.reference(q, k, v))

    def case_cumsum() -> float:
        x = randn(rows, cols, dtype=torch.float32)
        return rel_err(cumsum.cumsum(x), cumsum.reference(x))

    return [
        (f"vector_add  n={n} fp32", 1e-6, case_add),
        (f"softmax     {rows}x{cols} bf16", 1e-2, case_softmax),
        (f"rmsnorm     {rows}x{cols} bf16 + residual", 1e-2, case_rmsnorm),
        (f"matmul      {mm[0]}x{mm[2]} @ {mm[2]}x{mm[1]} bf16", 1e-2, case_matmul),
        (f"attention   causal BH={bh} T={t} D={d} bf16", 1e-2, case_attention),
        (f"cumsum      {rows}x{cols} fp32", 1e-5, case_cumsum),
    ]


def k3_cases(dev: str, big: bool) -> list[tuple[str, float, Callable[[], float]]]:
    """The K3 kernels against their float64 references: small shapes in the interpreter, real ones on a GPU."""
    from minitriton.kernels import flash_kda, kda_decode, kda_reference, kda_ref, mxfp4, warp_decode

    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    def case_flash_kda() -> float:
        b, t, h, d = (1, 8192, 12, 128) if big else (1, 70, 1, 16)
        x = dict(q=randn(b, t, h, d).bfloat16(), k=randn(b, t, h, d).bfloat16(), v=randn(b, t, h, d).bfloat16(),
                 g=randn(b, t, h, d).bfloat16(), beta=randn(b, t, h).bfloat16(), A_log=torch.rand(h, generator=gen),
                 dt_bias=randn(h * d), initial_state=randn(b, h, d, d))
        ref_o, _ = kda_ref.kda_recurrent_reference(**x, output_final_state=True)
        o, _ = flash_kda.chunk_kda(**{k: v.to(dev) for k, v in x.items()}, output_final_state=True)
        return rel_err(o, ref_o)

    def case_kda_decode() -> float:
        b, h, d, steps = (256, 12, 128, 20) if big else (3, 2, 16, 4)
        rep = kda_reference.simulate_spec_decode(kda_decode.kda_decode_step, num_requests=b + 2, batch_rows=b,
                                                 num_slots=b + 4, heads=h, head_k_dim=d, head_v_dim=d, num_drafts=3,
                                                 steps=steps, seed=1, device=dev)
        return max(rep.output_error, rep.state_error)

    def case_warp_decode() -> float:
        bsz, dim, inter, experts, top = (4, 3584, 3072, 64, 16) if big else (2, 96, 80, 8, 3)
        w13 = mxfp4.random_mxfp4((experts, 2 * inter), dim, gen)
        w2 = mxfp4.random_mxfp4((experts, dim), inter, gen)
        x = randn(bsz, dim).bfloat16()
        ids = torch.stack([torch.randperm(experts, generator=gen)[:top] for _ in range(bsz)]).int()
        weights = torch.softmax(randn(bsz, top), -1)
        ref = warp_decode.reference(x, ids, weights, w13, w2)
        out = warp_decode.moe_decode(x.to(dev), ids.to(dev), weights.to(dev),
                                     warp_decode.prepare_experts(*(t.to(dev) for t in w13)),
                                     warp_decode.prepare_experts(*(t.to(dev) for t in w2)), out_dtype=torch.float32)
        return rel_err(out, ref)

    return [("flash_kda   chunk_kda vs fp64 recurrence", 1e-2, case_flash_kda),
            ("kda_decode  speculative steps vs token-by-token", 1e-2, case_kda_decode),
            ("warp_decode MXFP4 MoE vs fp64 dequantized", 5e-3, case_warp_decode)]


def compile_all(target: str) -> int:
    """Compile every declared AOT specialization; print one line each. Returns the number of failures."""
    from minitriton.runtime.jit import Kernel

    failures = 0
    modules = [f"minitriton.kernels.examples.{m}" for m in EXAMPLES] + [f"minitriton.kernels.{m}" for m in K3_MODULES]
    for modname in modules:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for obj in vars(mod).values():
            if not isinstance(obj, Kernel):
                continue
            for spec in obj.specializations:
                t0 = time.perf_counter()
                try:
                    compiled = spec.compile(target=target)
                    info = compiled.report() if target != "ir" else "IR ok"
                    print(f"  compiled {obj.__name__:<24} {spec.describe():<40} {info}  "
                          f"({(time.perf_counter() - t0) * 1e3:.0f} ms)")
                except Exception as e:  # report and go on: the demo shows every kernel's state
                    failures += 1
                    print(f"  FAILED   {obj.__name__:<24} {spec.describe():<40} {type(e).__name__}: {e}")
    return failures


def main() -> int:
    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["MINITRITON_INTERPRET"] = "1"
    target = "cubin" if shutil.which("ptxas") else "ptx"
    print(f"MiniTriton demo: {'GPU ' + torch.cuda.get_device_name() if gpu else 'no GPU: interpreter on CPU'}; "
          f"compiling to {target} ({'ptxas found' if target == 'cubin' else 'no ptxas: PTX only'})")
    print("1. ahead-of-time specializations")
    failures = compile_all(target)
    dev = "cuda" if gpu else "cpu"
    print(f"2. kernels vs float64 references ({'real sizes on the GPU' if gpu else 'small sizes, interpreted'})")
    for name, bound, run in example_cases(dev, gpu) + k3_cases(dev, gpu):
        t0 = time.perf_counter()
        try:
            err = run()
            ok = err <= bound
            failures += not ok
            print(f"  {'ok  ' if ok else 'FAIL'} {name:<48} rel err {err:.2e} (bound {bound:.0e}) "
                  f"{(time.perf_counter() - t0):.1f} s")
        except Exception as e:
            failures += 1
            print(f"  FAIL {name:<48} {type(e).__name__}: {e}")
    print("all good" if not failures else f"{failures} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
