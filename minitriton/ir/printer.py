"""Print IR in MLIR's generic operation syntax.

    %3 = "mt.add"(%1, %2) : (tensor<128xf32>, tensor<128xf32>) -> tensor<128xf32> loc("k.py":7:8)
    %4:2 = "scf.for"(%lb, %ub, %step, %a, %b) ({
    ^bb0(%arg5: i32, %arg6: f32, %arg7: f32):
      ...
      "scf.yield"(%x, %y) : (f32, f32) -> ()
    }) : (i32, i32, i32, f32, f32) -> (f32, f32)

Results are numbered %0, %1, ... and block arguments %arg0, %arg1, ... in print order over the whole module, so
names are unique (MLIR forbids shadowing in nested regions) and printing is deterministic: parse -> print gives
back the same text. The parser (parser.py) reads exactly this form.
"""
from __future__ import annotations

import math
import struct
from typing import Any

from .core import Block, Location, Module, Operation, Value
from .types import LayoutAttr, Type


def format_float(x: float) -> str:
    """An MLIR float literal that reads back to exactly `x` (specials as the hex bits of an f64)."""
    if math.isnan(x) or math.isinf(x):
        bits = struct.unpack("<Q", struct.pack("<d", x))[0]
        return f"0x{bits:016X} : f64"
    text = repr(float(x))
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


# MLIR string escapes: \\ \" \n \t, and \XX (hex) for other control characters, which MLIR rejects raw (\v, \f)
_STRING_ESCAPES = {c: f"\\{c:02X}" for c in [*range(32), 127]}
_STRING_ESCAPES.update({ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\t"): "\\t"})


def format_string(s: str) -> str:
    return '"' + s.translate(_STRING_ESCAPES) + '"'


def format_attr(v: Any) -> str:
    """An attribute value in MLIR syntax: ints, floats, bools, strings, arrays, types and layouts."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return format_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, (Type, LayoutAttr)):
        return str(v)
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def format_loc(loc: Location) -> str:
    return f"loc({format_string(loc.file)}:{loc.line}:{loc.col})"


def format_types(types: list[Type]) -> str:
    return "(" + ", ".join(str(t) for t in types) + ")"


class Printer:
    def __init__(self, with_locs: bool = True):
        self.with_locs = with_locs
        self.names: dict[int, str] = {}  # id(Value) -> printed name
        self.next_result = 0
        self.next_arg = 0
        self.lines: list[str] = []

    def name(self, v: Value) -> str:
        try:
            return self.names[id(v)]
        except KeyError:
            raise ValueError(f"value {v!r} is used before it is defined (or is not in this module)") from None

    def name_results(self, op: Operation) -> str:
        n = len(op.results)
        if n == 0:
            return ""
        base = f"%{self.next_result}"
        self.next_result += 1
        if n == 1:
            self.names[id(op.results[0])] = base
            return f"{base} = "
        for i, r in enumerate(op.results):
            self.names[id(r)] = f"{base}#{i}"
        return f"{base}:{n} = "

    def print_op(self, op: Operation, indent: int) -> None:
        pad = "  " * indent
        operands = ", ".join(self.name(v) for v in op.operands)
        head = f'{pad}{self.name_results(op)}"{op.name}"({operands})'
        if op.regions:
            self.lines.append(head + " ({")
            for i, region in enumerate(op.regions):
                if i:
                    self.lines.append(pad + "}, {")
                for block in region.blocks:
                    self.print_block(block, indent + 1)
            tail = pad + "})"
        else:
            tail = head
        if op.attrs:
            tail += " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in op.attrs.items()) + "}"
        ins = format_types([v.type for v in op.operands])
        res = [r.type for r in op.results]
        outs = str(res[0]) if len(res) == 1 else format_types(res)
        tail += f" : {ins} -> {outs}"
        if self.with_locs and op.loc is not None:
            tail += " " + format_loc(op.loc)
        self.lines.append(tail)

    def print_block(self, block: Block, indent: int) -> None:
        # The header is omitted when a block has no args, except when it is empty too: MLIR reads `({\n})` as a
        # region with no block at all (and then rejects builtin.module), so an empty block prints as `^bb0:`.
        if block.args or not block.ops:
            args = []
            for a in block.args:
                self.names[id(a)] = f"%arg{self.next_arg}"
                self.next_arg += 1
                args.append(f"{self.names[id(a)]}: {a.type}")
            header = f"^bb0({', '.join(args)}):" if args else "^bb0:"
            self.lines.append("  " * (indent - 1) + header)
        for op in block.ops:
            self.print_op(op, indent)


def print_op(op: Operation, with_locs: bool = True) -> str:
    """Print one op (and its regions); values defined outside it print as their first use would."""
    p = Printer(with_locs)
    p.print_op(op, 0)
    return "\n".join(p.lines) + "\n"


def print_module(module: Module, with_locs: bool = True) -> str:
    return print_op(module.op, with_locs)
