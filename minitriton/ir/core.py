"""The IR's data structures: values, operations, blocks, regions, and the module that holds kernels.

The shape follows MLIR: an Operation has operands (Values), results (Values), a dict of attributes, nested
Regions (each a list of Blocks), and a source Location. A Block has arguments and an ordered list of ops.
There are no use-lists; passes that rewrite uses call `replace_all_uses` on the enclosing op, which is cheap
at kernel sizes (a few thousand ops) and keeps the structures plain.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .types import FunctionType, Type


@dataclass(frozen=True)
class Location:
    """A position in a Python source file (1-based line, 0-based column, as Python's ast reports)."""

    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class Value:
    """An SSA value: the result of an op or an argument of a block."""

    __slots__ = ("type", "owner", "index")

    def __init__(self, type: Type, owner: "Operation | Block", index: int):
        self.type = type
        self.owner = owner
        self.index = index

    @property
    def defining_op(self) -> "Operation | None":
        return self.owner if isinstance(self.owner, Operation) else None

    def __repr__(self) -> str:
        where = self.owner.name if isinstance(self.owner, Operation) else "block"
        return f"<Value {where}#{self.index}: {self.type}>"


class Block:
    """A list of operations with typed arguments (loop induction variables, carried values, kernel params)."""

    def __init__(self, arg_types: Sequence[Type] = ()):
        self.args: list[Value] = [Value(t, self, i) for i, t in enumerate(arg_types)]
        self.ops: list[Operation] = []
        self.parent: Region | None = None

    def add_arg(self, type: Type) -> Value:
        v = Value(type, self, len(self.args))
        self.args.append(v)
        return v

    def append(self, op: "Operation") -> "Operation":
        op.parent = self
        self.ops.append(op)
        return op

    def insert(self, index: int, op: "Operation") -> "Operation":
        op.parent = self
        self.ops.insert(index, op)
        return op

    @property
    def terminator(self) -> "Operation | None":
        return self.ops[-1] if self.ops else None

    @property
    def parent_op(self) -> "Operation | None":
        return self.parent.parent if self.parent else None


class Region:
    """A list of blocks owned by an op (our ops use exactly one block per region)."""

    def __init__(self, blocks: Sequence[Block] = ()):
        self.blocks: list[Block] = []
        self.parent: Operation | None = None
        for b in blocks:
            self.append(b)

    def append(self, block: Block) -> Block:
        block.parent = self
        self.blocks.append(block)
        return block

    @property
    def block(self) -> Block:
        """The region's only block."""
        return self.blocks[0]


class Operation:
    """One IR operation. `name` is `dialect.op` (mt.add, scf.for, ...); see ops.py for the op set."""

    def __init__(
        self,
        name: str,
        operands: Sequence[Value] = (),
        result_types: Sequence[Type] = (),
        attrs: dict[str, Any] | None = None,
        regions: Sequence[Region] = (),
        loc: Location | None = None,
    ):
        self.name = name
        self.operands: list[Value] = list(operands)
        self.results: list[Value] = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.regions: list[Region] = []
        self.loc = loc
        self.parent: Block | None = None
        for r in regions:
            self.add_region(r)

    def add_region(self, region: Region) -> Region:
        region.parent = self
        self.regions.append(region)
        return region

    @property
    def result(self) -> Value:
        """The op's only result."""
        if len(self.results) != 1:
            raise ValueError(f"{self.name} has {len(self.results)} results, not one")
        return self.results[0]

    @property
    def dialect(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def parent_op(self) -> "Operation | None":
        return self.parent.parent_op if self.parent else None

    def walk(self) -> Iterator["Operation"]:
        """This op and every op nested in its regions, in pre-order."""
        yield self
        for region in self.regions:
            for block in region.blocks:
                for op in list(block.ops):
                    yield from op.walk()

    def erase(self) -> None:
        """Remove this op from its block (its results must be unused)."""
        if self.parent is not None:
            self.parent.ops.remove(self)
            self.parent = None

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Rewrite every use of `old` inside this op's regions (and operands) to `new`."""
        self.replace_uses({old: new})

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        """Rewrite, in one walk, every use inside this op's regions (and operands) of a key of `mapping` to its
        value. Passes that replace many values collect them first, so the cost stays linear in the IR size."""
        for op in self.walk():
            op.operands = [mapping.get(v, v) for v in op.operands]

    def __repr__(self) -> str:
        return f"<Operation {self.name} at {self.loc}>"


class Module:
    """The top level: a list of kernels (`mt.func` ops). Prints as `"builtin.module"() ({...}) : () -> ()`."""

    def __init__(self, functions: Sequence[Operation] = ()):
        self.op = Operation("builtin.module", regions=[Region([Block()])])
        for f in functions:
            self.body.append(f)

    @property
    def body(self) -> Block:
        return self.op.regions[0].block

    @property
    def functions(self) -> list[Operation]:
        return [op for op in self.body.ops if op.name == "mt.func"]

    def function(self, name: str) -> Operation:
        for f in self.functions:
            if f.attrs.get("sym_name") == name:
                return f
        raise KeyError(f"no kernel named {name!r} in the module")

    def walk(self) -> Iterator[Operation]:
        return self.op.walk()

    def __str__(self) -> str:
        from .printer import print_module

        return print_module(self)


def make_function(name: str, arg_types: Sequence[Type], arg_names: Sequence[str], loc: Location | None = None,
                  **attrs: Any) -> Operation:
    """An empty kernel `mt.func` whose entry block takes `arg_types`."""
    fattrs = {"sym_name": name, "function_type": FunctionType(tuple(arg_types)), "arg_names": list(arg_names)}
    fattrs.update(attrs)
    return Operation("mt.func", attrs=fattrs, regions=[Region([Block(arg_types)])], loc=loc)


def function_body(func: Operation) -> Block:
    return func.regions[0].block


def insert_after_definition(v: Value, new: Operation) -> None:
    """Place `new` right after the op defining `v` (at the top of the block when `v` is a block argument)."""
    op = v.defining_op
    if op is None:
        block = v.owner
        assert isinstance(block, Block)
        block.insert(0, new)
    else:
        block = op.parent
        assert block is not None
        block.insert(block.ops.index(op) + 1, new)


class Builder:
    """Creates ops at an insertion point (the end of a block), giving each the current location."""

    def __init__(self, block: Block | None = None, loc: Location | None = None):
        self.block = block
        self.loc = loc

    def create(self, name: str, operands: Sequence[Value] = (), result_types: Sequence[Type] = (),
               attrs: dict[str, Any] | None = None, regions: Sequence[Region] = ()) -> Operation:
        if self.block is None:
            raise RuntimeError("builder has no insertion block")
        op = Operation(name, operands, result_types, attrs, regions, self.loc)
        return self.block.append(op)

    def create1(self, name: str, operands: Sequence[Value], result_type: Type, **attrs: Any) -> Value:
        """Create a one-result op and return its result."""
        return self.create(name, operands, [result_type], attrs).result
