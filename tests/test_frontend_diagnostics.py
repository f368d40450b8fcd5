"""Every user mistake is a CompilationError naming the kernel's file and the exact line of the mistake."""
from __future__ import annotations

import inspect
import os

import pytest

from minitriton.errors import CompilationError
from minitriton.frontend import compile_to_ir
from minitriton.ir import PointerType, types as T

from data import bad_kernels as bad

DATA_FILE = os.path.realpath(bad.__file__)

# kernel -> (a substring the message must contain, extra compile arguments)
CASES = {
    "unsupported_break": ("'break' is not supported", {}),
    "unsupported_while_else": ("'while ... else' is not supported", {}),
    "shape_mismatch": ("cannot be broadcast together", {}),
    "non_power_of_two": ("powers of two", {}),
    "missing_constexpr": ("missing constexpr 'BLOCK'", {}),
    "runtime_arange_bound": ("must be a compile-time integer", {}),
    "pointer_plus_float": ("pointer offsets must be integers", {}),
    "dot_shape_mismatch": ("dot shapes do not match", {}),
    "dot_dtype_mismatch": ("dot operands must have one dtype", {}),
    "loop_carried_type_change": ("changes type from tensor<16xbf16> to tensor<16xf32>", {}),
    "branch_type_mismatch": ("variable 'v' is tensor<16xi32> on one path and tensor<16xf32>", {}),
    "tile_condition": ("must be a scalar", {}),
    "call_plain_python": ("cannot call 'exp' from kernel code", {}),
    "use_global_tensor": ("global 'GLOBAL_TENSOR' is a Tensor", {}),
    "undefined_name": ("name 'z' is not defined", {}),
    "error_inside_helper": ("name 'undefined_thing' is not defined", {}),
    "store_shape_mismatch": ("cannot store a value of shape (16,) through pointers of shape ()", {}),
    "helper_wrong_arg_count": ("takes 1 positional arguments but 2 were given", {}),
    "builtin_wrong_arg_count": ("missing 1 required positional argument", {}),
    "bad_cast_target": ("expected a dtype", {}),
    "bitcast_width": ("bitcast needs equal bit widths", {}),
    "load_non_pointer": ("load needs a pointer", {}),
    "load_bad_cache_modifier": ("cache_modifier=...) must be one of '', '.ca', '.cg'", {}),
    "load_bad_l2_prefetch": ("l2_prefetch=...) must be 0 or one of 64, 128, 256 (bytes), got 512", {}),
    "load_layout_rank": ("needs a tile load with one entry per dim (rank 1)", {}),
    "fence_bad_sem": ("fence(sem=...) must be one of 'acq_rel', 'release', 'acquire', got 'seq_cst'", {}),
    "prefetch_bad_level": ("prefetch(level=...) must be one of 'L1', 'L2', got 'L3'", {}),
    "return_in_runtime_loop": ("'return' inside a runtime for/while loop", {}),
    "float_shift": ("'<<' needs integer operands", {}),
    "used_after_loop": ("'tmp' is only defined inside a loop or branch", {}),
    "static_assert_fails": ("static_assert failed: BLOCK must be a multiple of 16", {"BLOCK": 24}),
    "division_by_zero_constexpr": ("ZeroDivisionError", {"BLOCK": 16}),
    "reduce_bad_axis": ("axis 1 is out of range", {}),
    "lambda_expression": ("'Lambda' expressions are not supported", {}),
}


def error_line(name: str) -> int:
    """The line marked `# ERR` in the kernel (or in the helper it calls)."""
    fn = getattr(bad, name)
    lines, start = inspect.getsourcelines(fn)
    marked = [start + i for i, line in enumerate(lines) if line.rstrip().endswith("# ERR")]
    if not marked:  # the mistake is inside the helper the kernel calls
        lines, start = inspect.getsourcelines(bad.helper_with_error.fn)
        marked = [start + i for i, line in enumerate(lines) if line.rstrip().endswith("# ERR")]
    assert len(marked) == 1, name
    return marked[0]


def compile_bad(name: str, constexprs: dict) -> CompilationError:
    fn = getattr(bad, name)
    params = [p for p in inspect.signature(fn).parameters if p not in constexprs and p != "BLOCK"]
    arg_types = {p: (PointerType(T.f32) if p.endswith("_ptr") else T.i32) for p in params}
    with pytest.raises(CompilationError) as info:
        compile_to_ir(fn, arg_types, constexprs)
    return info.value


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_names_file_line_and_reason(name: str) -> None:
    expected, constexprs = CASES[name]
    err = compile_bad(name, constexprs)
    text = str(err)
    line = error_line(name)
    assert err.loc is not None, text
    assert os.path.realpath(err.loc.file) == DATA_FILE, text
    assert err.loc.line == line, f"expected line {line}, got {err.loc.line}: {text}"
    assert f"{err.loc.file}:{line}:" in text
    assert expected in text, text


def test_error_shows_the_source_line_and_column() -> None:
    err = compile_bad("pointer_plus_float", {})
    text = str(err)
    assert "p = x_ptr + 1.5" in text
    caret_line = text.splitlines()[-1]
    source_line = text.splitlines()[-2]
    assert caret_line.index("^") == source_line.index("x_ptr + 1.5")


def test_no_compiler_traceback_leaks_for_user_mistakes() -> None:
    """Errors are CompilationErrors (not TypeError/AttributeError from inside the compiler)."""
    for name, (_, constexprs) in CASES.items():
        err = compile_bad(name, constexprs)
        assert type(err) is CompilationError


def test_wrong_parameter_names() -> None:
    with pytest.raises(CompilationError, match="unknown parameter"):
        compile_to_ir(bad.undefined_name, {"x_ptr": PointerType(T.f32), "nope": T.i32}, {})
    with pytest.raises(CompilationError, match="missing argument 'x_ptr'"):
        compile_to_ir(bad.undefined_name, {}, {})
