"""Run benchmark tables: `python -m benchmarks.run` lists them, `python -m benchmarks.run NAME ...` runs them
(`all` runs every one), `--summary NAME ...` reprints saved results from benchmarks/results/.

Each table is a module with a `run() -> Table` (or a tuple of Tables) function; its docstring's first line describes it here.
Tables print to stdout and save JSON (+ PNG) to benchmarks/results/; progress lines go to stderr.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from .harness import RESULTS_DIR, Row, Table, log

# table name -> module (imported only when listed or run)
TABLES: dict[str, str] = {
    "launch": "benchmarks.launch_overhead",
    "bandwidth": "benchmarks.bandwidth",
    "gemm": "benchmarks.gemm",
    "flash_kda": "benchmarks.bench_flash_kda",
    "warp_decode": "benchmarks.bench_warp_decode",
    "kda_decode": "benchmarks.bench_kda_decode",
}


def describe(name: str) -> str:
    try:
        doc = importlib.import_module(TABLES[name]).__doc__ or ""
    except Exception as e:  # listing must not die with one broken table
        return f"(cannot import {TABLES[name]}: {type(e).__name__}: {e})"
    return doc.strip().splitlines()[0] if doc.strip() else ""


def run_tables(names: list[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("benchmarks need a CUDA GPU\n")
        return 1
    for name in names:
        log(f"running table '{name}'")
        result: Table | tuple[Table, ...] = importlib.import_module(TABLES[name]).run()
        for table in result if isinstance(result, tuple) else (result,):
            print(table.format(), flush=True)
            table.save()
    return 0


def summary(names: list[str]) -> int:
    """Reprint saved tables compactly (tools/gpu_check.sh ends with this)."""
    for name in names:
        path = RESULTS_DIR / f"{name}.json"
        if not path.exists():
            print(f"## {name}: no results ({path} missing)")
            continue
        data = json.loads(path.read_text())
        table = Table(data["name"], data["title"], data["unit"], list(data["peers"]), notes=data.get("notes", {}))
        table.rows = [Row(r["name"], r["shape"], r["ours"], r["peers"], r["floor"]) for r in data["rows"]]
        print(table.format())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="*", help=f"tables to run: {', '.join(TABLES)} or all")
    parser.add_argument("--summary", action="store_true", help="reprint saved results instead of running")
    args = parser.parse_args(argv)
    names = list(TABLES) if args.tables == ["all"] else args.tables
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        sys.stderr.write(f"unknown table(s) {', '.join(unknown)}; tables: {', '.join(TABLES)}\n")
        return 1
    if not names:
        for name in TABLES:
            print(f"{name:12s} {describe(name)}")
        return 0
    return summary(names) if args.summary else run_tables(names)


if __name__ == "__main__":
    sys.exit(main())
