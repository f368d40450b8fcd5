"""Warp partitions of a warp-specialized kernel (`mt.warp_specialize`): where each partition's warps sit in the
block, how many registers each gets, and which partition an op belongs to.

A kernel with an `mt.warp_specialize` op runs its regions at once, each on its own warps. Partition 0 (the default
partition) takes warps [0, warps[0]); every later one starts at the first warp past the partitions before it that
is a multiple of its own warp count (warp counts are powers of two), so a partition's warp bits are the low bits
of the absolute warp index: every layout the passes build for w warps works unchanged on warps base .. base + w - 1.
Registers: `registers[j]` > 0 gives the partition's warpgroups that many per thread with setmaxnreg (its warps a
multiple of 4); 0 keeps the entry count ptxas gives every thread of the block. The register file must hold them:
sum over partitions of 32 * warps * registers <= 65536.
"""
from __future__ import annotations

from dataclasses import dataclass

from .core import Operation

REGISTER_FILE = 65536
MAX_BLOCK_WARPS = 32  # 1024 threads
WARPGROUP_WARPS = 4
MAX_REGISTERS = 256
MIN_REGISTERS = 24


@dataclass(frozen=True)
class Partition:
    """One partition: its index, its first warp, its warp count and its setmaxnreg count (0: none)."""

    index: int
    base: int
    warps: int
    registers: int

    @property
    def first_thread(self) -> int:
        return 32 * self.base

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def barrier_id(self) -> int:
        """The named barrier its threads synchronize on (0 is the whole block's)."""
        return 1 + self.index


def place(warps: list[int], registers: list[int]) -> list[Partition]:
    """The partitions of a warp_specialize op with these per-partition warp counts and register counts;
    ValueError naming the problem when they are not a valid split of one block."""
    if len(warps) < 2 or len(registers) != len(warps):
        raise ValueError(f"warp_specialize needs at least two partitions and one register count each, got warps "
                         f"{warps} and registers {registers}")
    parts, end = [], 0
    for j, (w, r) in enumerate(zip(warps, registers)):
        if w < 1 or w & (w - 1):
            raise ValueError(f"partition {j}: warps must be a power of two, got {w}")
        if r:
            if w % WARPGROUP_WARPS:
                raise ValueError(f"partition {j}: a register budget (setmaxnreg) applies to whole warpgroups, so "
                                 f"its warps must be a multiple of 4, got {w}")
            if r % 8 or not MIN_REGISTERS <= r <= MAX_REGISTERS:
                raise ValueError(f"partition {j}: registers must be a multiple of 8 in {MIN_REGISTERS}.."
                                 f"{MAX_REGISTERS}, got {r}")
        base = -(-end // w) * w
        parts.append(Partition(j, base, w, r))
        end = base + w
    if end > MAX_BLOCK_WARPS:
        raise ValueError(f"the partitions need {end} warps; a block holds at most {MAX_BLOCK_WARPS}")
    budget = sum(p.threads * (p.registers or entry_registers(end)) for p in parts)
    if budget > REGISTER_FILE:
        raise ValueError(f"the partitions' registers ({' + '.join(f'{p.threads} x {p.registers or entry_registers(end)}' for p in parts)} "
                         f"= {budget}) exceed the register file ({REGISTER_FILE}); lower some partition's registers")
    return parts


def entry_registers(block_warps: int) -> int:
    """The most registers per thread a block of this many warps can start with at one block per SM (a multiple of
    8): the cap ptxas allocates under."""
    return min(MAX_REGISTERS - 1, REGISTER_FILE // (32 * block_warps)) // 8 * 8


def starting_registers(parts: list[Partition]) -> int:
    """The registers per thread the block starts with, as ptxas reports them for a warp-specialized kernel: the
    cap, or the largest setmaxnreg count when that is lower (nothing needs more). A partition's setmaxnreg is
    .inc from it (its count at or above it) or .dec (below)."""
    cap = entry_registers(block_warps(parts))
    return min(cap, max((p.registers for p in parts), default=cap) or cap)


def block_warps(parts: list[Partition]) -> int:
    """The block's warp count: up to the last partition's last warp."""
    return max(p.base + p.warps for p in parts)


def partitions_of(op: Operation) -> list[Partition]:
    """The partitions of an `mt.warp_specialize` op."""
    return place(list(op.attrs["warps"]), list(op.attrs["registers"]))


def enclosing_partition(op: Operation) -> tuple[Operation, Partition] | None:
    """(the warp_specialize op, the partition) whose region holds `op`, or None outside partitions."""
    child, parent = op, op.parent_op
    while parent is not None:
        if parent.name == "mt.warp_specialize":
            index = next(i for i, r in enumerate(parent.regions) if child.parent is r.block)
            return parent, partitions_of(parent)[index]
        child, parent = parent, parent.parent_op
    return None


def function_of(op: Operation) -> Operation:
    while op.name != "mt.func":
        parent = op.parent_op
        if parent is None:
            raise ValueError(f"'{op.name}' is not inside a function")
        op = parent
    return op


def warps_at(op: Operation) -> int:
    """The warps the code of `op` runs on and is laid out for: its partition's, else the function's layout warps
    (a warp-specialized kernel's consumer warps, or num_warps)."""
    found = enclosing_partition(op)
    if found is not None:
        return found[1].warps
    func = op if op.name == "mt.func" else function_of(op)
    return int(func.attrs.get("consumer_warps", func.attrs.get("num_warps", 4)))


def warps_of_ops(func: Operation) -> dict[Operation, int]:
    """warps_at for every op of `func`, in one walk."""
    default = int(func.attrs.get("consumer_warps", func.attrs.get("num_warps", 4)))
    out: dict[Operation, int] = {}

    def visit(block, warps: int) -> None:  # type: ignore[no-untyped-def]
        for op in block.ops:
            out[op] = warps
            if op.name == "mt.warp_specialize":
                for region, part in zip(op.regions, partitions_of(op)):
                    visit(region.block, part.warps)
            else:
                for region in op.regions:
                    visit(region.block, warps)

    out[func] = default
    visit(func.regions[0].block, default)
    return out
