"""tools/ncu_lines.py on a small CSV in the layout of `ncu --page source --csv --print-source cuda,sass`: source
rows (a line number) carry the line's summed metrics, SASS rows under them have none; the report ranks lines by
stall samples with their leading reasons, and a CSV without the header is a clear error."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import ncu_lines  # noqa: E402

HEADER = ('"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)",'
          '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_long_sb","stall_wait",'
          '"stall_long_sb (Not Issued)"')
ROWS = [
    '"File Path","/k.py"',
    '"Function Name","k"',
    HEADER,
    '"12","x = mt.load(p)","-","-","300","250","1000","270","30","200"',
    '"","","0x10","LDG.E R2, [R4]","0","0","500","0","0","0"',
    '"13","y = mt.dot(a, b)","-","-","100","60","4,000","0","90","0"',
]


def test_lines_are_ranked_with_their_leading_stalls(tmp_path: Path) -> None:
    path = tmp_path / "k.csv"
    path.write_text("\n".join(ROWS) + "\n")
    report = ncu_lines.report(path, top=5).splitlines()
    assert report[0].startswith("k.csv: 400 stall samples over 2 source lines")
    assert report[2].split()[:3] == ["12", "75.0%", "1000"] and "long_sb 90%" in report[2]
    assert report[3].split()[:3] == ["13", "25.0%", "4000"] and "wait 90%" in report[3]
    assert report[-1] == "all lines: long_sb 67.5%, wait 30.0%"


def test_a_csv_without_the_source_header_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text('"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(SystemExit, match="no 'Line No' header"):
        ncu_lines.report(path, top=5)
