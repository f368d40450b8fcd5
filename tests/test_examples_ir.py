"""Every kernel's IR (each ahead-of-time specialization of the examples and the K3 kernels), at every compiler
stage, survives print -> parse -> print unchanged, verifies, and (when real MLIR is installed) parses as MLIR."""
from __future__ import annotations

import importlib

import pytest

from minitriton.compiler import PIPELINE, build_ir
from minitriton.ir import parse_module, print_module, verify
from minitriton.runtime.jit import Kernel

MODULES = [f"minitriton.kernels.examples.{m}" for m in
           ("vector_add", "softmax", "rmsnorm", "matmul", "attention", "cumsum")] + \
          [f"minitriton.kernels.{m}" for m in ("flash_kda", "kda_decode", "warp_decode")]


def specializations() -> list:
    out = []
    for modname in MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for obj in vars(mod).values():
            if isinstance(obj, Kernel):
                out += [pytest.param(spec, id=f"{modname.split('.')[-1]}:{spec.describe()}")
                        for spec in obj.specializations]
    return out


SPECS = specializations()


def test_every_example_declares_specializations() -> None:
    names = {p.id.split(":")[0] for p in SPECS}
    assert {"vector_add", "softmax", "rmsnorm", "matmul", "attention", "cumsum"} <= names


def stage_texts(spec) -> dict[str, str]:
    module, stages = build_ir(spec.kernel.fn, {n: s.type for n, s in spec.args.items()}, dict(spec.constexprs),
                              divisibility={n: s.divisibility for n, s in spec.args.items()},
                              equal_to_one={n for n, s in spec.args.items() if s.equal_to_one},
                              num_warps=spec.num_warps, num_stages=spec.num_stages, keep_ir=True)
    assert list(stages) == ["frontend"] + list(PIPELINE)
    return stages


@pytest.mark.parametrize("spec", SPECS)
def test_ir_round_trips_at_every_stage(spec) -> None:
    for stage, text in stage_texts(spec).items():
        module = parse_module(text)
        verify(module)
        assert print_module(module) == text, f"stage {stage} does not round-trip"


@pytest.mark.parametrize("spec", SPECS)
def test_real_mlir_parses_every_stage(spec) -> None:
    pytest.importorskip("numba_cuda_mlir", reason="real MLIR is not installed (pip install numba-cuda-mlir==0.6.0)")
    from test_mlir_compat import assert_mlir_parses

    for text in stage_texts(spec).values():
        assert_mlir_parses(text)
