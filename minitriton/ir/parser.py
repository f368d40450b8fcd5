"""Parse the textual tile IR (MLIR generic syntax, as printer.py prints it) back into a Module.

Two steps. While lark parses (LALR, contextual lexer, grammar in mtir.lark), `_ToSyntax` turns each rule into a
small record: types, attributes and locations are built at once since they need no context, ops become
`_OpSyntax`. Then `_Resolver` walks the records in text order, binds value names to Values (a name must be
defined before its use, and only once in its scope) and creates the Operations. Any problem is a ParseError
that names the file, line and column and shows the line.

    module = parse_module(text)           # print_module(parse_module(print_module(m))) == print_module(m)
    ty = parse_type("tensor<4x!mt.ptr<f32>>")
"""
from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from .core import Block, Location, Module, Operation, Region, Value
from .types import (SCALAR_TYPES, FunctionType, LayoutAttr, PointerType, ScalarType, TensorDescType, TensorType,
                    Type)

__all__ = ["ParseError", "parse_module", "parse_type"]


class ParseError(ValueError):
    """Malformed IR text. `line` and `column` are 1-based; str() shows the offending line with a caret."""

    def __init__(self, message: str, filename: str, line: int, column: int, source_line: str):
        self.message = message
        self.filename = filename
        self.line = line
        self.column = column
        excerpt, caret = _excerpt(source_line, column)
        super().__init__(f"{filename}:{line}:{column}: {message}\n    {excerpt}\n    {' ' * caret}^")


def parse_module(text: str, filename: str = "<mtir>") -> Module:
    """Read a module. Top-level ops other than one `builtin.module` are wrapped in a module, as MLIR does."""
    try:
        syntax = _lark().parse(text, start="start")
        resolver = _Resolver()
        ops = [resolver.build_op(s) for s in syntax]
    except (UnexpectedInput, _Problem) as e:
        raise _parse_error(e, text, filename) from None
    if len(ops) == 1 and ops[0].name == "builtin.module":
        module = Module()
        module.op = ops[0]
        return module
    return Module(ops)


def parse_type(text: str) -> Type:
    """Read one type: `i32`, `!mt.ptr<f16>`, `tensor<64x64xf32, #mt.blocked<{...}>>`, `(i32) -> ()`,
    `!mt.tensordesc<tensor<64x64xbf16>>`."""
    try:
        return _lark().parse(text, start="type")
    except (UnexpectedInput, _Problem) as e:
        raise _parse_error(e, text, "<type>") from None


@functools.lru_cache(maxsize=None)
def _lark() -> Lark:
    grammar = resources.files(__package__).joinpath("mtir.lark").read_text()
    return Lark(grammar, parser="lalr", lexer="contextual", start=["start", "type"], transformer=_ToSyntax(),
                maybe_placeholders=True)


# ------------------------------------------------------------------------------------------ syntax records


class _Problem(Exception):
    """A semantic error found at `token`; parse_module turns it into a ParseError once it has the text."""

    def __init__(self, message: str, token: Token):
        super().__init__(message)
        self.message = message
        self.line = token.line
        self.column = token.column


@dataclass
class _BlockSyntax:
    args: list[tuple[Token, Type]]
    ops: list[_OpSyntax]


@dataclass
class _OpSyntax:
    name: Token  # the quoted op name; errors about the op point at it
    results: Token | None  # `%4` of `%4:2 = ...`
    num_results: int  # how many results the name binds (the `:2`)
    operands: list[Token]
    regions: list[list[_BlockSyntax]]
    attrs: dict[str, Any]
    type: FunctionType
    loc: Location | None


@v_args(inline=True)
class _ToSyntax(Transformer):
    """Builds records bottom-up as the LALR parser reduces rules (no parse tree is kept)."""

    def start(self, *ops: _OpSyntax) -> list[_OpSyntax]:
        return list(ops)

    def op(self, results: tuple[Token, int] | None, name: Token, operands: list[Token],
           regions: list | None, attrs: dict | None, type: FunctionType, loc: Location | None) -> _OpSyntax:
        result, count = results if results is not None else (None, 0)
        return _OpSyntax(name, result, count, operands, regions or [], attrs or {}, type, loc)

    def result_names(self, name: Token, count: Token | None) -> tuple[Token, int]:
        _check_definable(name)
        n = 1 if count is None else int(count)
        if n < 1:
            raise _Problem(f"{name} must bind at least one result", count)
        return name, n

    def operands(self, *values: Token | None) -> list[Token]:
        return [v for v in values if v is not None]

    def regions(self, *regions: list[_BlockSyntax]) -> list[list[_BlockSyntax]]:
        return list(regions)

    def region(self, *items: _OpSyntax | _BlockSyntax) -> list[_BlockSyntax]:
        """Ops before the first label form the entry block (printed without a header when it has no args)."""
        ops = [x for x in items if isinstance(x, _OpSyntax)]
        blocks = [x for x in items if isinstance(x, _BlockSyntax)]
        if ops or not blocks:
            blocks.insert(0, _BlockSyntax([], ops))
        return blocks

    def labeled_block(self, label: Token, args: list | None, *ops: _OpSyntax) -> _BlockSyntax:
        return _BlockSyntax(args or [], list(ops))

    def block_args(self, *args: tuple[Token, Type] | None) -> list[tuple[Token, Type]]:
        return [a for a in args if a is not None]

    def block_arg(self, name: Token, type: Type) -> tuple[Token, Type]:
        _check_definable(name)
        return name, type

    def file_loc(self, file: Token, line: Token, col: Token) -> Location:
        return Location(_unescape(file), int(line), int(col))

    def unknown_loc(self) -> None:
        return None

    # attributes

    def attr_dict(self, *entries: tuple[Token, Any] | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        for entry in entries:
            if entry is None:
                continue
            key, value = entry
            if key in attrs:
                raise _Problem(f"duplicate attribute '{key}'", key)
            attrs[str(key)] = value
        return attrs

    def attr_entry(self, key: Token, value: Any) -> tuple[Token, Any]:
        return key, value

    def int_attr(self, tok: Token) -> int:
        return int(tok)

    def float_attr(self, tok: Token) -> float:
        return float(tok)

    def hex_float_attr(self, tok: Token, type: Type) -> float:
        """`0x7FF0000000000000 : f64`: a float given by its bits (how infinities and NaNs are printed)."""
        return _float_from_bits(tok, type)

    def true_attr(self) -> bool:
        return True

    def false_attr(self) -> bool:
        return False

    def string_attr(self, tok: Token) -> str:
        return _unescape(tok)

    def array_attr(self, *items: Any) -> list[Any]:
        return [x for x in items if x is not None]

    def layout(self, name: Token, params: dict[str, Any]) -> LayoutAttr:
        if not name.startswith("#mt."):
            raise _Problem(f"unknown attribute '{name}' (layouts are #mt.<kind><{{...}}>)", name)
        return LayoutAttr(name[len("#mt."):], tuple((k, _freeze(v)) for k, v in params.items()))

    # types

    def scalar_type(self, name: Token) -> ScalarType:
        if name not in SCALAR_TYPES:
            raise _Problem(f"unknown type '{name}'", name)
        return SCALAR_TYPES[name]

    def pointer_type(self, name: Token, pointee: ScalarType) -> PointerType:
        if name != "!mt.ptr":
            raise _Problem("!mt.tensordesc takes a tensor type" if name == "!mt.tensordesc" else
                           f"unknown type '{name}'", name)
        return PointerType(pointee)

    def descriptor_type(self, name: Token, block: TensorType) -> TensorDescType:
        if name != "!mt.tensordesc":
            raise _Problem("!mt.ptr points to a scalar type" if name == "!mt.ptr" else f"unknown type '{name}'", name)
        if block.encoding is not None:
            raise _Problem("a tensor descriptor's block has no layout", name)
        desc = TensorDescType(block)
        problem = desc.problem()
        if problem is not None:
            raise _Problem(problem, name)
        return desc

    def tensor_type(self, dims: Token | None, element: Type, encoding: LayoutAttr | None) -> TensorType:
        shape = tuple(int(d) for d in dims.split("x")[:-1]) if dims is not None else ()
        return TensorType(shape, element, encoding)  # type: ignore[arg-type]

    def function_type(self, inputs: tuple[Type, ...], results: tuple[Type, ...]) -> FunctionType:
        return FunctionType(inputs, results)

    def function_results(self, types: tuple[Type, ...] | Type) -> tuple[Type, ...]:
        return types if isinstance(types, tuple) else (types,)

    def type_list(self, *types: Type | None) -> tuple[Type, ...]:
        return tuple(t for t in types if t is not None)


def _check_definable(name: Token) -> None:
    if "#" in name:
        raise _Problem(f"cannot define {name}: '#N' selects a result of a multi-result op", name)


def _freeze(v: Any) -> Any:
    """Lists inside a LayoutAttr are tuples, so the attribute stays hashable (as types.layout makes them)."""
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


_ESCAPE = re.compile(r'\\(?:([0-9A-Fa-f]{2})|(.))', re.S)
_SIMPLE_ESCAPES = {"n": b"\n", "t": b"\t", '"': b'"', "\\": b"\\"}


def _unescape(tok: Token) -> str:
    """The value of an MLIR string literal: escapes \\n \\t \\" \\\\ and \\XX (a byte in hex)."""
    body = tok[1:-1]
    if "\\" not in body:
        return body
    out, pos = bytearray(), 0
    for m in _ESCAPE.finditer(body):
        out += body[pos:m.start()].encode()
        if m.group(1):
            out.append(int(m.group(1), 16))
        elif m.group(2) in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[m.group(2)]
        else:
            raise _Problem(f"unknown escape '\\{m.group(2)}' in string", tok)
        pos = m.end()
    out += body[pos:].encode()
    return out.decode("utf-8", errors="replace")


# float type -> (struct code of the bits, struct code of the value); bf16 is the top half of an f32
_FLOAT_BITS = {"f64": ("<Q", "<d"), "f32": ("<I", "<f"), "f16": ("<H", "<e"), "bf16": ("<H", None)}


def _float_from_bits(tok: Token, type: Type) -> float:
    name = type.name if isinstance(type, ScalarType) else str(type)
    if name not in _FLOAT_BITS:
        raise _Problem(f"a hex float literal needs a float type, got {type}", tok)
    bits_code, value_code = _FLOAT_BITS[name]
    bits = int(tok, 16)
    if bits >= 1 << (8 * struct.calcsize(bits_code)):
        raise _Problem(f"{tok} has too many bits for {name}", tok)
    if value_code is None:
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    return struct.unpack(value_code, struct.pack(bits_code, bits))[0]


# ------------------------------------------------------------------------------------------ name binding


class _Resolver:
    """Creates Operations from records in text order, binding value names through nested scopes.

    As in MLIR, a region sees the names defined around it, its own names vanish when it closes, and a name may
    not be redefined while it is visible. Op results are bound after the op's regions, which cannot use them.
    """

    def __init__(self) -> None:
        self.scopes: list[dict[str, list[Value]]] = [{}]

    def build_op(self, s: _OpSyntax) -> Operation:
        name = _unescape(s.name)
        if len(s.operands) != len(s.type.inputs):
            raise _Problem(f"'{name}' has {len(s.operands)} operands but its type lists {len(s.type.inputs)}",
                           s.name)
        if s.num_results != len(s.type.results):
            raise _Problem(f"'{name}' binds {s.num_results} results but its type lists {len(s.type.results)}",
                           s.results or s.name)
        operands = [self.use(tok, declared) for tok, declared in zip(s.operands, s.type.inputs)]
        op = Operation(name, operands, s.type.results, s.attrs, loc=s.loc)
        for region in s.regions:
            op.add_region(self.build_region(region))
        if s.results is not None:
            self.define(s.results, op.results)
        return op

    def build_region(self, blocks: list[_BlockSyntax]) -> Region:
        self.scopes.append({})
        region = Region()
        for b in blocks:
            block = region.append(Block([t for _, t in b.args]))
            for (tok, _), arg in zip(b.args, block.args):
                self.define(tok, [arg])
            for s in b.ops:
                block.append(self.build_op(s))
        self.scopes.pop()
        return region

    def use(self, tok: Token, declared: Type) -> Value:
        base, _, index = tok.partition("#")
        values = next((scope[base] for scope in reversed(self.scopes) if base in scope), None)
        if values is None:
            raise _Problem(f"use of undefined value {base}", tok)
        i = int(index) if index else 0
        if i >= len(values):
            raise _Problem(f"{tok} does not exist: {base} has {len(values)} result(s)", tok)
        value = values[i]
        if value.type != declared:
            raise _Problem(f"{tok} has type {value.type}, but the op's type says {declared}", tok)
        return value

    def define(self, tok: Token, values: list[Value]) -> None:
        if any(tok in scope for scope in self.scopes):
            raise _Problem(f"redefinition of value {tok}", tok)
        self.scopes[-1][str(tok)] = values


# ------------------------------------------------------------------------------------------ error reports

# What the regex tokens are, for "expected ..." in syntax errors (string tokens show as themselves).
_TOKEN_NAMES = {
    "VALUE": "a value (%name)", "CARET_ID": "a block label (^bb0)", "BARE_ID": "a name", "BANG_ID": "a type",
    "HASH_ID": "a layout (#mt.kind)", "DIMS": "tensor dims (4x8x)", "FLOAT": "a float", "HEX": "a hex float",
    "INT": "an integer", "STRING": "a string", "$END": "end of input",
}


def _parse_error(e: Exception, text: str, filename: str) -> ParseError:
    lines = text.split("\n")
    line, column = getattr(e, "line", -1), getattr(e, "column", -1)
    at_end = isinstance(e, UnexpectedInput) and not isinstance(e, UnexpectedCharacters) and (
        not isinstance(e, UnexpectedToken) or e.token.type == "$END")
    if at_end or not isinstance(line, int) or line < 1:  # just after the last thing written
        body = text.rstrip()
        line = body.count("\n") + 1
        column = len(body) - body.rfind("\n")
    if isinstance(e, _Problem):
        message = e.message
    elif isinstance(e, UnexpectedCharacters):
        message = f"unexpected character {e.char!r}"
    elif isinstance(e, UnexpectedToken) and e.token.type != "$END":
        message = f"unexpected {str(e.token)!r}; expected {_describe(e.expected)}"
    else:
        message = f"unexpected end of input; expected {_describe(getattr(e, 'expected', ()) or ())}"
    return ParseError(message, filename, line, column, lines[line - 1] if line <= len(lines) else "")


def _describe(expected: Any) -> str:
    names = set()
    for name in expected:
        if name in _TOKEN_NAMES:
            names.add(_TOKEN_NAMES[name])
            continue
        try:
            pattern = _lark().get_terminal(name).pattern
        except KeyError:
            names.add(name)
            continue
        names.add(repr(pattern.value) if pattern.type == "str" else name)
    shown = sorted(names)
    return ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "") if shown else "nothing"


def _excerpt(source_line: str, column: int, width: int = 100) -> tuple[str, int]:
    """The source line (a window of it when long) and where the caret goes under it."""
    line = source_line.rstrip().replace("\t", " ")
    start = max(0, min(column - 1 - width // 2, len(line) - width))
    text = line[start:start + width]
    return ("..." if start else "") + text, column - 1 - start + (3 if start else 0)
