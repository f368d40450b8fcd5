"""Read bandwidth of WarpDecode's weight-stream access pattern against a contiguous one, on the GPU (a probe).

    python tools/stream_pattern.py [--mb 187]

The v7 gate_up kernel at B = 1 streams 187 MB at ~3.2 TB/s (57.8 us, 2026-12-02), and neither the L2's 256-byte
fetch nor a grid that keeps every program slot busy moved it. This probe separates the access pattern from the
kernel's math: one-warp programs (16 resident per SM, as the v7 kernels) each read a tile of 16 rows in steps,
three steps of loads in flight as the kernel carries them, and sum the words (so nothing is dead). Patterns:

  rows       the v6 / v7 layout: a step is 16 rows x 128 bytes, rows 1792 bytes apart (a 28 KB tile read in 14
             steps, each row's next 128 bytes one step later)
  tile       the same bytes with each step's 16 x 128 bytes stored together: a warp streams 2 KB contiguous a step
  rows_l2    rows, the loads with l2_prefetch=256
  rows_cg    rows, the loads .cg
  depth N    rows with N steps of loads in flight per warp (1 .. 14: the whole tile at once)

Prints GB/s (bytes read / time, do_bench with the L2 flushed) and the fraction of the copy bandwidth.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import minitriton as mt  # noqa: E402
from benchmarks import harness  # noqa: E402

ROW_WORDS = 448  # 1792 bytes: a K3 W13 row of MXFP4 weights
STEPS = ROW_WORDS // 32  # 128 bytes of each row a step
DEPTHS = (1, 2, 3, 4, 6, 8, 14)  # steps in flight per warp (stream_tiles_deep, the rows pattern)


@mt.kernel(min_blocks_per_sm=16)
def stream_tiles(src_ptr, out_ptr, row_stride, step_stride, CACHE: mt.constexpr, L2PF: mt.constexpr):
    """out[tile] = the sum over steps of the [16, 32] words of tile `tile` at step s: word (r, w) at
    tile * 16 * ROW_WORDS + r * row_stride + s * step_stride + w; loads three steps ahead."""
    tile = mt.program_id(0).to(mt.int64)
    r = mt.arange(0, 16)
    w = mt.arange(0, 32)
    at = src_ptr + tile * (16 * ROW_WORDS) + (r[:, None] * row_stride + w[None, :])
    a = mt.load(at, cache_modifier=CACHE, l2_prefetch=L2PF)
    b = mt.load(at + step_stride, cache_modifier=CACHE, l2_prefetch=L2PF)
    c = mt.load(at + 2 * step_stride, cache_modifier=CACHE, l2_prefetch=L2PF)
    acc = mt.zeros((16, 32), mt.int32)
    for s in range(0, STEPS - 2, 3):
        acc += a
        a = mt.load(at + mt.minimum(s + 3, STEPS - 1) * step_stride, cache_modifier=CACHE, l2_prefetch=L2PF)
        acc += b
        b = mt.load(at + mt.minimum(s + 4, STEPS - 1) * step_stride, cache_modifier=CACHE, l2_prefetch=L2PF)
        acc += c
        c = mt.load(at + mt.minimum(s + 5, STEPS - 1) * step_stride, cache_modifier=CACHE, l2_prefetch=L2PF)
    acc += a + b  # STEPS = 14: 12 in the loop, steps 12 and 13 are a and b
    mt.store(out_ptr + tile * 512 + r[:, None] * 32 + w[None, :], acc)


@mt.kernel(min_blocks_per_sm=16)
def stream_tiles_deep(src_ptr, out_ptr, row_stride, step_stride, DEPTH: mt.constexpr):
    """stream_tiles with DEPTH steps of loads in flight (the 14 steps unrolled, a queue of DEPTH loaded tiles): how
    far bytes in flight per warp move the bandwidth at 16 one-warp programs per SM."""
    tile = mt.program_id(0).to(mt.int64)
    r = mt.arange(0, 16)
    w = mt.arange(0, 32)
    at = src_ptr + tile * (16 * ROW_WORDS) + (r[:, None] * row_stride + w[None, :])
    ahead = ()
    for s in mt.static_range(DEPTH):
        ahead = ahead + (mt.load(at + s * step_stride),)
    acc = mt.zeros((16, 32), mt.int32)
    for s in mt.static_range(STEPS):
        if s + DEPTH < STEPS:
            ahead = ahead + (mt.load(at + (s + DEPTH) * step_stride),)
        acc += ahead[0]
        ahead = ahead[1:]
    mt.store(out_ptr + tile * 512 + r[:, None] * 32 + w[None, :], acc)


PATTERNS = {  # name: (row stride, step stride in words, cache operator, L2 fetch)
    "rows": (ROW_WORDS, 32, "", 0),
    "tile": (32, 512, "", 0),
    "rows_l2": (ROW_WORDS, 32, "", 256),
    "rows_cg": (ROW_WORDS, 32, ".cg", 0),
    "tile_cg": (32, 512, ".cg", 0),
}


def reference(src: torch.Tensor, tiles: int, row_stride: int, step_stride: int) -> torch.Tensor:
    """The kernel's sums in torch (int64, wrapped to int32)."""
    r = torch.arange(16, device=src.device)[:, None, None]
    s = torch.arange(STEPS, device=src.device)[None, :, None]
    w = torch.arange(32, device=src.device)[None, None, :]
    offs = (r * row_stride + s * step_stride + w).reshape(-1)
    t = torch.arange(tiles, device=src.device)[:, None] * (16 * ROW_WORDS)
    vals = src[(t + offs[None, :]).reshape(-1)].reshape(tiles, 16, STEPS, 32).long().sum(2)
    return ((vals + 2**31) % 2**32 - 2**31).to(torch.int32).reshape(tiles, 512)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=187.0, help="megabytes read per call (K3 gate_up at B = 1: 187)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.stderr.write("needs a CUDA GPU\n")
        return 1
    tiles = int(args.mb * 1e6 // (16 * ROW_WORDS * 4))
    src = torch.randint(-2**31, 2**31 - 1, (tiles * 16 * ROW_WORDS,), dtype=torch.int32, device="cuda")
    out = torch.empty((tiles, 512), dtype=torch.int32, device="cuda")
    copy_bw = harness.copy_bandwidth()
    nbytes = src.numel() * 4
    print(f"{tiles} tiles of 16 x {ROW_WORDS * 4} B ({nbytes / 1e6:.1f} MB), one-warp programs; copy {copy_bw / 1e12:.2f} TB/s")
    print("pattern  | us     | TB/s  | of copy")
    for name, (row_stride, step_stride, cache, l2pf) in PATTERNS.items():
        call = lambda: stream_tiles[(tiles,)](src, out, row_stride, step_stride, CACHE=cache, L2PF=l2pf, num_warps=1)
        out.fill_(0x7FFFFFFF)
        call()
        if not torch.equal(out, reference(src, tiles, row_stride, step_stride)):
            print(f"{name:8s} | WRONG SUMS")
            continue
        us = harness.do_bench(call) * 1e3
        print(f"{name:8s} | {us:6.1f} | {nbytes / us / 1e6:5.2f} | {nbytes / us * 1e6 / copy_bw:.0%}", flush=True)
    for depth in DEPTHS:
        call = lambda: stream_tiles_deep[(tiles,)](src, out, ROW_WORDS, 32, DEPTH=depth, num_warps=1)
        out.fill_(0x7FFFFFFF)
        call()
        if not torch.equal(out, reference(src, tiles, ROW_WORDS, 32)):
            print(f"depth {depth:2d} | WRONG SUMS")
            continue
        us = harness.do_bench(call) * 1e3
        print(f"depth {depth:2d} | {us:6.1f} | {nbytes / us / 1e6:5.2f} | {nbytes / us * 1e6 / copy_bw:.0%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
