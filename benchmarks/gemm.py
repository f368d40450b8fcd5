"""bf16 GEMM: the example matmul (best of its MATMUL_CONFIGS) vs cuBLAS (torch.matmul) vs Triton, TFLOP/s.

Rows (C = A @ B, A M x K and B K x N row-major bf16, fp32 accumulation, C bf16; each call allocates C):
  8192^3        M = N = K = 8192 (the main target: >= 90% of cuBLAS)
  4096^3        M = N = K = 4096
  skinny        M = 64, N = K = 8192 (decode-like: a few rows against a big weight)
ours    minitriton.kernels.examples.matmul.matmul_kernel launched with each of MATMUL_CONFIGS (its block sizes,
        GROUP_M, num_warps, num_stages); the row reports the fastest and the notes name it and every config's time
torch   torch.matmul (cuBLAS)
triton  the Triton tutorial matmul autotuned over Hopper configs (benchmarks/triton_peers.py), when installed

Times are medians of do_bench (L2 flushed before each call), in us. The floor is 2 M N K at the H200's dense bf16
tensor-core peak (PEAK_TFLOPS), so floor/ours is our fraction of peak; the notes give every implementation's
TFLOP/s. Before timing, each implementation (each of our configs too) is checked against a float64 matmul of the
same bf16 inputs: relative Frobenius error <= 1e-2 and max error <= 2e-2 x max |C| (bf16 output rounding), so a
broken kernel cannot post a fast time; a config that fails to compile or check is reported in the notes, skipped.

Importable and listable without a GPU or triton: all GPU work happens in run().
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .harness import Table, do_bench, log, triton_peers

PEAK_TFLOPS = 989.0  # H200 SXM dense bf16 tensor-core peak (TFLOP/s)
SHAPES = [("8192^3", 8192, 8192, 8192), ("4096^3", 4096, 4096, 4096), ("skinny", 64, 8192, 8192)]
REL_TOL, MAX_TOL = 1e-2, 2e-2


@dataclass
class Problem:
    """One row's operands and its float64 reference."""

    name: str
    m: int
    n: int
    k: int
    a: Any
    b: Any
    ref: Any

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k} bf16"


def make_problem(name: str, m: int, n: int, k: int, device: str = "cuda") -> Problem:
    import torch

    gen = torch.Generator(device=device).manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
    b = torch.randn(k, n, device=device, generator=gen).to(torch.bfloat16)
    return Problem(name, m, n, k, a, b, a.double() @ b.double())


def check(problem: Problem, who: str, out: Any) -> None:
    """Raise AssertionError unless `out` is the bf16-rounded product (see the module docstring)."""
    err = out.double() - problem.ref
    rel = (err.norm() / problem.ref.norm()).item()
    worst = err.abs().max().item()
    bound = MAX_TOL * problem.ref.abs().max().item()
    if not (rel <= REL_TOL and worst <= bound):
        raise AssertionError(f"gemm {problem.name} ({who}): relative error {rel:.3g}, max error {worst:.3g} "
                             f"(bound {bound:.3g})")


def config_name(config: Any) -> str:
    p = config.kwargs if hasattr(config, "kwargs") else config.params
    tile = f"{p['BLOCK_M']}x{p['BLOCK_N']}x{p['BLOCK_K']}"
    group = f" G{p['GROUP_M']}" if p.get("GROUP_M") else ""
    return f"{tile}{group} w{config.num_warps} s{config.num_stages}"


def ours_launchers(problem: Problem) -> dict[str, Callable[[], Any]]:
    """One call per MATMUL_CONFIG of the example kernel (allocating C), named by config."""
    import torch

    from minitriton.kernels.examples import matmul

    a, b = problem.a, problem.b
    m, k = a.shape
    n = b.shape[1]
    out = {}
    for config in matmul.MATMUL_CONFIGS:
        params = dict(_params(config))
        grid = matmul._matmul_grid({"M": m, "N": n, **params})

        def launch(params: dict = params, grid: tuple = grid, config: Any = config) -> Any:
            c = torch.empty((m, n), dtype=a.dtype, device=a.device)
            matmul.matmul_kernel[grid](a, b, c, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                       c.stride(0), c.stride(1), num_warps=config.num_warps,
                                       num_stages=config.num_stages, **params)
            return c

        out[config_name(config)] = launch
    return out


def _params(config: Any) -> dict[str, Any]:
    return dict(config.kwargs if hasattr(config, "kwargs") else config.params)


def _time_checked(problem: Problem, who: str, fn: Callable[[], Any]) -> float:
    """Check, then the median microseconds per call."""
    import torch

    log(f"gemm: {problem.name}: checking {who}")
    check(problem, who, fn())
    torch.cuda.synchronize()
    return do_bench(fn) * 1e3


def tflops(problem: Problem, us: float | None) -> float | None:
    return problem.flops / (us * 1e-6) / 1e12 if us else None


def run() -> Table:
    peers = triton_peers()
    table = Table("gemm", "bf16 GEMM (us per call; lower is better)", unit="us",
                  notes={"floor": f"peak {PEAK_TFLOPS:.0f} TFLOP/s"})
    for name, m, n, k in SHAPES:
        problem = make_problem(name, m, n, k)
        config_us: dict[str, float] = {}
        for cfg, fn in ours_launchers(problem).items():
            try:
                config_us[cfg] = _time_checked(problem, f"ours {cfg}", fn)
            except Exception as e:  # one broken config must not hide the others
                log(f"gemm: {name}: ours {cfg} failed: {type(e).__name__}: {e}")
                table.notes[f"{name}: ours {cfg}"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
        if not config_us:
            raise RuntimeError(f"gemm {name}: every MATMUL_CONFIG failed (see the log)")
        best = min(config_us, key=config_us.__getitem__)
        peer_us: dict[str, float | None] = {}
        peer_us["torch"] = _time_checked(problem, "torch", lambda: problem.a @ problem.b)
        if peers is not None:
            tname = f"triton {peers.triton.__version__}"
            peer_us[tname] = _time_checked(problem, tname, lambda: peers.matmul(problem.a, problem.b))
            table.notes[f"{name}: triton config"] = peers.matmul_config(problem.a, problem.b)
        table.add(name, problem.shape, config_us[best], peer_us, floor=problem.flops / (PEAK_TFLOPS * 1e12) * 1e6)
        table.notes[f"{name}: ours config"] = best
        for cfg, us in config_us.items():
            table.notes[f"{name}: ours {cfg} TFLOP/s"] = round(tflops(problem, us) or 0.0, 1)
        table.notes[f"{name}: TFLOP/s"] = {who: round(tflops(problem, us) or 0.0, 1)
                                           for who, us in {"ours": config_us[best], **peer_us}.items()}
        del problem
    return table
