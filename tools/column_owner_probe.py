"""What the column-owner layout of the KDA decode state costs per token, before a kernel is built on it (a probe).

    python tools/column_owner_probe.py [--sass]          # compile only: registers, spills, SASS per token loop
    python tools/column_owner_probe.py --time            # on the GPU: time it at B256 H12 (3072 items), 15 tokens

The loop kernel spends ~316 / 633 SASS a replayed / new token with 4 / 8 block barriers (docs/kernels/kda_decode.md).
The column-owner idea: one thread holds a whole V column of the [K, V] fp32 state (K = 128 registers), so the
token's two matvecs over K (k.S and q.S) and the rank-1 update are chains inside the thread, and the token's K
vectors (k, q) are read by every thread from the same addresses (L1 broadcasts) instead of being exchanged
through shared memory. `mt.load(layout=mt.blocked([K, 1], [1, 32], [1, V // 32], [0, 1]))` gives that layout.
This probe runs the recurrence core only (no conv, norms, gates or decay: S += k (beta (v - k.S)), o = q.S), one
program per (item, head) with V / 32 warps, and checks it against torch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import minitriton as mt  # noqa: E402
import sass_regions  # noqa: E402

K, V = 128, 128


@mt.kernel
def column_owner_tokens(state_ptr, kq_ptr, v_ptr, beta_ptr, o_ptr, T, K: mt.constexpr, V: mt.constexpr):
    """Item i: S (fp32 [K, V], a V column per thread) through T tokens of S += k (beta (v - k.S)), o = q.S; then
    S written back. kq: [items, T, 2, K] fp32 (k then q), v: [items, T, V], beta: [items, T], o: [items, T, V]."""
    item = mt.program_id(0).to(mt.int64)
    k = mt.arange(0, K)
    v = mt.arange(0, V)
    state = state_ptr + item * (K * V) + (k[:, None] * V + v[None, :])
    column = mt.blocked([K, 1], [1, 32], [1, V // 32], [0, 1])
    S = mt.load(state, layout=column)
    for t in range(0, T):
        tok = item * T + t
        row = kq_ptr + tok * (2 * K) + (k[:, None] + v[None, :] * 0)  # every thread reads the whole k (and q)
        kS = mt.sum(S * mt.load(row, layout=column), axis=0)
        delta = mt.load(beta_ptr + tok) * (mt.load(v_ptr + tok * V + v) - kS)
        S = S + mt.load(row, cache_modifier=".ca", layout=column) * delta[None, :]  # k again from L1 (.ca: not
        # merged with the first load by CSE, so k is not held across the sum)
        mt.store(o_ptr + tok * V + v, mt.sum(S * mt.load(row + K, layout=column), axis=0))
    mt.store(state, S, layout=column)  # from the registers that hold it: no shared-memory exchange


SIGNATURE = "state_ptr:*fp32:16,kq_ptr:*fp32:16,v_ptr:*fp32:16,beta_ptr:*fp32:16,o_ptr:*fp32:16,T:i32"


def reference(S: torch.Tensor, kq: torch.Tensor, vv: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
    S = S.double().clone()
    o = torch.empty(vv.shape, dtype=torch.float64, device=S.device)
    for t in range(vv.shape[1]):
        kk, qq = kq[:, t, 0].double(), kq[:, t, 1].double()
        kS = torch.einsum("ik,ikv->iv", kk, S)
        S += kk[:, :, None] * (beta[:, t, None].double() * (vv[:, t].double() - kS))[:, None, :]
        o[:, t] = torch.einsum("ik,ikv->iv", qq, S)
    return S, o


def problem(items: int, T: int, device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(0)
    S = torch.randn(items, K, V, generator=g, device=device) * 0.1
    kq = torch.nn.functional.normalize(torch.randn(items, T, 2, K, generator=g, device=device), dim=-1)
    vv = torch.randn(items, T, V, generator=g, device=device)
    beta = torch.sigmoid(torch.randn(items, T, generator=g, device=device))
    return S, kq, vv, beta


def sass_report() -> str:
    compiled = column_owner_tokens.aot_spec(SIGNATURE, V // 32, None, None, K=K, V=V).compile(target="cubin")
    meta = compiled.metadata
    lines = [f"registers {compiled.registers}, spills {meta.get('spill_stores')} / {meta.get('spill_loads')} B, "
             f"bar.sync in PTX {compiled.ptx.count('bar.sync')}, shfl {compiled.ptx.count('shfl')}"]
    sass = sass_regions.disassemble(compiled.cubin)
    if sass is None:
        return lines[0] + " (set NVDISASM for the SASS per token)"
    ins, labels = sass_regions.parse(sass)
    found = sass_regions.loops(ins, labels)
    if not found:
        return lines[0] + " (no loop found in the SASS)"
    start, end = found[0]  # the token loop (the kernel's only one)
    ops = sass_regions.opcodes(ins[start:end])
    lines.append(f"token loop {end - start} SASS: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(10)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="time it on the GPU (B256 H12: 3072 items)")
    parser.add_argument("--tokens", type=int, default=15)
    args = parser.parse_args(argv)
    print(sass_report(), flush=True)
    if not args.time:
        return 0
    from benchmarks import harness

    items, T = 3072, args.tokens
    S, kq, vv, beta = problem(items, T, "cuda")
    state, o = S.clone(), torch.full(vv.shape, float("nan"), device="cuda")
    column_owner_tokens[(items,)](state, kq, vv, beta, o, T, K=K, V=V, num_warps=V // 32)
    want_S, want_o = reference(S, kq, vv, beta)
    err = max(((state.double() - want_S).norm() / want_S.norm()).item(),
              ((o.double() - want_o).norm() / want_o.norm()).item())
    copy = harness.copy_bandwidth()
    us = harness.do_bench(lambda: column_owner_tokens[(items,)](state, kq, vv, beta, o, T, K=K, V=V,
                                                               num_warps=V // 32)) * 1e3
    floor = 2 * S.numel() * 4 / copy * 1e6
    print(f"{items} items x {T} tokens: {us:.1f} us (state read + write floor {floor:.1f} us), max rel err {err:.1e}")
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
