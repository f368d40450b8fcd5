"""Shared benchmark helpers: GPU timing, host launch timing, the measured copy-bandwidth floor, and a results Table.

Every number a table reports is measured in the same run as the peers it is compared with:
- `do_bench(fn)`: median GPU time in ms (triton.testing.do_bench when triton is importable, else CUDA events with
  the L2 flushed before each call, as Triton does);
- `host_time_us(fn)`: wall-clock microseconds per call of a host loop (launch overhead: what the CPU pays);
- `copy_bandwidth()`: bytes read + written per second by a device-to-device copy of >= 1 GiB, the floor that
  memory-bound kernels are measured against.
A Table collects rows (name, shape, ours, peers, ratios, fraction of the floor), prints them aligned, and writes
JSON (and a PNG bar chart when matplotlib is installed) into benchmarks/results/. Progress goes to stderr.
"""
from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

RESULTS_DIR = Path(__file__).resolve().parent / "results"
L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than the H200's 60 MB L2


def log(message: str) -> None:
    """A progress line on stderr (stdout carries the tables)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def triton_peers() -> Any:
    """benchmarks/triton_peers.py (Triton's versions of the kernels), or None with a log line when triton is absent."""
    try:
        from . import triton_peers as peers
    except ImportError as e:
        log(f"triton is not importable ({e}): no Triton column")
        return None
    return peers


# ----------------------------------------------------------------------------------------------- timing


def do_bench(fn: Callable[[], Any], warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds per call of `fn` on the GPU; warmup and rep are in milliseconds, as in Triton."""
    try:
        from triton.testing import do_bench as triton_do_bench
    except ImportError:
        return _event_bench(fn, warmup, rep)
    return float(triton_do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def kernel_times(fn: Callable[[], Any], repeat: int = 5) -> list[tuple[str, float]]:
    """Each CUDA kernel's GPU time in microseconds per call of `fn` (torch.profiler over `repeat` calls after one
    warm-up), largest first. Unlike do_bench's call-to-call time it leaves out the host's work between launches:
    a multi-kernel op that is host-bound shows the difference."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / repeat) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


def _event_bench(fn: Callable[[], Any], warmup: int, rep: int) -> float:
    import torch

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup / estimate))):
        fn()
    n = max(1, int(rep / estimate))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def host_time_us(fn: Callable[[], Any], n: int = 20000, warmup: int = 500, repeats: int = 3) -> float:
    """Microseconds of host time per call: n calls in a loop, then one synchronize; the best of `repeats` runs.

    For launch overhead: the kernels are tiny, so the loop is bound by the CPU, not the GPU.
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t
        torch.cuda.synchronize()
        best = min(best, elapsed)
    return best / n * 1e6


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes per second (read + written) of a device-to-device copy of `nbytes` (>= 1 GiB) bytes."""
    import torch

    nbytes = max(nbytes, 1 << 30)
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    ms = do_bench(lambda: dst.copy_(src))
    bandwidth = 2 * nbytes / (ms * 1e-3)
    log(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s ({nbytes >> 20} MiB copied in {ms:.3f} ms)")
    return bandwidth


def environment() -> dict[str, Any]:
    """What the numbers were measured on (stored with every table)."""
    info: dict[str, Any] = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                            "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.run"] + sys.argv[1:])}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


# ------------------------------------------------------------------------------------------------- table


@dataclass
class Row:
    name: str
    shape: str
    ours: float
    peers: dict[str, float | None]
    floor: float | None = None  # the best possible value (roofline / raw launch), same unit as ours

    @property
    def ratios(self) -> dict[str, float | None]:
        """peer / ours for each peer: above 1 means we are faster (lower is better for times)."""
        return {p: (v / self.ours if v and self.ours else None) for p, v in self.peers.items()}

    @property
    def fraction_of_floor(self) -> float | None:
        """floor / ours: 1.0 means at the floor."""
        return self.floor / self.ours if self.floor and self.ours else None


@dataclass
class Table:
    """Rows of one benchmark, in one unit (times: lower is better)."""

    name: str
    title: str
    unit: str = "us"
    peer_names: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)  # "floor": what the floor column measures

    def add(self, name: str, shape: str, ours: float, peers: dict[str, float | None] | None = None,
            floor: float | None = None) -> Row:
        row = Row(name, shape, ours, dict(peers or {}), floor)
        for p in row.peers:
            if p not in self.peer_names:
                self.peer_names.append(p)
        self.rows.append(row)
        log(f"{self.name}: {name} {shape}: ours {ours:.3f} {self.unit}"
            + "".join(f", {p} {_fmt(v)}" for p, v in row.peers.items()))
        return row

    def format(self) -> str:
        floor_name = self.notes.get("floor", "floor")
        header = ["name", "shape", f"ours ({self.unit})"] + [f"{p} ({self.unit})" for p in self.peer_names]
        header += [f"{floor_name} ({self.unit})"] + [f"{p}/ours" for p in self.peer_names] + ["floor/ours"]
        lines = [header]
        for r in self.rows:
            ratios = r.ratios
            lines.append([r.name, r.shape, _fmt(r.ours)] + [_fmt(r.peers.get(p)) for p in self.peer_names]
                         + [_fmt(r.floor)] + [_fmt(ratios.get(p), "x") for p in self.peer_names]
                         + [_fmt(r.fraction_of_floor)])
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = [f"## {self.title}"]
        for i, line in enumerate(lines):
            text.append("  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths))))
            if i == 0:
                text.append("  ".join("-" * w for w in widths))
        return "\n".join(text)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "title": self.title, "unit": self.unit, "peers": self.peer_names,
            "environment": environment(), "notes": self.notes,
            "rows": [{"name": r.name, "shape": r.shape, "ours": r.ours, "peers": r.peers, "ratios": r.ratios,
                      "floor": r.floor, "fraction_of_floor": r.fraction_of_floor} for r in self.rows],
        }

    def save(self, folder: Path = RESULTS_DIR) -> list[Path]:
        """Write NAME.json (and NAME.png when matplotlib is available); returns the paths written."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.json"
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        written = [path]
        png = self.plot(folder / f"{self.name}.png")
        if png is not None:
            written.append(png)
        log(f"{self.name}: wrote {', '.join(str(p) for p in written)}")
        return written

    def plot(self, path: Path) -> Path | None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        series = ["ours"] + self.peer_names
        width = 0.8 / len(series)
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(self.rows) * len(series)), 4))
        for i, s in enumerate(series):
            values = [r.ours if s == "ours" else (r.peers.get(s) or 0.0) for r in self.rows]
            ax.bar([x + i * width for x in range(len(self.rows))], values, width, label=s)
        ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(self.rows))])
        ax.set_xticklabels([f"{r.name}\n{r.shape}" for r in self.rows], fontsize=8)
        ax.set_ylabel(self.unit)
        ax.set_title(self.title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def _fmt(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.1f}{suffix}"
    return f"{value:.3g}{suffix}" if abs(value) < 0.01 else f"{value:.2f}{suffix}"
