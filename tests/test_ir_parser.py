"""The IR parser (minitriton/ir/parser.py): print -> parse -> print is exact on IR covering every op, hand-written
text with custom names parses, and each kind of error reports its line and column."""
from __future__ import annotations

import math
import struct
import time

import pytest
from hypothesis import given, settings, strategies as st

from minitriton.ir import (OPS, Builder, FunctionType, LayoutAttr, Location, Module, ParseError, PointerType,
                           TensorType, function_body, layout, make_function, parse_module, parse_type, print_module,
                           tensor, verify)
from minitriton.ir.types import TensorDescType, layout, bf16, f16, f32, f64, i1, i32, i64, u8, u16, u32, u64

F32P = PointerType(f32)
ODD_FILE = 'dir with space/k\u00e9r"nel\\x\n.py'  # quote, backslash, newline and non-ASCII in a file name
SPECIAL_FLOATS = [math.inf, -math.inf, math.nan, -1.5, 5e-324, 1e-45, -0.0, 1e300, -2e-05, 0.1, 3.0]


# ------------------------------------------------------------------------------------------ sample IR


def build_all_ops_kernel() -> Module:
    """One kernel using every op in ops.py (the verifier accepts it), with locations on most ops."""
    loc = Location(ODD_FILE, 12, 3)
    desc_type = TensorDescType(tensor([16, 16], f32))
    func = make_function("all_ops", [F32P, F32P, i32, f32, desc_type], ["x", "y", "n", "alpha", "desc"], loc=loc,
                         num_warps=4, divisibility=[16, 16, 1, 1, 1])
    x, y, n, alpha, desc = function_body(func).args
    b = Builder(function_body(func), loc)
    t64, i64t, b64 = tensor([64], f32), tensor([64], i32), tensor([64], i1)

    consts = [b.create1("mt.constant", [], f32, value=v) for v in SPECIAL_FLOATS]
    b.create1("mt.constant", [], f64, value=-math.nan)
    b.create1("mt.constant", [], i32, value=-7)
    b.create1("mt.constant", [], i64, value=-(2**63))
    b.create1("mt.constant", [], u64, value=2**63 - 1)
    b.create1("mt.constant", [], u8, value=255)
    b.create1("mt.constant", [], u16, value=7)
    b.create1("mt.constant", [], u32, value=9)
    b.create1("mt.constant", [], f16, value=0.5)
    true = b.create1("mt.constant", [], i1, value=True)
    zeros = b.create1("mt.constant", [], t64, value=0.0)

    pid = b.create1("mt.program_id", [], i32, axis=0)
    b.create1("mt.num_programs", [], i32, axis=2)
    b.loc = None  # some ops carry no location
    offs = b.create1("mt.arange", [], i64t, start=0, end=64)
    xs = b.create1("mt.addptr", [b.create1("mt.splat", [x], tensor([64], F32P)), offs], tensor([64], F32P))
    ys = b.create1("mt.addptr", [b.create1("mt.splat", [y], tensor([64], F32P)), offs], tensor([64], F32P))
    mask = b.create1("mt.cmp", [offs, b.create1("mt.splat", [n], i64t)], b64, predicate="lt")
    b.loc = Location("plain.py", 40, 0)
    xv = b.create1("mt.load", [xs, mask, zeros], t64)
    yv = b.create1("mt.load", [ys], t64, cache_modifier=".cg", l2_prefetch=256)
    b.create("mt.prefetch", [xs, mask], attrs={"level": "L1"})
    b.create("mt.prefetch", [y], attrs={"level": "L2"})
    b.create("mt.fence", [], attrs={"sem": "release"})
    b.create("mt.griddep_wait", [])
    b.create("mt.griddep_launch", [])

    for name in ("add", "sub", "mul", "div", "rem", "maximum", "minimum", "pow"):
        b.create1(f"mt.{name}", [xv, yv], t64)
    for name in ("and", "or", "xor", "shl", "shr"):
        b.create1(f"mt.{name}", [offs, offs], i64t)
    for name in ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "sin", "cos", "tanh",
                 "floor", "ceil", "erf"):
        b.create1(f"mt.{name}", [xv], t64)
    b.create1("mt.not", [mask], b64)
    fma = b.create1("mt.fma", [xv, yv, xv], t64)
    sel = b.create1("mt.select", [mask, fma, yv], t64)
    b.create1("mt.cast", [sel], tensor([64], bf16))
    b.create1("mt.bitcast", [sel], i64t)
    b.create1("mt.bitcast_split", [sel], tensor([64, 2], bf16))

    row = b.create1("mt.expand_dims", [xv], tensor([1, 64], f32), axis=0)
    a = b.create1("mt.broadcast", [row], tensor([16, 64], f32))
    bt = b.create1("mt.trans", [a], tensor([64, 16], f32), order=[1, 0])
    acc = b.create1("mt.constant", [], tensor([16, 16], f32), value=0.0)
    d = b.create1("mt.dot", [a, bt, acc], tensor([16, 16], f32), input_precision="tf32")
    box = b.create1("mt.descriptor_load", [desc, pid, n], tensor([16, 16], f32))
    b.create("mt.descriptor_store", [desc, n, pid, box])
    flat = b.create1("mt.reshape", [d], tensor([256], f32))
    b.create1("mt.convert_layout", [flat], tensor([256], f32))
    rows = b.create1("mt.extract_slice", [a], tensor([8, 64], f32), offsets=[8, 0], sizes=[8, 64])  # static sub-tiles
    b.create1("mt.concat", [rows, rows], tensor([16, 64], f32), axis=0)
    b.create1("mt.local_alloc", [a], tensor([16, 64], f32).with_encoding(layout("shared", swizzle=128, order=[1, 0])))
    ring = b.create1("mt.alloc_ring", [], tensor([2, 64], f32), stages=2)  # software pipelining (passes/pipeline.py)
    b.create("mt.async_copy", [ring, pid, xs, mask])
    b.create("mt.async_commit")
    b.create("mt.async_wait", attrs={"pending": 0})
    b.create1("mt.local_load", [ring, pid], t64)
    b.create1("mt.ring_slot", [ring, pid], t64)  # a slot read in place (a wgmma operand, passes/pipeline.py)
    b.create("mt.dot_wait", attrs={"pending": 0})
    b.create("mt.ring_release", [ring, pid, true])
    b.create("mt.ring_store", [ring, pid, xv])
    _build_partitions(b, pid)
    total = b.create1("mt.reduce", [flat], f32, axis=0, kind="sum")
    b.create1("mt.scan", [xv], t64, axis=0, kind="max")
    b.create("mt.store", [ys, sel, mask])
    b.create("mt.barrier", [])
    b.create("mt.atomic_add", [xs, xv, mask], [t64])

    _build_control_flow(b, pid, n, total, xv, true, consts[3])
    b.create("mt.return")
    return Module([func])


def _build_partitions(b: Builder, pid) -> None:  # type: ignore[no-untyped-def]
    """mt.warp_specialize with two partitions (warp specialization: frontend/partitions.py)."""
    from minitriton.ir import Block, Region

    regions = []
    for _ in range(2):
        block = Block()
        inner = Builder(block, b.loc)
        inner.create1("mt.add", [pid, pid], i32)
        inner.create("scf.yield")
        regions.append(Region([block]))
    b.create("mt.warp_specialize", attrs={"warps": [4, 4], "registers": [232, 40]}, regions=regions)


def _build_control_flow(b: Builder, pid, n, total, xv, true, scale) -> None:  # type: ignore[no-untyped-def]
    """scf.for carrying (f32, tensor) with a nested two-result scf.if, an scf.while, and a result-less scf.if."""
    from minitriton.ir import Block, Region

    t64 = xv.type
    lb = b.create1("mt.constant", [], i32, value=0)
    one = b.create1("mt.constant", [], i32, value=1)
    body = Block([i32, f32, t64])
    loop = b.create("scf.for", [lb, n, one, total, xv], [f32, t64], regions=[Region([body])])
    iv, s, v = body.args
    inner = Builder(body, Location("loop.py", 3, 8))
    cond = inner.create1("mt.cmp", [iv, pid], i1, predicate="ne")
    then_block, else_block = Block(), Block()
    branch = inner.create("scf.if", [cond], [f32, t64], regions=[Region([then_block]), Region([else_block])])
    then_b = Builder(then_block)
    then_b.create("scf.yield", [then_b.create1("mt.add", [s, scale], f32), v])
    Builder(else_block).create("scf.yield", [s, v])
    inner.create("scf.yield", [branch.results[0], branch.results[1]])

    before, after = Block([i32]), Block([i32])
    b.create("scf.while", [lb], [i32], regions=[Region([before]), Region([after])])
    bb = Builder(before)
    bb.create("scf.condition", [bb.create1("mt.cmp", [before.args[0], n], i1, predicate="lt"), before.args[0]])
    ab = Builder(after)
    ab.create("scf.yield", [ab.create1("mt.add", [after.args[0], one], i32)])

    then_only, empty_else = Block(), Block()
    b.create("scf.if", [true], [], regions=[Region([then_only]), Region([empty_else])])
    Builder(then_only).create("scf.yield")
    Builder(empty_else).create("scf.yield")
    b.create1("mt.mul", [loop.results[0], loop.results[0]], f32)


BLOCKED = layout("blocked", sizePerThread=[1, 4], threadsPerWarp=[8, 4], warpsPerCTA=[4, 1], order=[1, 0])
SLICE = layout("slice", dim=1, parent=BLOCKED)


def build_layout_kernel() -> Module:
    """Tensors with layout encodings (nested slice-of-blocked, an mma layout, an empty one) and odd attributes."""
    func = make_function("tiled", [F32P], ["out"], num_warps=8, divisibility=[16],
                         note='tab\there "quoted" back\\slash\nnewline \u00fc',
                         floats=[1.5, -2e-05, math.inf, -math.inf], flags=[True, False], names=["a", "b"],
                         nested=[[1, 2], [3]], empty=[], elem=bf16, ptr=F32P, fn=FunctionType((i32, F32P)),
                         mma=layout("mma", versionMajor=3, instrShape=[16, 64, 16], name="wgmma"),
                         shared=layout("shared"))
    (out,) = function_body(func).args
    b = Builder(function_body(func), Location("tiled.py", 1, 0))
    rows = b.create1("mt.arange", [], TensorType((64,), i32, SLICE), start=0, end=64)
    col = b.create1("mt.expand_dims", [rows], TensorType((64, 1), i32, BLOCKED), axis=1)
    grid = b.create1("mt.broadcast", [col], TensorType((64, 64), i32, BLOCKED))
    ptrs = b.create1("mt.addptr", [b.create1("mt.splat", [out], TensorType((64, 64), F32P, BLOCKED)), grid],
                     TensorType((64, 64), F32P, BLOCKED))
    vals = b.create1("mt.cast", [grid], TensorType((64, 64), f32, BLOCKED))
    b.create("mt.store", [ptrs, vals])
    b.create("mt.return")
    return Module([func])


def build_empty_kernel() -> Module:
    func = make_function("nothing", [], [])
    Builder(function_body(func)).create("mt.return")
    return Module([func])


def sample_modules() -> dict[str, Module]:
    """Representative modules (also parsed by real MLIR in test_mlir_compat.py)."""
    return {"all_ops": build_all_ops_kernel(), "layouts": build_layout_kernel(), "empty_kernel": build_empty_kernel(),
            "empty_module": Module()}


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("name", list(sample_modules()))
def test_round_trip_is_exact(name: str) -> None:
    module = sample_modules()[name]
    verify(module)
    text = print_module(module)
    parsed = parse_module(text)
    verify(parsed)
    assert print_module(parsed) == text
    assert print_module(parsed, with_locs=False) == print_module(module, with_locs=False)


def test_sample_covers_every_op() -> None:
    used = {o.name for o in build_all_ops_kernel().walk()}
    assert used == set(OPS), f"ops not covered: {set(OPS) - used}"


def test_parsed_values_types_and_attributes() -> None:
    parsed = parse_module(print_module(build_all_ops_kernel()))
    func = parsed.function("all_ops")
    assert func.loc == Location(ODD_FILE, 12, 3)
    assert func.attrs["function_type"] == FunctionType((F32P, F32P, i32, f32, TensorDescType(tensor([16, 16], f32))))
    assert func.attrs["divisibility"] == [16, 16, 1, 1, 1]
    values = [o.attrs["value"] for o in func.walk() if o.name == "mt.constant" and o.result.type == f32]
    for got, want in zip(values, SPECIAL_FLOATS):
        assert struct.pack("<d", got) == struct.pack("<d", want)  # bit-exact, including -0.0 and nan
    loop = next(o for o in func.walk() if o.name == "scf.for")
    body = loop.regions[0].block
    assert [a.type for a in body.args] == [i32, f32, tensor([64], f32)]
    branch = body.ops[1]
    assert branch.name == "scf.if" and len(branch.results) == 2
    assert body.ops[-1].operands == branch.results  # %N#0, %N#1 resolve to the if's results
    pid = next(o for o in func.walk() if o.name == "mt.program_id")
    assert body.ops[0].operands[1] is pid.result  # defined outside the loop


def test_layout_attributes_parse_to_tuples() -> None:
    parsed = parse_module(print_module(build_layout_kernel()))
    func = parsed.function("tiled")
    assert func.attrs["nested"] == [[1, 2], [3]] and func.attrs["empty"] == []
    assert func.attrs["mma"] == layout("mma", versionMajor=3, instrShape=[16, 64, 16], name="wgmma")
    assert func.attrs["shared"] == LayoutAttr("shared")
    assert func.attrs["note"] == 'tab\there "quoted" back\\slash\nnewline \u00fc'
    assert func.attrs["floats"][3] == -math.inf and func.attrs["elem"] == bf16 and func.attrs["ptr"] == F32P
    arange = function_body(func).ops[0]
    assert arange.result.type == TensorType((64,), i32, SLICE)
    assert arange.result.type.encoding.get("parent").get("order") == (1, 0)
    hash(arange.result.type)  # tuples, not lists: the type stays hashable


@pytest.mark.parametrize("text", [
    "i1", "ui8", "ui16", "ui32", "ui64", "bf16", "f64", "!mt.ptr<bf16>", "tensor<4x8xf32>", "tensor<f32>",
    "tensor<4x!mt.ptr<f32>>", "tensor<64x64xf32, #mt.blocked<{sizePerThread = [1, 4], order = [1, 0]}>>",
    "tensor<64xi32, #mt.slice<{dim = 1, parent = #mt.blocked<{sizePerThread = [1, 4], order = [1, 0]}>}>>",
    "(!mt.ptr<f32>, i32) -> ()", "() -> ()", "(i32) -> (f32, i1)",
])
def test_parse_type_round_trips(text: str) -> None:
    assert str(parse_type(text)) == text


def test_parse_type_values() -> None:
    assert parse_type("tensor<4x!mt.ptr<f32>>") == tensor([4], F32P)
    assert parse_type("() -> i32") == FunctionType((), (i32,))


finite_or_special = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True, width=64)


@settings(max_examples=300, deadline=None)
@given(value=finite_or_special, bits=st.integers(0, 2**64 - 1))
def test_random_float_attributes_round_trip(value: float, bits: int) -> None:
    """Any f64 (and any bit pattern, so every NaN payload) reads back bit for bit and prints the same."""
    raw = struct.unpack("<d", struct.pack("<Q", bits))[0]
    func = make_function("k", [], [], values=[value, raw], one=value)
    Builder(function_body(func)).create("mt.return")
    text = print_module(Module([func]))
    attrs = parse_module(text).function("k").attrs
    assert [struct.pack("<d", v) for v in attrs["values"] + [attrs["one"]]] == \
           [struct.pack("<d", v) for v in (value, raw, value)]
    assert print_module(parse_module(text)) == text


@settings(max_examples=200, deadline=None)
@given(s=st.text(st.characters(blacklist_categories=("Cs",))), file=st.text(st.characters(codec="utf-8"), max_size=8))
def test_random_strings_round_trip(s: str, file: str) -> None:
    func = make_function("k", [], [], loc=Location(file, 1, 2), note=s)
    Builder(function_body(func)).create("mt.return")
    text = print_module(Module([func]))
    parsed = parse_module(text).function("k")
    assert parsed.attrs["note"] == s and parsed.loc == Location(file, 1, 2)


def test_hex_floats_of_other_widths() -> None:
    text = '"mt.func"() ({\n}) {a = 0x7F800000 : f32, b = 0xFC00 : f16, c = 0x7FC0 : bf16} : () -> ()'
    attrs = parse_module(text).body.ops[0].attrs
    assert attrs["a"] == math.inf and attrs["b"] == -math.inf and math.isnan(attrs["c"])


# ------------------------------------------------------------------------------------------ hand-written text

HAND_WRITTEN = """\
// RUN: minitriton-opt %s | FileCheck %s
// CHECK-LABEL: scale

"builtin.module"() ({
  "mt.func"() ({
  ^entry(%x: !mt.ptr<f32>, %n: i32):   // block label and names are free-form
    %c0 = "mt.constant"() {value = 0} : () -> i32
    %c1 = "mt.constant"() {value = 1} : () -> i32

    %acc_1 = "mt.constant"() {value = 0.0} : () -> f32
    %0:2 = "scf.for"(%c0, %n, %c1, %acc_1, %c0) ({
    ^bb7(%i: i32, %acc: f32, %k: i32):
      %p = "mt.addptr"(%x, %i) : (!mt.ptr<f32>, i32) -> !mt.ptr<f32>
      %v = "mt.load"(%p) : (!mt.ptr<f32>) -> f32 loc("scale.py":7:12)
      %s = "mt.add"(%acc, %v) : (f32, f32) -> f32
      "scf.yield"(%s, %i) : (f32, i32) -> ()
    }) : (i32, i32, i32, f32, i32) -> (f32, i32)
    // CHECK: mt.store
    "mt.store"(%x, %0#0) : (!mt.ptr<f32>, f32) -> ()
    "mt.return"() : () -> ()
  }) {sym_name = "scale", function_type = (!mt.ptr<f32>, i32) -> (), arg_names = ["x", "n"]} : () -> ()
}) : () -> ()
"""

HAND_WRITTEN_PRINTED = """\
"builtin.module"() ({
  "mt.func"() ({
  ^bb0(%arg0: !mt.ptr<f32>, %arg1: i32):
    %0 = "mt.constant"() {value = 0} : () -> i32
    %1 = "mt.constant"() {value = 1} : () -> i32
    %2 = "mt.constant"() {value = 0.0} : () -> f32
    %3:2 = "scf.for"(%0, %arg1, %1, %2, %0) ({
    ^bb0(%arg2: i32, %arg3: f32, %arg4: i32):
      %4 = "mt.addptr"(%arg0, %arg2) : (!mt.ptr<f32>, i32) -> !mt.ptr<f32>
      %5 = "mt.load"(%4) : (!mt.ptr<f32>) -> f32 loc("scale.py":7:12)
      %6 = "mt.add"(%arg3, %5) : (f32, f32) -> f32
      "scf.yield"(%6, %arg2) : (f32, i32) -> ()
    }) : (i32, i32, i32, f32, i32) -> (f32, i32)
    "mt.store"(%arg0, %3#0) : (!mt.ptr<f32>, f32) -> ()
    "mt.return"() : () -> ()
  }) {sym_name = "scale", function_type = (!mt.ptr<f32>, i32) -> (), arg_names = ["x", "n"]} : () -> ()
}) : () -> ()
"""


def test_hand_written_names_are_renumbered() -> None:
    module = parse_module(HAND_WRITTEN)
    verify(module)
    assert print_module(module) == HAND_WRITTEN_PRINTED
    func = module.function("scale")
    loop = function_body(func).ops[3]
    assert function_body(func).ops[4].operands[1] is loop.results[0]


def test_top_level_ops_are_wrapped_in_a_module() -> None:
    text = '"mt.func"() ({\n  "mt.return"() : () -> ()\n}) {sym_name = "a", function_type = () -> ()} : () -> ()\n'
    module = parse_module(text + text.replace('"a"', '"b"'))
    assert [f.attrs["sym_name"] for f in module.functions] == ["a", "b"]
    verify(module)


def test_empty_text_is_an_empty_module() -> None:
    assert print_module(parse_module("// nothing\n\n")) == print_module(Module())


def test_block_label_without_arguments() -> None:
    """MLIR's own generic print of an empty module gives its empty block a bare `^bb0:` header."""
    module = parse_module('"builtin.module"() ({\n^bb0:\n}) : () -> ()\n')
    assert len(module.op.regions[0].blocks) == 1 and not module.body.ops and not module.body.args


# ------------------------------------------------------------------------------------------ errors

FUNC_HEAD = '"mt.func"() ({\n^bb0(%a: i32):\n'
FUNC_TAIL = '  "mt.return"() : () -> ()\n}) {sym_name = "k", function_type = (i32) -> ()} : () -> ()\n'


@pytest.mark.parametrize("body, line, column, message", [
    ('  %0 = "mt.add"(%a %a) : (i32, i32) -> i32\n', 3, 20, "unexpected '%a'"),
    ('  %0 = "mt.add"(%a, %b) : (i32, i32) -> i32\n', 3, 21, "use of undefined value %b"),
    ('  %a = "mt.neg"(%a) : (i32) -> i32\n', 3, 3, "redefinition of value %a"),
    ('  %0 = "mt.neg"(%a) : (i32) -> i33\n', 3, 32, "unknown type 'i33'"),
    ('  %0 = "mt.neg"(%a) : (i32) -> !mt.ref<i32>\n', 3, 32, "unknown type '!mt.ref'"),
    ('  %0 = "mt.neg"(%a) : (f32) -> i32\n', 3, 17, "%a has type i32, but the op's type says f32"),
    ('  %0:2 = "mt.neg"(%a) : (i32) -> i32\n', 3, 3, "binds 2 results but its type lists 1"),
    ('  "mt.neg"(%a) : (i32) -> i32\n', 3, 3, "binds 0 results but its type lists 1"),
    ('  %0 = "mt.neg"(%a) : (i32, i32) -> i32\n', 3, 8, "has 1 operands but its type lists 2"),
    ('  %0 = "mt.neg"(%a#1) : (i32) -> i32\n', 3, 17, "%a#1 does not exist"),
    ('  %0 = "mt.neg"(%a) {k = 1, k = 2} : (i32) -> i32\n', 3, 29, "duplicate attribute 'k'"),
    ('  %0 = "mt.neg"(%a) {k = #tt.blocked<{}>} : (i32) -> i32\n', 3, 26, "unknown attribute '#tt.blocked'"),
    ('  %0 = "mt.neg"(%a) {k = "\\q"} : (i32) -> i32\n', 3, 26, "unknown escape"),
    ('  %0 = "mt.neg"(%a) {k = 0x7F : i32} : (i32) -> i32\n', 3, 26, "needs a float type"),
    ('  %0 = "mt.neg"(%a) : (i32) -> i32 $\n', 3, 36, "unexpected character '$'"),
    ('  "scf.if"(%a) ({\n    %1 = "mt.neg"(%a) : (i32) -> i32\n  }) : (i32) -> ()\n'
     '  %2 = "mt.neg"(%1) : (i32) -> i32\n', 6, 17, "use of undefined value %1"),  # scoped to its region
    ('  %0 = "scf.if"(%a) ({\n    %1 = "mt.neg"(%0) : (i32) -> i32\n  }) : (i32) -> i32\n',
     4, 19, "use of undefined value %0"),  # an op's regions cannot use its results
])
def test_errors_report_line_and_column(body: str, line: int, column: int, message: str) -> None:
    text = FUNC_HEAD + body + FUNC_TAIL
    with pytest.raises(ParseError) as info:
        parse_module(text, filename="bad.mtir")
    err = info.value
    assert message in err.message
    assert (err.line, err.column) == (line, column)
    rendered = str(err)
    assert rendered.startswith(f"bad.mtir:{line}:{column}: ")
    source, caret = rendered.split("\n")[1:3]
    assert source == "    " + text.split("\n")[line - 1]
    assert caret == " " * (4 + column - 1) + "^"
    assert err.__suppress_context__ and err.__cause__ is None  # no lark traceback attached


def test_unexpected_end_of_input() -> None:
    with pytest.raises(ParseError) as info:
        parse_module('"builtin.module"() ({\n  "mt.return"() : () -> ()\n\n')
    assert (info.value.line, info.value.column) == (2, 27)
    assert "unexpected end of input" in info.value.message


def test_parse_type_errors() -> None:
    with pytest.raises(ParseError, match="unknown type 'f8'"):
        parse_type("tensor<4xf8>")
    with pytest.raises(ParseError, match="<type>:1:7: unexpected"):
        parse_type("tensor[4xf32]")


def test_parse_speed() -> None:
    """The grammar is built once and parsing is LALR: about 0.1-0.2 ms a line here; Earley would be ~100x slower."""
    text = print_module(build_all_ops_kernel())
    parse_module(text)
    big = "\n".join([text] * 5)
    lines = big.count("\n")
    elapsed = min(_timed(parse_module, big) for _ in range(2))
    assert elapsed < 2e-3 * lines, f"{elapsed:.2f} s for {lines} lines"


def _timed(fn, *args) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start
