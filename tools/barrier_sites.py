"""Which ops of a kernel emit block barriers (`bar.sync`) in its PTX, by op and source line: the layout
conversions, reductions and dots that go through shared memory. No GPU needed.

    python tools/barrier_sites.py kernels_src/kda_decode.py kda_decode_step_kernel [--spec -1]

The kernel's AOT specialization number `--spec` (default the last) is compiled to PTX; every call of the codegen's
barrier is attributed to the op being lowered and to the innermost loop around it (its source line). A barrier
inside a loop runs once per iteration, so a count here is per occurrence in the code, not per execution.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import sys
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _short(loc: object) -> str:
    return str(loc).rsplit("/", 1)[-1].rstrip('")') if loc else "?"


def _innermost_loop(op) -> str:  # type: ignore[no-untyped-def]
    """The source line of the innermost scf.for around `op` ("-" outside loops): barriers there run per iteration."""
    parent = op.parent_op
    while parent is not None and parent.name != "scf.for":
        parent = parent.parent_op
    return _short(parent.loc) if parent is not None else "-"


@contextlib.contextmanager
def counted_barriers() -> Iterator[collections.Counter]:
    """While active, every barrier the codegen emits is counted by (op name, file:line:col, innermost loop)."""
    from minitriton.codegen import context

    counts: collections.Counter = collections.Counter()
    original = context.KernelContext.barrier

    def counting(self: context.KernelContext) -> None:
        op = self.op
        counts[(op.name, _short(op.loc), _innermost_loop(op)) if op is not None else ("?", "?", "-")] += 1
        original(self)

    context.KernelContext.barrier = counting  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        context.KernelContext.barrier = original  # type: ignore[method-assign]


def barrier_sites(kernel, spec_index: int = -1) -> collections.Counter:  # type: ignore[no-untyped-def]
    """Counter of (op name, file:line:col, innermost loop's line) -> barriers emitted while lowering that op."""
    with counted_barriers() as counts:
        kernel.specializations[spec_index].compile(target="ptx")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a kernel source file (e.g. kernels_src/kda_decode.py)")
    parser.add_argument("kernel", help="the @mt.kernel's name in it")
    parser.add_argument("--spec", type=int, default=-1, help="which AOT specialization (default the last)")
    args = parser.parse_args(argv)
    from minitriton.cli import import_file

    module = import_file(Path(args.file))
    kernel = getattr(module, args.kernel, None)
    if kernel is None or not getattr(kernel, "specializations", None):
        parser.error(f"{args.file} has no kernel {args.kernel!r} with AOT specializations")
    counts = barrier_sites(kernel, args.spec)
    print(f"{sum(counts.values())} bar.sync in {args.kernel} (specialization {args.spec}); count, op, source, "
          "innermost loop:")
    for (op, loc, loop), n in counts.most_common():
        print(f"{n:5d}  {op:24s} {loc:28s} {loop}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
