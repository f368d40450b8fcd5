"""Checks shared by the GEMM variants' tests (tests/test_pipeline.py: the TMA ring; tests/test_warp_specialize.py:
the warp-specialized ring): the interpreter run, and the GPU check in a process of its own per config (a TMA fault
or a hang loses that process's CUDA context only: docs/tma.md)."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from minitriton.kernels.examples import matmul

_GPU_CHECK = """
import sys, torch
from minitriton.kernels.examples import matmul
wrapper, config = getattr(matmul, sys.argv[1]), matmul.MATMUL_CONFIGS[int(sys.argv[2])]
options = {flag: True for flag in sys.argv[3:]}  # e.g. paired_a
for m, n, k in [(1000, 600, 520), (130, 264, 136), (64, 512, 1024), (256, 256, 64), (192, 272, 200)]:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda", generator=g).to(torch.bfloat16)
    ref = a.double() @ b.double()
    c = wrapper(a, b, config, **options)
    torch.cuda.synchronize()
    rel = ((c.double() - ref).norm() / ref.norm()).item()
    assert rel <= 1e-2, f"{config} {m}x{n}x{k}: relative error {rel}"
print("ok")
"""


def check_on_gpu(wrapper: str, config_index: int, *flags: str) -> None:
    """matmul.<wrapper> at MATMUL_CONFIGS[config_index] (keyword flags set True, e.g. "paired_a") on ragged and tiny
    shapes against torch (relative Frobenius error <= 1e-2), in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _GPU_CHECK, wrapper, str(config_index), *flags], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "MINITRITON_INTERPRET": "0"})
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr


def check_interpreted(wrapper: str, config_index: int, gen: torch.Generator) -> None:
    """matmul.<wrapper> through the interpreter (the caller sets MINITRITON_INTERPRET=1) on a ragged problem."""
    a = torch.randn(130, 96, generator=gen).bfloat16()
    b = torch.randn(96, 136, generator=gen).bfloat16()
    c = getattr(matmul, wrapper)(a, b, matmul.MATMUL_CONFIGS[config_index])
    ref = a.double() @ b.double()
    assert (c.double() - ref).abs().max() <= 2e-2 * ref.abs().max()
