"""Compile an `mt.func` once into Python closures, then run it over every program of a grid.

Compilation gives every SSA value a slot number in a flat list `env` and turns every op into a *step*
`step(env, ctx)` that reads its operand slots and writes its result slots. Pure ops (elementwise, shapes, reduce,
dot, addptr) come from builders returning a plain function of the operand values, wrapped here; ops that need the
running program (ids, memory) and control flow build their steps directly. A block compiles to a list of steps
plus the slots of its terminator's operands. The op name picks the builder from one dispatch table (`PURE` and
`STEPS` below), so running an op costs a call, not a chain of tests.

Running: for each program (axis 0 fastest, then 1, then 2) a fresh `env` is filled by the entry block's steps.
Numpy overflow / invalid / divide warnings are silenced for the whole run: integer wrap-around and IEEE specials
are the defined behaviour.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import InterpreterError
from ..ir.core import Block, Operation, Value
from ..ir.types import PointerType, ScalarType, TensorDescType, Type
from . import async_ops, elementwise, memops, partitions, tiles, tma_ops
from .memory import Memory
from .values import dtype_of, scalar_value

Step = Callable[[list, "Context"], None]

PURE: dict[str, Callable[[Operation], Callable[..., Any]]] = {
    **elementwise.BUILDERS, **tiles.BUILDERS, "mt.addptr": memops.build_addptr,
}
TERMINATORS = ("scf.yield", "scf.condition", "mt.return")


@dataclass
class Context:
    """What a running program can see besides its values."""

    pid: tuple[int, int, int]
    grid: tuple[int, int, int]
    memory: Memory
    rings: dict[int, "partitions.RingBarriers"] = field(default_factory=dict)  # ring slot -> its barriers
    scheduler: "partitions.Scheduler | None" = None  # set while the partitions of mt.warp_specialize run


class CompiledBlock:
    """A block's steps; `run` binds its arguments, runs the steps and returns its terminator's operands."""

    def __init__(self, ops: list[Operation], steps: list[Step], arg_slots: list[int], exit_slots: list[int]):
        self.ops, self.steps, self.arg_slots, self.exit_slots = ops, steps, arg_slots, exit_slots

    def run(self, env: list, ctx: Context, args: Sequence[Any]) -> list:
        for slot, value in zip(self.arg_slots, args):
            env[slot] = value
        i = 0
        try:
            for i, step in enumerate(self.steps):
                step(env, ctx)
        except InterpreterError:
            raise
        except Exception as e:  # a bug or an unsupported case: say which op it was
            op = self.ops[i]
            raise InterpreterError(f"'{op.name}' failed: {type(e).__name__}: {e}", op.loc) from e
        return [env[s] for s in self.exit_slots]


class Compiler:
    """Turns blocks into CompiledBlocks, numbering values into slots as it goes."""

    def __init__(self, check_types: bool = False):
        self.slots: dict[int, int] = {}
        self.check_types = check_types

    def define(self, v: Value) -> int:
        self.slots[id(v)] = slot = len(self.slots)
        return slot

    def use(self, v: Value) -> int:
        try:
            return self.slots[id(v)]
        except KeyError:
            raise InterpreterError(f"value {v!r} is used before it is defined", None) from None

    def block(self, block: Block) -> CompiledBlock:
        arg_slots = [self.define(a) for a in block.args]
        ops, steps, exit_slots = [], [], []
        for op in block.ops:
            if op.name in TERMINATORS:
                exit_slots = [self.use(v) for v in op.operands]
                break
            ops.append(op)
            steps.append(self.op(op))
        return CompiledBlock(ops, steps, arg_slots, exit_slots)

    def op(self, op: Operation) -> Step:
        if op.name in PURE:
            step = self._pure(op)
        elif op.name in STEPS:
            step = STEPS[op.name](op, self)
        else:
            raise InterpreterError(f"unknown op '{op.name}': the interpreter runs tile IR (minitriton/ir/ops.py)",
                                   op.loc)
        return _checked(step, op, [self.slots[id(r)] for r in op.results]) if self.check_types else step

    def _pure(self, op: Operation) -> Step:
        fn = PURE[op.name](op)
        ins = [self.use(v) for v in op.operands]
        out = self.define(op.result)
        if not op.result.type.is_tensor:  # numpy may give 0-d arrays; scalars are numpy scalars
            inner = fn
            fn = lambda *xs: inner(*xs)[()]  # noqa: E731
        return _pure_step(fn, ins, out)


def _pure_step(fn: Callable[..., Any], ins: list[int], out: int) -> Step:
    """A step calling `fn` on the operand slots; unrolled for the common arities."""
    if len(ins) == 0:
        def step0(env: list, ctx: Context) -> None:
            env[out] = fn()
        return step0
    if len(ins) == 1:
        (a,) = ins

        def step1(env: list, ctx: Context) -> None:
            env[out] = fn(env[a])
        return step1
    if len(ins) == 2:
        a, b = ins

        def step2(env: list, ctx: Context) -> None:
            env[out] = fn(env[a], env[b])
        return step2

    def stepn(env: list, ctx: Context) -> None:
        env[out] = fn(*[env[i] for i in ins])
    return stepn


# ---------------------------------------------------------------------------------------- control flow


def _for(op: Operation, c: Compiler) -> Step:
    lb, ub, st, *inits = (c.use(v) for v in op.operands)
    iv_type = op.operands[0].type.scalar.numpy_name  # type: ignore[union-attr]
    iv_of = np.dtype(iv_type).type
    body = c.block(op.regions[0].block)
    outs = [c.define(r) for r in op.results]

    def scf_for(env: list, ctx: Context) -> None:
        lo, hi, step = int(env[lb]), int(env[ub]), int(env[st])
        if step <= 0:
            raise InterpreterError(f"scf.for step must be positive, got {step}", op.loc)
        carried = [env[s] for s in inits]
        for i in range(lo, hi, step):
            carried = body.run(env, ctx, [iv_of(i), *carried])
        for slot, v in zip(outs, carried):
            env[slot] = v

    return scf_for


def _if(op: Operation, c: Compiler) -> Step:
    cond = c.use(op.operands[0])
    then, other = c.block(op.regions[0].block), c.block(op.regions[1].block)
    outs = [c.define(r) for r in op.results]

    def scf_if(env: list, ctx: Context) -> None:
        values = (then if env[cond] else other).run(env, ctx, ())
        for slot, v in zip(outs, values):
            env[slot] = v

    return scf_if


def _while(op: Operation, c: Compiler) -> Step:
    inits = [c.use(v) for v in op.operands]
    before, after = c.block(op.regions[0].block), c.block(op.regions[1].block)
    outs = [c.define(r) for r in op.results]

    def scf_while(env: list, ctx: Context) -> None:
        carried = [env[s] for s in inits]
        while True:
            go, *forwarded = before.run(env, ctx, carried)
            if not go:
                break
            carried = after.run(env, ctx, forwarded)
        for slot, v in zip(outs, forwarded):
            env[slot] = v

    return scf_while


def _memop(build: Callable[..., Step]) -> Callable[[Operation, Compiler], Step]:
    return lambda op, c: build(op, c.use, c.define)


STEPS: dict[str, Callable[[Operation, Compiler], Step]] = {
    "scf.for": _for, "scf.if": _if, "scf.while": _while,
    "mt.warp_specialize": lambda op, c: partitions.build_warp_specialize(op, c.block),
    **{name: _memop(build) for name, build in memops.STEP_BUILDERS.items()},
    **{name: _memop(build) for name, build in tma_ops.STEP_BUILDERS.items()},
    **{name: _memop(build) for name, build in async_ops.STEP_BUILDERS.items()},
    **{name: _memop(build) for name, build in partitions.STEP_BUILDERS.items()},  # rings with barriers
}


# ---------------------------------------------------------------------------------------- checking


def _checked(step: Step, op: Operation, outs: list[int]) -> Step:
    """`step` followed by a check that each result follows the value representation (tests turn this on)."""
    types = [r.type for r in op.results]

    def checked(env: list, ctx: Context) -> None:
        step(env, ctx)
        for slot, t in zip(outs, types):
            problem = representation_problem(env[slot], t)
            if problem:
                raise InterpreterError(f"internal: '{op.name}' produced {problem}", op.loc)

    return checked


def representation_problem(v: Any, t: Type) -> str | None:
    """Why `v` is not a valid interpreter value of type `t`, or None."""
    want = dtype_of(t)
    if t.is_tensor:
        if not isinstance(v, np.ndarray) or v.shape != t.shape or v.dtype != want:
            return f"{type(v).__name__} {getattr(v, 'dtype', '')} {getattr(v, 'shape', '')} for {t}"
    elif not isinstance(v, np.generic) or v.dtype != want:
        return f"{type(v).__name__} {getattr(v, 'dtype', '')} for {t}"
    s = t.scalar
    if isinstance(s, ScalarType) and s.name == "bf16":
        if (np.asarray(v).view(np.uint32) & 0xFFFF).any():
            return f"float32 values that are not bf16 for {t}"
    return None


# ---------------------------------------------------------------------------------------- running


class CompiledFunction:
    """An `mt.func` compiled once; call it with a grid and arguments (like `interpret`) as often as needed."""

    def __init__(self, func: Operation, check_types: bool = False):
        if func.name != "mt.func":
            raise InterpreterError(f"interpret needs an mt.func, got '{func.name}'", func.loc)
        self.func = func
        self.compiler = Compiler(check_types)
        self.body = self.compiler.block(func.regions[0].block)
        self.arg_types = [a.type for a in func.regions[0].block.args]
        names = func.attrs.get("arg_names") or [f"arg{i}" for i in range(len(self.arg_types))]
        self.arg_names = list(names)
        self.divisibility = list(func.attrs.get("divisibility") or [1] * len(self.arg_types))

    def __call__(self, grid: Sequence[int] | int, args: Sequence[Any]) -> None:
        grid3 = _grid3(grid, self.func)
        memory = Memory()
        values = self._bind(args, memory)
        nslots = len(self.compiler.slots)
        with np.errstate(all="ignore"):
            for z, y, x in itertools.product(range(grid3[2]), range(grid3[1]), range(grid3[0])):
                ctx = Context((x, y, z), grid3, memory)
                self.body.run([None] * nslots, ctx, values)

    def _bind(self, args: Sequence[Any], memory: Memory) -> list[Any]:
        """Argument values: tensors placed in `memory` (as pointers), numbers as numpy scalars of the param type."""
        if len(args) != len(self.arg_types):
            raise InterpreterError(f"kernel '{self.func.attrs.get('sym_name')}' takes {len(self.arg_types)} "
                                   f"arguments ({', '.join(self.arg_names)}), got {len(args)}", self.func.loc)
        values = []
        for name, t, div, arg in zip(self.arg_names, self.arg_types, self.divisibility, args):
            value = self._bind_one(name, t, arg, memory)
            if div > 1 and (isinstance(t, PointerType) or t.is_int) and int(value) % div:
                raise InterpreterError(f"argument '{name}' = {int(value):#x} was specialized as divisible by {div} "
                                       f"but is not", self.func.loc)
            values.append(value)
        return values

    def _bind_one(self, name: str, t: Type, arg: Any, memory: Memory) -> Any:
        if isinstance(t, TensorDescType):
            return tma_ops.bind_descriptor(name, t, arg, memory, self.func.loc)
        if isinstance(t, PointerType):
            if not isinstance(arg, torch.Tensor):
                raise InterpreterError(f"argument '{name}' is a pointer ({t}): pass a torch tensor, got "
                                       f"{type(arg).__name__}", self.func.loc)
            if arg.device.type != "cpu":
                raise InterpreterError(f"argument '{name}': the interpreter needs CPU tensors, got {arg.device}",
                                       self.func.loc)
            return np.int64(memory.add_tensor(name, arg))
        if t.is_tensor or not isinstance(t, ScalarType):
            raise InterpreterError(f"parameter '{name}' has type {t}: kernels take scalars and pointers",
                                   self.func.loc)
        if isinstance(arg, torch.Tensor) and arg.numel() == 1:
            arg = arg.item()
        if not isinstance(arg, (bool, int, float, np.generic)):
            raise InterpreterError(f"argument '{name}' ({t}) must be a number, got {type(arg).__name__}",
                                   self.func.loc)
        if t.is_int and not t.is_bool:
            if isinstance(arg, (float, np.floating)):
                raise InterpreterError(f"argument '{name}' is {t}, got the float {arg}", self.func.loc)
            info = np.iinfo(t.numpy_name)
            if not info.min <= int(arg) <= info.max:
                raise InterpreterError(f"argument '{name}' = {int(arg)} does not fit {t}", self.func.loc)
        return scalar_value(arg.item() if isinstance(arg, np.generic) else arg, t)


def _grid3(grid: Sequence[int] | int, func: Operation) -> tuple[int, int, int]:
    g = (grid,) if isinstance(grid, int) else tuple(int(x) for x in grid)
    if not 1 <= len(g) <= 3 or any(x < 0 for x in g):
        raise InterpreterError(f"grid must be 1 to 3 non-negative sizes, got {grid}", func.loc)
    return (g + (1, 1))[:3]  # type: ignore[return-value]


def compile_function(func: Operation, *, check_types: bool = False) -> CompiledFunction:
    """Compile `func` for repeated interpretation. check_types=True verifies every op's result representation
    (dtype, shape, bf16 rounding) as it runs: slower, meant for tests."""
    return CompiledFunction(func, check_types)


def interpret(func: Operation, grid: Sequence[int] | int, args: Sequence[Any], *, check_types: bool = False) -> None:
    """Run the `mt.func` `func` over every program of `grid` (1 to 3 sizes; missing axes are 1) on `args`: CPU torch
    tensors for pointer parameters (written in place), Python numbers for scalar parameters, in parameter order."""
    compile_function(func, check_types=check_types)(grid, args)
