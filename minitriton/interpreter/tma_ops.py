"""Tensor-descriptor ops in the interpreter: TMA's semantics on CPU tensors.

A descriptor argument (a host `mt.TensorDescriptor`, runtime/tma.py) binds to a `Descriptor`: the address of its
tensor's first element in the run's Memory, the global shape and strides in elements, and the element type.

    mt.descriptor_load   the box at the coordinates; elements outside the tensor (a coordinate < 0 or >= the
                         dim's extent) read as 0, as TMA fills them; the others are read through Memory, so they are
                         bounds-checked like mt.load
    mt.descriptor_store  writes the box's elements that lie inside the tensor and drops the others (TMA clips)

Coordinates are the op's i32 operands, outermost dim first (the PTX lowering reverses them for TMA).

Two rules the H200 enforces by faulting the kernel ("illegal instruction", context lost; measured 2026-11-29 with
every case of tests/test_tma_gpu.py in its own process, tools/tma_isolated.sh) are errors here, so they show up on
the CPU with the kernel line instead: the innermost coordinate must be a multiple of 16 bytes (coordinate x element
size: e.g. 8 bf16 columns), and a store's box must not start before the tensor (negative coordinates; loads may).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import InterpreterError
from ..ir.core import Location, Operation
from ..ir.types import ScalarType, TensorDescType
from .memory import Memory
from .values import from_raw, to_raw

Step = Callable[[list, Any], None]
SlotOf = Callable[[Any], int]


@dataclass(frozen=True)
class Descriptor:
    """A bound tensor descriptor: where its tensor starts, its shape and strides (elements), its element type."""

    base: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    element: ScalarType


def bind_descriptor(name: str, t: TensorDescType, arg: Any, memory: Memory, loc: Location | None) -> Descriptor:
    """Place the descriptor's tensor in `memory`; the argument must match the kernel's specialization `t`."""
    from ..runtime.tma import TensorDescriptor

    if not isinstance(arg, TensorDescriptor):
        raise InterpreterError(f"argument '{name}' is a tensor descriptor ({t}): pass an mt.TensorDescriptor, got "
                               f"{type(arg).__name__}", loc)
    if arg.type != t:
        raise InterpreterError(f"argument '{name}': the kernel was specialized for {t}, got a descriptor of "
                               f"{arg.type}", loc)
    if arg.tensor.device.type != "cpu":
        raise InterpreterError(f"argument '{name}': the interpreter needs a descriptor of a CPU tensor, got "
                               f"{arg.tensor.device}", loc)
    return Descriptor(memory.add_tensor(name, arg.tensor), arg.shape, arg.strides, t.element)


def box(desc: Descriptor, block: tuple[int, ...], coords: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(addresses, inside) of every box element, in the block's shape: inside is false where a coordinate falls
    outside the tensor (such addresses are never accessed)."""
    offsets = np.zeros(block, dtype=np.int64)
    inside = np.ones(block, dtype=bool)
    for d, (c, n, extent, stride) in enumerate(zip(coords, block, desc.shape, desc.strides)):
        idx = np.int64(c) + np.arange(n, dtype=np.int64)
        view = [1] * len(block)
        view[d] = n
        offsets = offsets + (idx * stride).reshape(view)
        inside = inside & ((idx >= 0) & (idx < extent)).reshape(view)
    return desc.base + offsets * desc.element.bytes, inside


TMA_ALIGN_BYTES = 16


def check_coordinates(op: Operation, element: ScalarType, coords: list[int], store: bool) -> None:
    """The hardware's rules for box coordinates (see the module docstring); InterpreterError at the op's line."""
    if (coords[-1] * element.bytes) % TMA_ALIGN_BYTES:
        raise InterpreterError(f"{op.name}: the innermost coordinate ({coords[-1]}) times the element size "
                               f"({element.bytes} bytes) must be a multiple of {TMA_ALIGN_BYTES} bytes (the TMA unit "
                               f"faults otherwise); got coordinates {coords}", op.loc)
    if store and min(coords) < 0:
        raise InterpreterError(f"{op.name}: a TMA store box must not start before the tensor (the TMA unit faults "
                               f"on negative store coordinates); got coordinates {coords}", op.loc)


def build_descriptor_load(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    t: TensorDescType = op.operands[0].type  # type: ignore[assignment]
    block, s, loc = t.block_shape, t.element, op.loc
    desc, coords, out = use(op.operands[0]), [use(v) for v in op.operands[1:]], define(op.result)

    def descriptor_load(env: list, ctx: Any) -> None:
        at = [int(env[c]) for c in coords]
        check_coordinates(op, s, at, store=False)
        addrs, inside = box(env[desc], block, at)
        raw = ctx.memory.gather(addrs.reshape(-1), inside.reshape(-1), s, op.name, loc, block)
        env[out] = from_raw(raw, s).reshape(block)  # lanes outside the tensor read as 0: TMA's zero fill

    return descriptor_load


def build_descriptor_store(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    t: TensorDescType = op.operands[0].type  # type: ignore[assignment]
    block, s, loc = tuple(op.operands[-1].type.shape), t.element, op.loc  # the tile: one box or whole boxes
    desc, coords, val = use(op.operands[0]), [use(v) for v in op.operands[1:-1]], use(op.operands[-1])

    def descriptor_store(env: list, ctx: Any) -> None:
        at = [int(env[c]) for c in coords]
        check_coordinates(op, s, at, store=True)
        addrs, inside = box(env[desc], block, at)
        raw = np.asarray(to_raw(env[val], s)).reshape(-1)
        ctx.memory.scatter(addrs.reshape(-1), inside.reshape(-1), raw, s, op.name, loc, block)

    return descriptor_store


STEP_BUILDERS: dict[str, Callable[[Operation, SlotOf, SlotOf], Step]] = {
    "mt.descriptor_load": build_descriptor_load, "mt.descriptor_store": build_descriptor_store,
}
