"""Every ahead-of-time specialization of the examples and the K3 kernels compiles to PTX that ptxas 13.0 accepts for
sm_90a (skipped, with the reason, where ptxas is absent); the examples compile without register spills."""
from __future__ import annotations

import shutil

import pytest

from test_examples_ir import SPECS

pytestmark = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")


@pytest.mark.parametrize("spec", SPECS)
def test_ptxas_accepts(spec) -> None:
    compiled = spec.compile(target="cubin")
    assert compiled.cubin, "ptxas produced no cubin"
    assert ".target sm_90a" in compiled.ptx and ".loc" in compiled.ptx
    if spec.kernel.fn.__module__.startswith("minitriton.kernels.examples"):
        meta = compiled.metadata
        assert meta.get("spill_stores", 0) == 0 and meta.get("spill_loads", 0) == 0, compiled.report()
