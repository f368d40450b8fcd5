"""Real MLIR reads the IR text our printer emits: its generic op syntax, our type and attribute spellings, and the
verifiers of the ops MLIR knows (builtin.module, scf.for / scf.if / scf.while / scf.yield / scf.condition); the
mt.* ops stay unregistered. Uses the MLIR bindings of numba-cuda-mlir 0.6.0 (`pip install numba-cuda-mlir==0.6.0`,
or the `mlir` extra); skipped when they are not installed. `assert_mlir_parses` is meant for reuse on any dump."""
from __future__ import annotations

import re

import pytest

try:
    from numba_cuda_mlir._mlir import ir as mlir_ir
except ImportError as exc:  # not only ModuleNotFoundError: the bindings' native libraries may fail to load
    pytest.skip(f"real MLIR is not available (pip install numba-cuda-mlir==0.6.0): {exc}", allow_module_level=True)

from minitriton.ir import (Builder, Location, Module, function_body, make_function, parse_module,
                           print_module)
from test_ir_parser import HAND_WRITTEN, sample_modules

# `%3 = "mt.add"(`, `"scf.yield"(`: one per op, in our printer's output and in MLIR's generic form alike
_OP_START = re.compile(r'^\s*(?:%[\w$.\-]+(?::\d+)? = )?"[\w.$\-]+"\(', re.M)


def assert_mlir_parses(text: str) -> str:
    """Parse and verify `text` with real MLIR (unregistered dialects allowed) and check that it kept every op.

    Returns MLIR's generic-form print of the module. Fails the test with MLIR's diagnostics on any error.
    """
    with mlir_ir.Context() as ctx:
        ctx.allow_unregistered_dialects = True
        try:
            module = mlir_ir.Module.parse(text)
            module.operation.verify()
        except mlir_ir.MLIRError as e:
            pytest.fail(f"real MLIR rejects our IR:\n{e}\n--- text ---\n{text}", pytrace=False)
        generic = module.operation.get_asm(print_generic_op_form=True)
    ours = _OP_START.findall(text)
    implicit_module = 0 if ours and '"builtin.module"' in ours[0] else 1  # MLIR wraps other top-level ops
    theirs = len(_OP_START.findall(generic))
    assert theirs == len(ours) + implicit_module, f"MLIR holds {theirs} ops, our text {len(ours)}"
    return generic


@pytest.mark.parametrize("name", list(sample_modules()))
def test_mlir_parses_printed_samples(name: str) -> None:
    assert_mlir_parses(print_module(sample_modules()[name]))


def test_mlir_parses_printed_samples_without_locations() -> None:
    assert_mlir_parses(print_module(sample_modules()["all_ops"], with_locs=False))


def test_mlir_parses_reprinted_hand_written_text() -> None:
    assert_mlir_parses(HAND_WRITTEN)  # free-form names, block labels and // comments are MLIR syntax too
    assert_mlir_parses(print_module(parse_module(HAND_WRITTEN)))


def test_mlir_keeps_special_float_bits() -> None:
    generic = assert_mlir_parses(print_module(sample_modules()["all_ops"]))
    for bits in ("0x7FF0000000000000", "0xFFF0000000000000", "0x7FF8000000000000"):
        assert bits in generic


def test_mlir_parses_control_characters_in_strings() -> None:
    func = make_function("k", [], [], loc=Location("odd\x0bname.py", 1, 0), note="form\x0cfeed \x01 \x7f")
    Builder(function_body(func)).create("mt.return")
    assert_mlir_parses(print_module(Module([func])))


def test_assert_mlir_parses_can_fail() -> None:
    bad = print_module(Module()).replace('"builtin.module"() ({', '"builtin.module"(%x) ({')
    with pytest.raises(pytest.fail.Exception, match="real MLIR rejects"):
        assert_mlir_parses(bad)
