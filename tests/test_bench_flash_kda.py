"""benchmarks/bench_flash_kda.py's plumbing without a GPU: both tables (call to call, kernel sums) get a row per
shape with the same peer, the kernel sum adds up the profiler's kernels, and the floor is the larger of the bytes
and FLOPs floors."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import bench_flash_kda as bench


def test_run_fills_the_call_and_the_kernel_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.harness, "copy_bandwidth", lambda: 3.0e12)
    monkeypatch.setattr(bench, "make_problem", lambda B, T, H: SimpleNamespace(shape=(B, T, H, 128, 128)))
    monkeypatch.setattr(bench, "ours", lambda p, cp: ("ours", p))
    monkeypatch.setattr(bench, "fla", lambda p: ("fla", p))
    call_ms = {"ours": 0.7, "fla": 1.3}
    monkeypatch.setattr(bench, "time_ms", lambda make: call_ms[make()[0]])
    kernels_us = {"ours": [("a", 400.0), ("b", 275.0)], "fla": [("h", 190.0), ("o", 370.0)]}
    monkeypatch.setattr(bench.harness, "kernel_times", lambda fn: kernels_us[fn[0]])
    calls, kernels = bench.run(shapes=[(1, 8192, 12)])
    (row,), (krow,) = calls.rows, kernels.rows
    assert (row.ours, row.peers) == (0.7, {"fla": 1.3})
    assert krow.ours == pytest.approx(0.675) and krow.peers["fla"] == pytest.approx(0.56)
    dims = (1, 8192, 12, bench.HEAD_DIM, bench.HEAD_DIM)
    floor = max(bench.min_bytes(*dims) / 3.0e12, bench.algorithm_flops(*dims) / bench.PEAK_FLOPS) * 1e3
    assert row.floor == pytest.approx(floor) and krow.floor == pytest.approx(floor)
    assert "fla/ours" in kernels.format()


def test_kernel_ms_reports_a_peer_that_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise ImportError("no fla here")

    assert bench.kernel_ms(broken) is None
