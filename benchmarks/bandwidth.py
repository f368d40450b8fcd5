"""Memory-bound kernels: vector add, softmax, RMSNorm + residual; MiniTriton vs Triton vs torch, GB/s vs a copy.

Rows (each implementation allocates its outputs, as a caller would):
  vector add          2^28 fp32 elements (1 GiB per tensor, far beyond the 60 MB L2): out = x + y, BLOCK 1024
  softmax             4096 x 8192 bf16, over the last dim, one program per row (BLOCK 8192, 8 warps)
  rmsnorm + residual  4096 x 8192 bf16: h = x + residual (written back), out = h * rsqrt(mean(h^2) + eps) * w
ours   the example host wrappers: minitriton.kernels.examples.{vector_add.add, softmax.softmax, rmsnorm.rmsnorm}
triton the same algorithms as Triton tutorial kernels (benchmarks/triton_peers.py), when triton is installed
torch  x + y, torch.softmax, an eager RMSNorm (add, float, pow, mean, rsqrt, mul, cast)

Times are medians of do_bench (L2 flushed before each call). Effective bandwidth = (bytes read + bytes written) /
time, with the minimum traffic: vector add 3 x 4n, softmax 2 x 2RC, RMSNorm 4 x 2RC + 2C. The floor is the time a
device-to-device copy of that many bytes takes at the copy bandwidth measured in the same run, so floor/ours is
our fraction of copy bandwidth; triton/ours is our bandwidth over Triton's (> 1: we are faster). The notes also
give a copy of the same number of bytes timed like the kernels (one call of that size, ramp and tail included).
Before timing, every implementation is checked against a reference (fp32 add exactly; softmax and RMSNorm against
float64 math rounded to bf16, within bf16 tolerance), so a broken kernel cannot post a fast time.

Importable and listable without a GPU or triton: all GPU work happens in run().
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .harness import Table, copy_bandwidth, do_bench, log, triton_peers

VECTOR_ELEMENTS = 1 << 28
ROWS, COLS = 4096, 8192
EPS = 1e-6


@dataclass
class Case:
    """One row: the three implementations (each a no-argument call) and the bytes one call must move."""

    name: str
    shape: str
    nbytes: int
    ours: Callable[[], Any]
    peers: dict[str, Callable[[], Any]] = field(default_factory=dict)
    check: Callable[[str, Any], None] = lambda name, result: None


class BandwidthTable(Table):
    """A Table of times that also prints each implementation's effective bandwidth (GB/s)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.nbytes: dict[str, int] = {}

    def bandwidths(self, row: Any) -> dict[str, float | None]:
        nbytes = self.nbytes[row.name]
        series = {"ours": row.ours, **{p: row.peers.get(p) for p in self.peer_names}}
        return {s: (nbytes / (t * 1e-6) / 1e9 if t else None) for s, t in series.items()}

    def format(self) -> str:
        lines = [super().format(), "", f"effective bandwidth (GB/s; copy = {self.notes['copy GB/s']:.0f} GB/s)"]
        header = ["name", "ours"] + self.peer_names + ["ours / copy"]
        rows = [header]
        for row in self.rows:
            gbps = self.bandwidths(row)
            rows.append([row.name] + [f"{gbps[s]:.0f}" if gbps[s] else "-" for s in ["ours"] + self.peer_names]
                        + [f"{row.fraction_of_floor:.1%}" if row.fraction_of_floor else "-"])
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for r in rows:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        for entry, row in zip(data["rows"], self.rows):
            entry["bytes"] = self.nbytes[row.name]
            entry["gbps"] = self.bandwidths(row)
        return data


def cases(peers: Any, device: str = "cuda", elements: int = VECTOR_ELEMENTS, rows: int = ROWS,
          cols: int = COLS) -> list[Case]:
    """The three rows on fresh random inputs (`peers`: the triton_peers module or None). Smaller sizes and the CPU
    (with MINITRITON_INTERPRET=1) run the same checks in tests."""
    import torch

    from minitriton.kernels.examples import rmsnorm, softmax, vector_add

    def torch_rmsnorm(x: Any, w: Any, residual: Any) -> tuple[Any, Any]:
        h = x + residual
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype), h

    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(elements, device=device, generator=gen)
    y = torch.randn(elements, device=device, generator=gen)
    expected_sum = x + y

    def check_add(name: str, out: Any) -> None:
        torch.testing.assert_close(out, expected_sum, rtol=0, atol=0, msg=lambda m: f"vector add ({name}): {m}")

    s = torch.randn(rows, cols, device=device, generator=gen).mul_(3).to(torch.bfloat16)
    expected_softmax = softmax.reference(s)

    def check_softmax(name: str, out: Any) -> None:
        torch.testing.assert_close(out, expected_softmax, rtol=1.6e-2, atol=1e-6,
                                   msg=lambda m: f"softmax ({name}): {m}")

    r = torch.randn(rows, cols, device=device, generator=gen).to(torch.bfloat16)
    res = torch.randn(rows, cols, device=device, generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(cols, device=device, generator=gen)).to(torch.bfloat16)
    expected_norm, expected_res = rmsnorm.reference(r, w, res, EPS)

    def check_rmsnorm(name: str, result: Any) -> None:
        out, res_out = result
        torch.testing.assert_close(res_out, expected_res, rtol=1.6e-2, atol=1e-2,
                                   msg=lambda m: f"rmsnorm residual ({name}): {m}")
        torch.testing.assert_close(out, expected_norm, rtol=1.6e-2, atol=2e-2, msg=lambda m: f"rmsnorm ({name}): {m}")

    size = f"2^{elements.bit_length() - 1}" if elements & (elements - 1) == 0 else str(elements)
    add = Case("vector add", f"{size} fp32", 3 * 4 * elements, lambda: vector_add.add(x, y, block=1024),
               {"torch": lambda: x + y}, check_add)
    soft = Case("softmax", f"{rows}x{cols} bf16", 2 * 2 * rows * cols, lambda: softmax.softmax(s),
                {"torch": lambda: torch.softmax(s, dim=-1)}, check_softmax)
    norm = Case("rmsnorm + residual", f"{rows}x{cols} bf16", 4 * 2 * rows * cols + 2 * cols,
                lambda: rmsnorm.rmsnorm(r, w, res, EPS), {"torch": lambda: torch_rmsnorm(r, w, res)}, check_rmsnorm)
    if peers is not None:
        name = f"triton {peers.triton.__version__}"
        add.peers = {name: lambda: peers.vector_add(x, y, 1024), **add.peers}
        soft.peers = {name: lambda: peers.softmax(s), **soft.peers}
        norm.peers = {name: lambda: peers.rmsnorm(r, w, res, EPS), **norm.peers}
    return [add, soft, norm]


def same_size_copy_us(nbytes: int) -> float:
    """A device-to-device copy moving `nbytes` (read + written) timed as the kernels are: the achievable floor at
    this size, which sits above nbytes / (the 1 GiB copy bandwidth) by the launch, ramp-up and tail of one call."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    return do_bench(lambda: dst.copy_(src)) * 1e3


def run() -> Table:
    import torch

    bandwidth = copy_bandwidth()
    table = BandwidthTable("bandwidth", "Memory-bound kernels (us per call; lower is better)", unit="us",
                           notes={"floor": "copy", "copy GB/s": bandwidth / 1e9})
    for case in cases(triton_peers()):
        for name, fn in {"ours": case.ours, **case.peers}.items():
            log(f"bandwidth: {case.name}: checking {name}")
            case.check(name, fn())
        torch.cuda.synchronize()
        ours = do_bench(case.ours) * 1e3
        peer_times = {}
        for name, fn in case.peers.items():
            peer_times[name] = do_bench(fn) * 1e3
        table.nbytes[case.name] = case.nbytes
        table.add(case.name, case.shape, ours, peer_times, floor=case.nbytes / bandwidth * 1e6)
        table.notes[f"{case.name}: same-size copy (us)"] = same_size_copy_us(case.nbytes)
    return table
