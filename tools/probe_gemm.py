"""GEMM probe on the GPU: the example matmul (plain tile API) at a few tile configs, with and without the
"pipeline" pass, against torch.matmul (cuBLAS) on the same inputs; prints TFLOP/s and the error of each.

    python tools/probe_gemm.py [SIZE ...]      (default 4096 8192)
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch

import minitriton.compiler as compiler
from benchmarks.harness import do_bench
from minitriton.kernels.examples import matmul as MM

CONFIGS = [(128, 128, 64, 8), (128, 256, 64, 8), (64, 128, 64, 4), (128, 64, 64, 4)]


def run(size: int) -> None:
    a = torch.randn(size, size, device="cuda").to(torch.bfloat16)
    b = torch.randn(size, size, device="cuda").to(torch.bfloat16)
    flops = 2 * size ** 3
    ref = (a.float() @ b.float())
    ms = do_bench(lambda: torch.matmul(a, b))
    print(f"{size}^3 cuBLAS: {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
    base = list(compiler.PIPELINE)
    for pipelined in (False, True):
        compiler.PIPELINE[:] = base + (["pipeline"] if pipelined and "pipeline" not in base else [])
        os.environ["MINITRITON_CACHE_DIR"] = tempfile.mkdtemp()
        for bm, bn, bk, warps in CONFIGS:
            name = f"{bm}x{bn}x{bk} w{warps} {'pipelined' if pipelined else 'plain'}"
            try:
                def call():
                    c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
                    grid = (MM.mt.cdiv(size, bm), MM.mt.cdiv(size, bn))
                    MM.matmul_kernel[grid](a, b, c, c, size, size, size, size, 1, size, 1, size, 1,
                                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=3)
                    return c
                c = call()
                torch.cuda.synchronize()
                err = ((c.float() - ref).norm() / ref.norm()).item()
                t = do_bench(call)
                print(f"{size}^3 {name:32s} {flops / t / 1e9:7.1f} TFLOP/s  rel err {err:.1e}", flush=True)
            except Exception as e:  # report and go on: one failing config must not hide the others
                print(f"{size}^3 {name:32s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                if "illegal" in str(e) or "misaligned" in str(e):
                    return
    compiler.PIPELINE[:] = base


if __name__ == "__main__":
    for s in (sys.argv[1:] or ["4096", "8192"]):
        run(int(s))
