"""One GEMM launch per config of the example matmul at an odd size, checked against torch: what
tools/sanitize.sh runs under compute-sanitizer (small, so memcheck and racecheck finish in seconds). Every config
runs through the cp.async ring (matmul_kernel); the 128-row ones also through the TMA ring, the warp-specialized TMA
ring (rank-2 A boxes, and paired rank-4 ones where M is a multiple of 64) and the persistent kernel
(matmul_persistent: explicit partitions, 2 programs so each loops over several tiles; C through pointers and
through TMA stores).

    python tools/gemm_case.py [M N K [CONFIGS]]   (default 200 264 136, every MATMUL_CONFIG; 192 264 136 exercises
                                                   the paired A boxes; CONFIGS: indices, e.g. 1,3)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import minitriton as mt  # noqa: E402
from minitriton.kernels.examples import matmul as mm  # noqa: E402


def main() -> None:
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (200, 264, 136)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    b = torch.randn(K, N, generator=gen).to(torch.bfloat16).cuda()
    want = (a.double() @ b.double()).cpu()
    only = [int(i) for i in sys.argv[4].split(",")] if len(sys.argv) >= 5 else None  # config indices
    for index, config in enumerate(mm.MATMUL_CONFIGS):
        if only is not None and index not in only:
            continue
        meta = dict(config.kwargs)
        c = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        tiles = (mt.cdiv(M, meta["BLOCK_M"]), mt.cdiv(N, meta["BLOCK_N"]))
        grid = (tiles[0] * tiles[1],) if meta.get("GROUP_M", 0) else tiles
        mm.matmul_kernel[grid](a, b, c, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                               c.stride(0), c.stride(1), **meta, num_warps=config.num_warps,
                               num_stages=config.num_stages)
        results = {"cp.async ring": c}
        if meta["BLOCK_M"] >= 128:  # the TMA rings take the Hopper configs
            results["TMA ring"] = mm.matmul_tma_ring(a, b, config)
            results["warp-specialized"] = mm.matmul_tma_ws(a, b, config, paired_a=False)
            results["warp-specialized, paired A"] = mm.matmul_tma_ws(a, b, config)
            results["persistent"] = mm.matmul_persistent(a, b, config, programs=2)
            results["persistent, TMA stores"] = mm.matmul_persistent(a, b, config, programs=2, tma_store=True)
        torch.cuda.synchronize()
        for name, out in results.items():
            err = ((out.double().cpu() - want).norm() / want.norm()).item()
            print(f"{config} {name}: relative error {err:.2e}")
            assert err < 1e-2, (config, name)


if __name__ == "__main__":
    main()
