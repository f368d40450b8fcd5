"""How many SASS instructions does each way of rounding an f32 to tf32 cost on sm_90a?

Assembles one tiny kernel per form with ptxas and counts its SASS with nvdisasm (or cuobjdump), so the
codegen's choice in codegen/mma.py (`_round_tf32`, `_words_tf32`) rests on a measurement, not a guess:

    python tools/tf32_round_probe.py          # needs ptxas and nvdisasm (or cuobjdump) on PATH

Forms: cvt.rna.tf32.f32 (nearest, ties away: what the interpreter's round_tf32 emulates), cvt.rn.tf32.f32
(sm_90's ties-to-even form), and the integer nearest-away `(bits + 0x1000) & 0xFFFFE000` with a NaN select.
"""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile

FORMS = {
    "cvt_rna": ["cvt.rna.tf32.f32 %r2, %f1;"],
    "cvt_rn": ["cvt.rn.tf32.f32 %r2, %f1;"],
    "int_rna_nan": ["mov.b32 %r3, %f1;", "add.s32 %r4, %r3, 4096;", "and.b32 %r5, %r4, -8192;",
                    "setp.num.f32 %p1, %f1, %f1;", "selp.b32 %r2, %r5, %r3, %p1;"],
    "int_rna": ["mov.b32 %r3, %f1;", "add.s32 %r4, %r3, 4096;", "and.b32 %r2, %r4, -8192;"],
}


def kernel_ptx(name: str, body: list[str]) -> str:
    lines = "\n    ".join(body)
    return f"""
.visible .entry {name}(.param .u64 p) {{
    .reg .b64 %rd<4>; .reg .f32 %f<4>; .reg .b32 %r<8>; .reg .pred %p<2>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    ld.global.f32 %f1, [%rd2];
    {lines}
    st.global.b32 [%rd2+4], %r2;
    ret;
}}"""


def sass_counts(cubin: str) -> dict[str, collections.Counter]:
    tool = shutil.which("nvdisasm")
    cmd = [tool, "-c", cubin] if tool else ["cuobjdump", "-sass", cubin]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    counts: dict[str, collections.Counter] = {}
    current = None
    for line in text.splitlines():
        s = line.strip()
        for name in FORMS:
            if s.startswith((f".text.{name}:", f"Function : {name}")) or s == f"{name}:":
                current = counts.setdefault(name, collections.Counter())
        if current is not None and "/*" in s and ";" in s:
            op = s.split("*/", 1)[-1].strip().split()[0] if s.startswith("/*") else s.split()[0]
            if op.startswith("@"):
                op = s.split("*/", 1)[-1].strip().split()[1]
            current[op.split(".")[0]] += 1
    return counts


def main() -> int:
    ptx = ".version 8.8\n.target sm_90a\n.address_size 64\n" + "".join(kernel_ptx(n, b) for n, b in FORMS.items())
    with tempfile.TemporaryDirectory() as d:
        src, cubin = os.path.join(d, "p.ptx"), os.path.join(d, "p.cubin")
        open(src, "w").write(ptx)
        subprocess.run(["ptxas", "-arch=sm_90a", "-O3", src, "-o", cubin], check=True)
        if not (shutil.which("nvdisasm") or shutil.which("cuobjdump")):
            print("assembled; no nvdisasm / cuobjdump on PATH to count SASS", file=sys.stderr)
            return 1
        counts = sass_counts(cubin)
    for name in FORMS:
        c = counts.get(name, collections.Counter())
        print(f"{name:12s} {sum(c.values()):3d} SASS  {dict(sorted(c.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
