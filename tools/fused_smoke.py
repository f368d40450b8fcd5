"""One call of the one-launch WarpDecode (variant v7_fused) at K3 widths on the GPU against the three-launch v7
kernels: a quick check before timing it (a deadlock shows as this script's timeout).

    python tools/fused_smoke.py [B ...]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_warp_decode as bench  # noqa: E402

from minitriton.kernels import warp_decode as wd  # noqa: E402


def main(batches: list[int]) -> int:
    shape = bench.SHAPE
    layer = bench.make_layer(shape)
    w13, w2 = (wd.prepare_experts(layer.w13_blocks, layer.w13_scales, layout="v7"),
               wd.prepare_experts(layer.w2_blocks, layer.w2_scales, layout="v7"))
    status = 0
    for b in batches:
        x, ids, weights = bench.make_batch(shape, b)
        t = time.time()
        fused = wd.moe_decode(x, ids, weights, w13, w2, out_dtype=torch.float32, variant="v7_fused")
        torch.cuda.synchronize()
        first = time.time() - t
        three = wd.moe_decode(x, ids, weights, w13, w2, out_dtype=torch.float32, variant="v7_u3c")
        again = wd.moe_decode(x, ids, weights, w13, w2, out_dtype=torch.float32, variant="v7_fused")
        err = ((fused.double() - three.double()).norm() / three.double().norm()).item()
        sync = sum(int(s.abs().sum()) for s in wd._SYNC_WORDS.values())
        ok = err <= 1e-5 and torch.equal(fused, again) and sync == 0
        status |= not ok
        print(f"B={b}: rel err vs v7_u3c {err:.2e}, repeat equal {torch.equal(fused, again)}, sync words {sync}, "
              f"first call {first:.2f} s -> {'ok' if ok else 'FAIL'}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main([int(b) for b in sys.argv[1:]] or [1, 4]))
