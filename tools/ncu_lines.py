"""Where a kernel's time goes by kernel source line: the warp-stall samples of Nsight Compute's source page
(the CSV that tools/ncu_lines.sh writes), summed per line, with each line's leading stall reasons.

    python tools/ncu_lines.py CSV [--top N] [--source FILE]

Each row: the line, its share of all stall samples, the instructions it executed (warp level), its three largest
stall reasons (share of the line's samples) and the line's text. Lines are the PTX `.loc` lines: code inlined
from an `@mt.func` helper counts at the helper's line, whichever call it came from. The totals per stall reason
close the report (stall_selected is issue, not a stall).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_lines(path: Path) -> tuple[list[dict[str, float]], list[str], dict[int, str]]:
    """(per source line: its metrics, the stall-reason column names, line number -> source text)."""
    rows = list(csv.reader(path.open()))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Line No"), None)
    if start is None:
        raise SystemExit(f"{path}: no 'Line No' header (not an `ncu --page source --print-source cuda,sass` CSV)")
    header = rows[start]
    stalls = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    col = {h: i for i, h in reversed(list(enumerate(header)))}  # first occurrence of each name
    out, text = [], {}
    for r in rows[start + 1:]:
        if not r or not r[0].strip():
            continue  # a SASS row under its line
        line = int(r[0])
        text[line] = r[1].strip()
        metrics = {"line": float(line), "samples": _number(r[col[SAMPLES]]), "executed": _number(r[col[EXECUTED]])}
        metrics.update({s: _number(r[col[s]]) for s in stalls})
        out.append(metrics)
    return out, stalls, text


def report(path: Path, top: int) -> str:
    lines, stalls, text = read_lines(path)
    total = sum(m["samples"] for m in lines) or 1.0
    out = [f"{path.name}: {int(total)} stall samples over {len(lines)} source lines",
           f"{'line':>5} {'share':>6} {'executed':>11}  leading stalls (of the line's samples) | source"]
    for m in sorted(lines, key=lambda m: -m["samples"])[:top]:
        lead = sorted(stalls, key=lambda s: -m[s])[:3]
        reasons = ", ".join(f"{s[6:]} {m[s] / (m['samples'] or 1):.0%}" for s in lead if m[s])
        out.append(f"{int(m['line']):5d} {m['samples'] / total:6.1%} {int(m['executed']):11d}  {reasons} | "
                   f"{text[int(m['line'])][:70]}")
    by_reason = {s: sum(m[s] for m in lines) for s in stalls}
    out.append("all lines: " + ", ".join(f"{s[6:]} {v / total:.1%}" for s, v in
                                         sorted(by_reason.items(), key=lambda kv: -kv[1]) if v / total >= 0.005))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    for path in args.csv:
        print(report(path, args.top))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
