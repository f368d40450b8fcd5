"""The canonicalization passes (constant-fold, cse, dce, canonicalize).

1. Text tests, MLIR-style: every tests/passes/*.mtir file starts with `// RUN: --pass NAME[,NAME]`, holds cases
   separated by `// -----`, each an input kernel plus `// CHECK` lines. A case is parsed, verified, run through the
   passes (run_passes verifies after each), printed without locations and checked with tests/filecheck.py.
2. Folding semantics against numpy / torch on fresh random inputs: every folded value must be bit-identical to
   the reference (floats compared by bits, so -0.0 and NaN count).
3. Builder-built IR for what text tests cannot show well: locations kept, fixed points, idempotence.
4. DSL kernels run in the interpreter as the frontend emits them and after canonicalize: same bits out.
"""
from __future__ import annotations

import math
import re
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

import minitriton as mt
from filecheck import check
from minitriton.frontend import compile_to_ir
from minitriton.interpreter import interpret
from minitriton.ir import (Block, Builder, Location, Module, Operation, PointerType, Region, function_body,
                           make_function, parse_module, print_module, tensor, verify)
from minitriton.ir.types import SCALAR_TYPES, ScalarType, bf16, f16, f32, f64, i1, i32, i64
from minitriton.passes import run_passes
from minitriton.passes.canonicalize import canonicalize_module
from minitriton.passes.constant_fold import normalize, round_exact

PASS_TESTS = Path(__file__).parent / "passes"
RUN_LINE = re.compile(r"^//\s*RUN:\s*--pass\s+(\S+)\s*$")
SEPARATOR = re.compile(r"^//\s*-----\s*$", re.MULTILINE)

# ---------------------------------------------------------------------------------------- 1. text tests


def split_cases(text: str) -> list[tuple[int, str]]:
    """(line offset, text) of each case of a test file."""
    cases, offset, start = [], 0, 0
    for m in SEPARATOR.finditer(text):
        cases.append((offset, text[start:m.start()]))
        offset += text.count("\n", start, m.end())
        start = m.end()
    cases.append((offset, text[start:]))
    return cases


def collect_text_tests() -> list[Any]:
    params = []
    for path in sorted(PASS_TESTS.glob("*.mtir")):
        text = path.read_text()
        run = RUN_LINE.match(text.splitlines()[0]) if text else None
        if run is None:
            raise ValueError(f"{path}: the first line must be `// RUN: --pass NAME[,NAME]`")
        for index, (offset, case) in enumerate(split_cases(text)):
            params.append(pytest.param(path, run.group(1).split(","), offset, case, id=f"{path.name}:{index}"))
    return params


@pytest.mark.parametrize("path, passes, line_offset, case", collect_text_tests())
def test_pass_text(path: Path, passes: list[str], line_offset: int, case: str) -> None:
    module = parse_module(case, str(path))
    verify(module)  # a malformed input is the test's fault, not the pass's
    run_passes(module, passes)
    check(print_module(module, with_locs=False), case, name=str(path), line_offset=line_offset)


def test_text_tests_exist_for_every_pass() -> None:
    runs = {name for p in collect_text_tests() for name in p.values[1]}
    assert {"constant-fold", "cse", "dce", "canonicalize"} <= runs


# -------------------------------------------------------------------------------------- 2. fold semantics

INT_TYPES = [SCALAR_TYPES[n] for n in ("i1", "i8", "ui8", "i16", "ui16", "i32", "ui32", "i64", "ui64")]
FLOAT_TYPES = [f16, bf16, f32, f64]


def fold_kernel(build: Callable[[Builder], list[Any]], out_types: list[ScalarType]) -> list[float | int | None]:
    """Build a kernel whose body `build` fills (returning one value per output), fold it, and read each output:
    the folded constant's number, or None when it did not fold to a constant."""
    func = make_function("k", [PointerType(t) for t in out_types], [f"o{i}" for i in range(len(out_types))])
    b = Builder(function_body(func))
    values = build(b)
    for ptr, v in zip(function_body(func).args, values):
        b.create("mt.store", [ptr, v])
    b.create("mt.return")
    module = run_passes(Module([func]), ["constant-fold"])
    out = []
    for store in [op for op in function_body(func).ops if op.name == "mt.store"]:
        op = store.operands[1].defining_op
        const = op is not None and op.name == "mt.constant"
        out.append(normalize(op.attrs["value"], store.operands[1].type.scalar) if const else None)
    return out


def const(b: Builder, ty: ScalarType, v: float | int) -> Any:
    value = bool(v) if ty.is_bool else float(v) if ty.is_float else int(v)
    return b.create1("mt.constant", [], ty, value=value)


def fold_binary(name: str, ty: ScalarType, pairs: list[tuple[Any, Any]], out: ScalarType | None = None,
                **attrs: Any) -> list[Any]:
    out = out or ty
    return fold_kernel(lambda b: [b.create1(name, [const(b, ty, x), const(b, ty, y)], out, **attrs)
                                  for x, y in pairs], [out] * len(pairs))


def fold_unary(name: str, ty: ScalarType, xs: list[Any], out: ScalarType | None = None) -> list[Any]:
    out = out or ty
    return fold_kernel(lambda b: [b.create1(name, [const(b, ty, x)], out) for x in xs], [out] * len(xs))


def np_dtype(ty: ScalarType) -> Any:
    return np.bool_ if ty.is_bool else np.dtype(ty.numpy_name)


def random_ints(rng: np.random.Generator, ty: ScalarType, n: int) -> list[int]:
    info = np.iinfo(np_dtype(ty)) if not ty.is_bool else None
    lo, hi = (0, 1) if info is None else (int(info.min), int(info.max))
    edges = [lo, hi, 0, 1, lo + 1, hi - 1] + ([-1] if lo < 0 else [])
    small = rng.integers(-20 if lo < 0 else 0, 21, size=n // 4)
    wide = rng.integers(lo, hi, size=n - n // 4, endpoint=True, dtype=np.int64 if lo < 0 else np.uint64)
    return [normalize(int(v), ty) for v in edges + list(small) + list(wide)]


def random_floats(rng: np.random.Generator, ty: ScalarType, n: int) -> list[float]:
    """Values of type `ty`: ordinary, huge, tiny (subnormal), signed zeros, inf and NaN."""
    specials = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 0.5, 3.0]
    scale = {"f16": 8, "bf16": 60, "f32": 60, "f64": 300}[ty.name]
    xs = rng.standard_normal(n) * np.exp2(rng.integers(-scale, scale, size=n))
    return [round_exact(float(x), ty) for x in list(xs) + specials]


def float_ref(ty: ScalarType, xs: list[float]) -> torch.Tensor:
    """Exact values of type `ty` as a torch tensor of that type."""
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}[ty.name]
    return torch.tensor(xs, dtype=torch.float64).to(dtype)  # exact: the values are representable


def same_float(a: float | None, b: float) -> bool:
    if a is None:
        return False
    return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)


@pytest.fixture(autouse=True)
def quiet_numpy() -> Any:
    """The references convert NaN and out-of-range values on purpose; numpy's warnings about it are noise."""
    with np.errstate(all="ignore"):
        yield


@pytest.fixture
def rng() -> np.random.Generator:
    seed = np.random.SeedSequence().entropy
    print(f"seed = {seed}")  # shown on failure
    return np.random.default_rng(seed)


def c_div_rem(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C division by numpy: fmod on integers is C's %, and (a - a % b) / b is then exact."""
    rem = np.fmod(a, b)
    return (a - rem) // b, rem


@pytest.mark.parametrize("ty", INT_TYPES, ids=str)
@pytest.mark.parametrize("name", ["mt.add", "mt.sub", "mt.mul", "mt.div", "mt.rem", "mt.maximum", "mt.minimum",
                                  "mt.and", "mt.or", "mt.xor"])
def test_fold_integer_binary_matches_numpy(name: str, ty: ScalarType, rng: np.random.Generator) -> None:
    xs, ys = random_ints(rng, ty, 60), random_ints(rng, ty, 60)
    pairs = list(zip(xs, ys)) + [(x, x) for x in xs[:5]]
    got = fold_binary(name, ty, pairs)
    a = np.array([p[0] for p in pairs], dtype=np_dtype(ty))
    b = np.array([p[1] for p in pairs], dtype=np_dtype(ty))
    with np.errstate(all="ignore"):
        if ty.is_bool:  # i1 arithmetic is modulo 2, on 0/1
            a, b = a.astype(np.int64), b.astype(np.int64)
        ref = {"mt.add": np.add, "mt.sub": np.subtract, "mt.mul": np.multiply, "mt.maximum": np.maximum,
               "mt.minimum": np.minimum, "mt.and": np.bitwise_and, "mt.or": np.bitwise_or,
               "mt.xor": np.bitwise_xor}.get(name)
        if ref is not None:
            expected = ref(a, b)
        else:
            expected = c_div_rem(a, b)[0 if name == "mt.div" else 1]
    lo = -(1 << (ty.bits - 1)) if ty.is_signed and not ty.is_bool else 0
    for (x, y), g, e in zip(pairs, got, expected.tolist()):
        traps = name in ("mt.div", "mt.rem") and (y == 0 or (lo < 0 and x == lo and y == -1))
        want = None if traps else normalize(int(e), ty)
        assert g == want, f"{name} {ty}: fold({x}, {y}) = {g}, expected {want}"


@pytest.mark.parametrize("ty", INT_TYPES[1:], ids=str)
def test_fold_shifts(ty: ScalarType, rng: np.random.Generator) -> None:
    xs = random_ints(rng, ty, 20)
    amounts = list(range(ty.bits + 3)) + ([-1, -ty.bits] if ty.is_signed else [(1 << ty.bits) - 1])
    pairs = [(x, s) for x in xs for s in amounts]
    shl, shr = fold_binary("mt.shl", ty, pairs), fold_binary("mt.shr", ty, pairs)
    dt = np_dtype(ty)
    for (x, s), gl, gr in zip(pairs, shl, shr):
        a = np.array([x], dtype=dt)
        if 0 <= s < ty.bits:
            want_l = int(np.left_shift(a, np.array([s], dtype=dt))[0])
            want_r = int(np.right_shift(a, np.array([s], dtype=dt))[0])  # arithmetic for signed dtypes
        else:  # over-wide (a negative amount is a huge unsigned one): shl gives 0, shr saturates
            want_l, want_r = 0, (-1 if x < 0 else 0)
        assert (gl, gr) == (want_l, want_r), f"{ty}: {x} << {s} = {gl}, {x} >> {s} = {gr}"


@pytest.mark.parametrize("ty", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("name", ["mt.add", "mt.sub", "mt.mul", "mt.div", "mt.rem", "mt.maximum", "mt.minimum"])
def test_fold_float_binary_matches_torch(name: str, ty: ScalarType, rng: np.random.Generator) -> None:
    xs, ys = random_floats(rng, ty, 80), random_floats(rng, ty, 80)
    pairs = list(zip(xs, ys)) + [(x, y) for x in xs[-9:] for y in ys[-9:]]  # every pair of special values
    got = fold_binary(name, ty, pairs)
    # f16 / bf16 math is computed in f32 and rounded back (ops.py); torch rounds each f32 result the same way
    compute = torch.float64 if ty == f64 else torch.float32
    a = float_ref(ty, [p[0] for p in pairs])
    b = float_ref(ty, [p[1] for p in pairs])
    ref = {"mt.add": torch.add, "mt.sub": torch.sub, "mt.mul": torch.mul, "mt.div": torch.div,
           "mt.rem": torch.fmod, "mt.maximum": torch.fmax, "mt.minimum": torch.fmin}[name]
    expected = ref(a.to(compute), b.to(compute)).to(a.dtype).double().tolist()
    for (x, y), g, e in zip(pairs, got, expected):
        if name in ("mt.maximum", "mt.minimum") and x == y == 0 and math.copysign(1, x) != math.copysign(1, y):
            assert g is None, "max/min of +0 and -0 is left to the hardware"
            continue
        assert same_float(g, e), f"{name} {ty}: fold({x!r}, {y!r}) = {g!r}, expected {e!r}"


@pytest.mark.parametrize("ty", FLOAT_TYPES + INT_TYPES, ids=str)
@pytest.mark.parametrize("predicate", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_fold_cmp_matches_numpy(ty: ScalarType, predicate: str, rng: np.random.Generator) -> None:
    make = random_floats if ty.is_float else random_ints
    xs, ys = make(rng, ty, 30), make(rng, ty, 30)
    pairs = list(zip(xs, ys)) + [(x, x) for x in xs]
    got = fold_binary("mt.cmp", ty, pairs, out=i1, predicate=predicate)
    op = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
          "ge": np.greater_equal}[predicate]
    dt = np.float64 if ty.is_float else np.int64 if ty.is_signed else np.uint64  # exact for these values
    expected = op(np.array([p[0] for p in pairs], dtype=dt), np.array([p[1] for p in pairs], dtype=dt))
    assert got == [int(e) for e in expected], f"cmp {predicate} {ty}"


@pytest.mark.parametrize("ty", FLOAT_TYPES, ids=str)
def test_fold_float_unary(ty: ScalarType, rng: np.random.Generator) -> None:
    xs = random_floats(rng, ty, 60) + [0.5, -0.5, 2.5, -2.5, -0.25]
    for name, ref in [("mt.neg", torch.neg), ("mt.abs", torch.abs), ("mt.floor", torch.floor),
                      ("mt.ceil", torch.ceil)]:
        got = fold_unary(name, ty, xs)
        expected = ref(float_ref(ty, xs)).double().tolist()
        for x, g, e in zip(xs, got, expected):
            assert same_float(g, e), f"{name} {ty}: fold({x!r}) = {g!r}, expected {e!r}"


def test_float_transcendentals_and_fma_are_not_folded() -> None:
    got = fold_kernel(lambda b: [b.create1(f"mt.{n}", [const(b, f32, 0.5)], f32) for n in ("exp", "log", "sqrt")]
                      + [b.create1("mt.fma", [const(b, f32, 2.0)] * 3, f32),
                         b.create1("mt.pow", [const(b, f32, 2.0)] * 2, f32)], [f32] * 5)
    assert got == [None] * 5


@pytest.mark.parametrize("ty", [f16, bf16, f32], ids=str)
def test_round_exact_matches_numpy_and_torch(ty: ScalarType, rng: np.random.Generator) -> None:
    bits = rng.integers(0, 2**64, size=3000, dtype=np.uint64)
    xs = bits.view(np.float64).tolist() + [65519.99, 65520.0, 2.0**-25, 2.0**-24 * 1.5, 3.4028235677973366e38]
    if ty == bf16:  # torch goes f64 -> f32 -> bf16 (two roundings): compare on f32 inputs, rounded once there
        xs = [float(np.float32(x)) for x in xs]
        expected = torch.tensor(xs, dtype=torch.float32).to(torch.bfloat16).double().tolist()
    else:
        expected = np.array(xs, dtype=np.float64).astype(np_dtype(ty)).astype(np.float64).tolist()
    for x, e in zip(xs, expected):
        assert same_float(round_exact(x, ty), e), f"round_exact({x!r}, {ty})"


def test_round_exact_rounds_large_integers_once() -> None:
    v = 2**60 + 2**36 + 1  # just above the f32 halfway point; via f64 it would become the tie and round down
    assert round_exact(v, f32) == float(2**60 + 2**37)
    assert round_exact(v, f32) == float(np.float32(np.int64(v)))
    assert fold_unary("mt.cast", i64, [v, -v], out=f32) == [float(2**60 + 2**37), -float(2**60 + 2**37)]


CAST_TYPES = [SCALAR_TYPES[n] for n in ("i1", "i8", "ui8", "i32", "ui32", "i64", "f16", "bf16", "f32", "f64")]


@pytest.mark.parametrize("src", CAST_TYPES, ids=str)
def test_fold_cast_matches_reference(src: ScalarType, rng: np.random.Generator) -> None:
    xs = (random_floats(rng, src, 40) + [2.5, -2.5, 1e10, -1e10, 255.9, -128.5, -0.5]) if src.is_float \
        else random_ints(rng, src, 40)
    xs = [normalize(x, src) for x in xs]
    for dst in CAST_TYPES:
        got = fold_unary("mt.cast", src, xs, out=dst)
        for x, g in zip(xs, got):
            e = cast_reference(x, src, dst)
            if e is NOT_CHECKED:
                continue
            ok = same_float(g, e) if dst.is_float and e is not None else g == e
            assert ok, f"cast {src} -> {dst} of {x!r}: folded {g!r}, expected {e!r}"


NOT_CHECKED = object()


def cast_reference(x: float | int, src: ScalarType, dst: ScalarType) -> object:
    """mt.cast by numpy / torch (exact cases) and by the rules in ops.py (NaN, saturation, x -> i1)."""
    if dst.is_bool:
        return None if isinstance(x, float) and math.isnan(x) else int(x != 0)
    if dst == bf16:  # torch converts through f32, exact only for inputs that f32 holds (the rest: round_exact tests)
        if not (isinstance(x, float) and math.isnan(x)) and float(np.float32(x)) != x:
            return NOT_CHECKED
        return float(torch.tensor([float(x)], dtype=torch.float32).to(torch.bfloat16).item())
    if dst.is_float:
        return float(np.array([x], dtype=np_dtype(src) if src.is_int else np.float64).astype(np_dtype(dst))[0])
    if src.is_int:
        return int(np.array([x], dtype=np_dtype(src)).astype(np_dtype(dst))[0])
    if math.isnan(x):
        return 0
    info = np.iinfo(np_dtype(dst))
    return int(info.min) if x <= info.min else int(info.max) if x >= info.max else int(np.trunc(x))


_TORCH_FLOAT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
_TORCH_INT_OF_WIDTH = {16: torch.int16, 32: torch.int32, 64: torch.int64}


def bits_by_torch(x: float | int, ty: ScalarType) -> int:
    if ty.is_int:
        return int(x) & ((1 << ty.bits) - 1)
    t = torch.tensor([x], dtype=torch.float64).to(_TORCH_FLOAT[ty.name])
    return t.view(_TORCH_INT_OF_WIDTH[ty.bits]).item() & ((1 << ty.bits) - 1)


def value_by_torch(bits: int, ty: ScalarType) -> float | int:
    if ty.is_int:
        return normalize(bits, ty)
    signed = bits - (1 << ty.bits) if bits >= 1 << (ty.bits - 1) else bits
    return torch.tensor([signed], dtype=_TORCH_INT_OF_WIDTH[ty.bits]).view(_TORCH_FLOAT[ty.name]).item()


@pytest.mark.parametrize("src, dst", [(f32, i32), (i32, f32), (f64, i64), (i64, f64), (f16, SCALAR_TYPES["i16"]),
                                      (SCALAR_TYPES["ui16"], bf16), (bf16, f16), (i32, SCALAR_TYPES["ui32"])],
                         ids=str)
def test_fold_bitcast_matches_torch_view(src: ScalarType, dst: ScalarType, rng: np.random.Generator) -> None:
    xs = random_floats(rng, src, 40) if src.is_float else random_ints(rng, src, 40)
    got = fold_unary("mt.bitcast", src, xs, out=dst)
    for x, g in zip(xs, got):
        if src.is_float and math.isnan(x):
            assert g is None, "NaN bit patterns are not folded"
            continue
        e = value_by_torch(bits_by_torch(x, src), dst)
        if dst.is_float and math.isnan(e):
            assert g is None, "NaN bit patterns are not folded"
        else:
            assert (same_float(g, e) if dst.is_float else g == e), f"bitcast {src} -> {dst} of {x!r}: {g} vs {e}"


def test_fold_shape_ops_of_constants() -> None:
    def build(b: Builder) -> list[Any]:
        s = b.create1("mt.splat", [const(b, f32, 2.5)], tensor([4], f32))
        e = b.create1("mt.expand_dims", [s], tensor([1, 4], f32), axis=0)
        br = b.create1("mt.broadcast", [e], tensor([8, 4], f32))
        r = b.create1("mt.reshape", [br], tensor([32], f32))
        t = b.create1("mt.trans", [br], tensor([4, 8], f32), order=[1, 0])
        return [b.create1("mt.reduce", [r], f32, axis=0, kind="max"), t]

    func = make_function("k", [PointerType(f32), tensor([4, 8], PointerType(f32))], ["o", "p"])
    b = Builder(function_body(func))
    red, t = build(b)
    b.create("mt.store", [function_body(func).args[0], red])
    b.create("mt.store", [function_body(func).args[1], t])
    b.create("mt.return")
    run_passes(Module([func]), ["constant-fold", "dce"])
    ops = function_body(func).ops
    assert [op.name for op in ops] == ["mt.constant"] * 2 + ["mt.reduce", "mt.store", "mt.store", "mt.return"]
    reduced, transposed = ops[2].operands[0], ops[4].operands[1]
    assert (reduced.type, reduced.defining_op.attrs["value"]) == (tensor([32], f32), 2.5)  # reductions stay
    assert (transposed.type, transposed.defining_op.attrs["value"]) == (tensor([4, 8], f32), 2.5)


# -------------------------------------------------------------------------------------- 3. Builder-built IR


def counted_loop_kernel() -> tuple[Module, Operation]:
    """for i in range(0, n): acc += x; unused += i; then store acc (locations on every op)."""
    func = make_function("loop", [PointerType(i32), i32], ["out", "n"])
    out, n = function_body(func).args
    b = Builder(function_body(func), Location("k.py", 3, 4))
    zero, one = const(b, i32, 0), const(b, i32, 1)
    body = Block([i32, i32, i32])
    iv, acc, unused = body.args
    inner = Builder(body, Location("k.py", 5, 8))
    inner.create("scf.yield", [inner.create1("mt.add", [acc, n], i32), inner.create1("mt.add", [unused, iv], i32)])
    loop = b.create("scf.for", [zero, n, one, zero, zero], [i32, i32], regions=[Region([body])])
    b.create("mt.store", [out, loop.results[0]])
    b.create("mt.return")
    return Module([func]), func


def test_dce_drops_unused_carried_value_and_keeps_locations() -> None:
    module, func = counted_loop_kernel()
    verify(module)
    run_passes(module, ["dce"])
    loop = next(op for op in function_body(func).ops if op.name == "scf.for")
    assert len(loop.results) == 1 and len(loop.operands) == 4
    assert [a.index for a in loop.regions[0].block.args] == [0, 1]
    assert [op.name for op in loop.regions[0].block.ops] == ["mt.add", "scf.yield"]
    assert all(op.loc is not None for op in func.walk() if op is not func)
    assert loop.loc == Location("k.py", 3, 4)


def test_fold_keeps_the_folded_ops_location() -> None:
    func = make_function("k", [PointerType(i32)], ["o"])
    b = Builder(function_body(func), Location("k.py", 1, 0))
    x = const(b, i32, 6)
    b.loc = Location("k.py", 9, 2)
    y = b.create1("mt.mul", [x, x], i32)
    b.create("mt.store", [function_body(func).args[0], y])
    b.create("mt.return")
    run_passes(Module([func]), ["canonicalize"])
    folded = function_body(func).ops[0]
    assert (folded.name, folded.attrs["value"], folded.loc) == ("mt.constant", 36, Location("k.py", 9, 2))


def test_canonicalize_reaches_a_fixed_point_and_is_idempotent() -> None:
    text = (PASS_TESTS / "canonicalize.mtir").read_text()
    for _, case in split_cases(text):
        module = parse_module(case)
        canonicalize_module(module)
        once = print_module(module)
        assert canonicalize_module(module) == 0, "a second canonicalize changed something"
        assert print_module(module) == once
        for name in ("constant-fold", "cse", "dce"):
            run_passes(module, [name])
            assert print_module(module) == once, f"{name} still changes canonicalized IR"


# -------------------------------------------------------------- 4. kernels compute the same after canonicalize


@mt.kernel
def folds_everywhere(x_ptr, h_ptr, out_i, out_f, out_h, n, BLOCK: mt.constexpr):
    offs = mt.arange(0, BLOCK)
    x = mt.load(x_ptr + offs)
    k = mt.full((BLOCK,), 100, mt.int8)
    wrapped = (k + k).to(mt.int32)  # i8 wraps to -56
    b = ((x * 1 + 0 - 0) << 0) | 0  # identities: x
    c = b // mt.full((BLOCK,), -3, mt.int32) + b % mt.full((BLOCK,), 5, mt.int32)
    s = (mt.full((BLOCK,), -8, mt.int32) >> 40) + (mt.full((BLOCK,), 1, mt.int32) << 33)  # over-wide shifts
    m7, two = mt.full((BLOCK,), -7, mt.int32), mt.full((BLOCK,), 2, mt.int32)
    mt.store(out_i + offs, c + wrapped + s + x * 0 + m7 // two * 100 + m7 % two)  # C division: -3, -1
    g = x.to(mt.float32) * 1.0 + (-0.0)
    q = mt.full((BLOCK,), 0.1, mt.float32) + mt.full((BLOCK,), 0.2, mt.float32)
    saturated = mt.full((BLOCK,), 1e10, mt.float32).to(mt.int32).to(mt.float32)
    mt.store(out_f + offs, g + q + saturated)
    h = mt.load(h_ptr + offs)
    overflow = mt.full((BLOCK,), 65504.0, mt.float16) + mt.full((BLOCK,), 16.0, mt.float16)
    mt.store(out_h + offs, h * 1.0 + overflow + mt.full((BLOCK,), 0.1, mt.float16) * 3.0)


@mt.kernel
def control_flow(x_ptr, out_ptr, n, BLOCK: mt.constexpr):
    offs = mt.arange(0, BLOCK)
    x = mt.load(x_ptr + offs, mask=offs < n, other=0.0)
    acc = x
    for i in range(0, n * 0):  # n * 0 folds to 0: the loop never runs
        acc = acc + 1.0
    if n - n == 0:  # folds to true: the then-branch is inlined
        acc = acc * 2.0
    else:
        acc = acc - 1.0
    if n > 3:  # stays
        acc = acc + x
    unused = mt.sum(acc * acc, axis=0)  # noqa: F841  (dead)
    mt.store(out_ptr + offs, acc, mask=offs < n)


def run_both(kernel: Any, arg_types: dict[str, Any], args: list[Any]) -> tuple[list[Any], list[Any], Module]:
    """Interpret the kernel as the frontend emits it and after canonicalize, on copies of the same arguments."""
    module = compile_to_ir(kernel.fn, arg_types, {"BLOCK": 16})
    raw = parse_module(print_module(module))  # an independent copy
    run_passes(module, ["canonicalize"])
    outs = []
    for m in (raw, module):
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        interpret(m.functions[0], (1,), copies)
        outs.append(copies)
    return outs[0], outs[1], module


def test_canonicalize_keeps_folded_arithmetic_bit_exact() -> None:
    P = PointerType
    types = {"x_ptr": P(i32), "h_ptr": P(f16), "out_i": P(i32), "out_f": P(f32), "out_h": P(f16), "n": i32}
    x = torch.randint(-2**31, 2**31 - 1, (16,), dtype=torch.int32)
    h = torch.randn(16).to(torch.float16)
    poison = [torch.full((16,), -7, dtype=torch.int32), torch.full((16,), math.nan),
              torch.full((16,), math.nan, dtype=torch.float16)]
    before, after, module = run_both(folds_everywhere, types, [x, h, *poison, 16])
    for b, a in zip(before[2:5], after[2:5]):
        assert torch.equal(b.view(torch.uint8), a.view(torch.uint8)), f"{b} != {a}"  # bit-exact, NaN included
    names = [op.name for op in module.walk()]
    assert names.count("mt.mul") == 0 and names.count("mt.shl") == 0, "the identities and constants folded"


@pytest.mark.parametrize("n", [2, 11, 16])
def test_canonicalize_keeps_control_flow_results(n: int) -> None:
    x = torch.randn(16)
    before, after, module = run_both(control_flow, {"x_ptr": PointerType(f32), "out_ptr": PointerType(f32), "n": i32},
                                     [x, torch.full((16,), math.nan), n])
    assert torch.equal(before[1][:n], after[1][:n]) and torch.equal(before[1][:n], (x * 2 + (x if n > 3 else 0))[:n])
    names = [op.name for op in module.walk()]
    assert "scf.for" not in names and names.count("scf.if") == 1 and "mt.reduce" not in names
