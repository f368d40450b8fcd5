"""The kernel language: dtypes and builtins, declared simply.

Each builtin is a plain function whose body hands its arguments to the frontend's semantic layer
(`frontend/semantic.py`), which checks types and shapes and emits IR. They only work inside `@mt.kernel` /
`@mt.func` code, where the frontend calls them with `_sem` filled in; called from ordinary Python they raise.

    @mt.kernel
    def add(x, y, out, n, BLOCK: mt.constexpr):
        offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
        mask = offs < n
        mt.store(out + offs, mt.load(x + offs, mask=mask) + mt.load(y + offs, mask=mask), mask=mask)
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from .ir.types import (ScalarType, bfloat16, float16, float32, float64, int1, int8, int16, int32, int64, uint8,
                       uint16, uint32, uint64)

__all__ = [
    "constexpr", "dtype", "int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "program_id", "num_programs", "arange", "zeros", "full", "load",
    "blocked", "store", "prefetch", "atomic_add", "fence", "grid_dependency_wait", "launch_dependents", "barrier", "load_tensor_descriptor", "store_tensor_descriptor", "dot", "where",
    "sum", "max", "min", "cumsum", "cummax", "cummin", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "abs", "sin",
    "cos", "tanh", "floor", "ceil", "erf", "maximum", "minimum", "fma", "cdiv", "cast", "bitcast_split", "trans",
    "cat", "reshape", "broadcast_to", "expand_dims", "static_range", "static_assert", "ring", "warp_specialize",
    "partition",
]

dtype = ScalarType
bool_ = int1
float = float32  # noqa: A001 - spelled as users expect inside kernels: x.to(mt.float)
half = float16


class constexpr:
    """Annotation for compile-time parameters: `BLOCK: mt.constexpr`. Each value compiles its own variant."""


F = TypeVar("F", bound=Callable[..., Any])


def builtin(fn: F) -> F:
    """Mark a language builtin: callable only from kernel code, where the frontend passes `_sem`."""

    def outside_kernel(*args: Any, _sem: Any = None, **kwargs: Any) -> Any:
        host = getattr(outside_kernel, "__mt_host__", None)
        if _sem is None and host is not None:
            return host(*args, **kwargs)
        if _sem is None:
            raise RuntimeError(f"mt.{fn.__name__} can only be called inside an @mt.kernel or @mt.func function")
        return fn(*args, _sem=_sem, **kwargs)

    outside_kernel.__name__ = fn.__name__
    outside_kernel.__doc__ = fn.__doc__
    outside_kernel.__wrapped__ = fn  # type: ignore[attr-defined]
    outside_kernel.__mt_builtin__ = True  # type: ignore[attr-defined]
    return outside_kernel  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------ indices


@builtin
def program_id(axis: int, _sem: Any = None) -> Any:
    """The index of this program along grid `axis` (0, 1 or 2), an i32 scalar."""
    return _sem.program_id(axis)


@builtin
def num_programs(axis: int, _sem: Any = None) -> Any:
    """The number of programs along grid `axis`, an i32 scalar."""
    return _sem.num_programs(axis)


@builtin
def arange(start: int, end: int, _sem: Any = None) -> Any:
    """The i32 tile [start, start+1, ..., end-1]; end - start must be a power of two; both compile-time ints."""
    return _sem.arange(start, end)


@builtin
def zeros(shape: Any, dtype: ScalarType, _sem: Any = None) -> Any:
    """A tile of `shape` filled with zeros of `dtype`."""
    return _sem.full(shape, 0, dtype)


@builtin
def full(shape: Any, value: Any, dtype: ScalarType, _sem: Any = None) -> Any:
    """A tile of `shape` filled with `value` (a constant or a scalar) as `dtype`."""
    return _sem.full(shape, value, dtype)


# ------------------------------------------------------------------------------------------- memory


class blocked:
    """An explicit register layout for `mt.load(..., layout=mt.blocked(...))`, Triton's BlockedEncodingAttr: each
    thread holds size_per_thread[d] consecutive elements along dim d, threads_per_warp (product 32) and
    warps_per_cta (product num_warps) spread threads and warps over the dims, `order` lists the dims fastest
    first; the pattern repeats to cover the tile. E.g. `mt.blocked([128, 1], [1, 32], [1, 4], [0, 1])` for a
    [128, 128] tile gives each thread a whole column, so a sum over axis 0 stays inside the thread."""

    def __init__(self, size_per_thread: Any, threads_per_warp: Any, warps_per_cta: Any, order: Any):
        self.size_per_thread, self.threads_per_warp = list(size_per_thread), list(threads_per_warp)
        self.warps_per_cta, self.order = list(warps_per_cta), list(order)

    def __repr__(self) -> str:
        return (f"mt.blocked({self.size_per_thread}, {self.threads_per_warp}, {self.warps_per_cta}, "
                f"{self.order})")


@builtin
def load(pointer: Any, mask: Any = None, other: Any = None, cache_modifier: str = "", l2_prefetch: int = 0,
         layout: blocked | None = None, _sem: Any = None) -> Any:
    """Read the values at `pointer` (a pointer or a tile of pointers). Lanes where `mask` is false are not
    read and give `other` (0 when not given). `cache_modifier` picks the PTX cache operator of the global load,
    spelled as Triton spells it: "" (the default: cached in L1 and L2), ".ca" (the same, explicitly), ".cg" (L2
    only: data read once, e.g. a state streamed through, does not evict lines the program reads again from L1),
    ".cs" (streaming, evict first), ".lu" (last use), ".cv" (fetch again, do not cache). It is a performance hint:
    every choice reads the same values. Loads the pipeline pass turns into async copies do not keep it.
    `l2_prefetch` (64, 128 or 256; 0: the hardware's default) is how many bytes around a missed address the L2
    fetches from DRAM (PTX `.L2::256B`): for a stream read in 128-byte pieces, 256 brings the next piece in with
    the current one, doubling the bytes in flight per load. Also a hint only.
    `layout` (an `mt.blocked`) fixes the register layout the tile is loaded in instead of the coalesced one the
    compiler picks; what flows from the load takes it (until a reduction or another access decides otherwise).
    For when the math wants elements in one thread more than the memory wants coalescing."""
    return _sem.load(pointer, mask, other, cache_modifier, l2_prefetch, layout)


@builtin
def prefetch(pointer: Any, mask: Any = None, level: str = "L1", _sem: Any = None) -> None:
    """Bring the memory lines holding the pointees of `pointer` (a pointer or a tile of pointers) into the cache
    `level`, "L1" (this SM's L1, `prefetch.global.L1`) or "L2" (`prefetch.global.L2`), without waiting for them and
    without using registers for the data: a later load of those lines then hits there. It changes no value. Lanes
    where `mask` is false fetch nothing; every other lane must point at an element of a tensor, as for `load` (the
    interpreter checks it: on the GPU a stray prefetch is harmless, but it means the addresses are wrong).

    Why: Hopper's L1 does not keep lines a program's own stores wrote, so data a program writes and then reads
    back (a scratch written in one layout, read in another after `mt.barrier()`) comes from L2 at every first read;
    prefetching it once after the barrier makes those reads L1 hits. The codegen issues one prefetch per 128-byte
    line that a thread's contiguous run of pointers covers (one per element where nothing is known about
    contiguity), from the elements' owning threads only, so a tile of one pointer per line is the cheapest way to
    say "these lines"."""
    return _sem.prefetch(pointer, mask, level)


@builtin
def store(pointer: Any, value: Any, mask: Any = None, layout: blocked | None = None, _sem: Any = None) -> None:
    """Write `value` (converted to the pointee type) at `pointer`; lanes where `mask` is false write nothing.
    `layout` (an `mt.blocked`, as for mt.load) stores the tile from that register layout instead of the coalesced
    one (e.g. the layout it was computed in: no conversion through shared memory)."""
    return _sem.store(pointer, value, mask, layout)


@builtin
def atomic_add(pointer: Any, value: Any, mask: Any = None, _sem: Any = None) -> Any:
    """Atomically add `value` at `pointer`; returns the previous values."""
    return _sem.atomic_add(pointer, value, mask)


@builtin
def load_tensor_descriptor(desc: Any, offsets: Any, _sem: Any = None) -> Any:
    """`desc.load(offsets)`: the block of the tensor descriptor `desc` (an `mt.TensorDescriptor` argument) whose first
    element is at `offsets` (element offsets, outermost dim first), as a tile of the block shape. Elements outside
    the tensor read as 0. Lowered to a TMA copy into shared memory completed through an mbarrier."""
    return _sem.descriptor_load(desc, offsets)


@builtin
def store_tensor_descriptor(desc: Any, offsets: Any, value: Any, _sem: Any = None) -> None:
    """`desc.store(offsets, value)`: write `value` (converted to the descriptor's dtype, broadcast to its block
    shape) into the block at `offsets`; elements outside the tensor are not written. Lowered to a TMA store."""
    return _sem.descriptor_store(desc, offsets, value)


# ------------------------------------------------------------------------------------------ compute


@builtin
def dot(a: Any, b: Any, acc: Any = None, input_precision: str | None = None, block_structure: Any = None,
        k_chains: int = 1, instruction: str | None = None, _sem: Any = None) -> Any:
    """acc + a @ b for 2-D tiles (a: MxK, b: KxN of f16, bf16 or f32), accumulated in f32.
    `input_precision="tf32"` lets f32 inputs round to tf32 (tensor cores); `"tf32x3"` splits each f32 input into
    two tf32 parts and sums three tensor-core products (hi*hi + hi*lo + lo*hi: about fp32 accuracy at 3x the
    tensor-core work; a dot left on CUDA cores computes exact products); the default is exact products.
    `block_structure=(S, a_kind, b_kind)`: a and b are taken as zero outside the S x S blocks their kinds allow
    ("full", "diag", "lower", "strict_lower"; minitriton/ir/block_structure.py), i.e. the value is
    acc + mask(a) @ mask(b), and the tensor-core work that only meets zero blocks is skipped.
    `k_chains=n`: each warp accumulates its tiles in n independent chains over alternating K steps, summed at
    the end (mma.sync): more instruction-level parallelism where a warp holds one or two accumulator tiles and a
    long K, at n - 1 extra adds a register; the sums round in another order.
    `instruction="wgmma" | "mma" | "fma"` asks for that instruction for this dot where it applies (the compiler's
    choice otherwise, "auto"; passes/dot_lowering.py)."""
    return _sem.dot(a, b, acc, input_precision, block_structure, k_chains, instruction)


@builtin
def where(condition: Any, x: Any, y: Any, _sem: Any = None) -> Any:
    """Elementwise `x if condition else y`, broadcasting all three."""
    return _sem.where(condition, x, y)


@builtin
def sum(x: Any, axis: int | tuple[int, ...] | None = None, keep_dims: bool = False, _sem: Any = None) -> Any:  # noqa: A001
    """Sum over `axis` (a tuple: those axes; None: all). f16/bf16 accumulate and return f32; ints narrower than
    32 bits, i32."""
    return _sem.reduce(x, axis, "sum", keep_dims)


@builtin
def max(x: Any, axis: int | tuple[int, ...] | None = None, keep_dims: bool = False, _sem: Any = None) -> Any:  # noqa: A001
    """Maximum over `axis` (a tuple: those axes; None: all)."""
    return _sem.reduce(x, axis, "max", keep_dims)


@builtin
def min(x: Any, axis: int | tuple[int, ...] | None = None, keep_dims: bool = False, _sem: Any = None) -> Any:  # noqa: A001
    """Minimum over `axis` (a tuple: those axes; None: all)."""
    return _sem.reduce(x, axis, "min", keep_dims)


@builtin
def cumsum(x: Any, axis: int = 0, _sem: Any = None) -> Any:
    """Inclusive prefix sum along `axis` (f16/bf16 accumulate and return f32)."""
    return _sem.scan(x, axis, "sum")


@builtin
def cummax(x: Any, axis: int = 0, _sem: Any = None) -> Any:
    """Inclusive running maximum along `axis`, in x's type (floats: a NaN element yields the other operand)."""
    return _sem.scan(x, axis, "max")


@builtin
def cummin(x: Any, axis: int = 0, _sem: Any = None) -> Any:
    """Inclusive running minimum along `axis`, in x's type (floats: a NaN element yields the other operand)."""
    return _sem.scan(x, axis, "min")


def _math(name: str, doc: str) -> Callable[..., Any]:
    def fn(x: Any, _sem: Any = None) -> Any:
        return _sem.unary_math(name, x)

    fn.__name__ = name
    fn.__doc__ = doc
    return builtin(fn)


exp = _math("exp", "e ** x (integers are converted to f32 first).")
exp2 = _math("exp2", "2 ** x.")
log = _math("log", "Natural logarithm.")
log2 = _math("log2", "Base-2 logarithm.")
sqrt = _math("sqrt", "Square root.")
rsqrt = _math("rsqrt", "1 / sqrt(x).")
sigmoid = _math("sigmoid", "1 / (1 + exp(-x)).")
sin = _math("sin", "Sine.")
cos = _math("cos", "Cosine.")
tanh = _math("tanh", "Hyperbolic tangent.")
floor = _math("floor", "Round toward -inf.")
ceil = _math("ceil", "Round toward +inf.")
erf = _math("erf", "The error function.")


@builtin
def abs(x: Any, _sem: Any = None) -> Any:  # noqa: A001
    """|x| for integers and floats."""
    return _sem.abs(x)


@builtin
def maximum(x: Any, y: Any, _sem: Any = None) -> Any:
    """Elementwise max (for floats a NaN operand yields the other)."""
    return _sem.binary("maximum", x, y)


@builtin
def minimum(x: Any, y: Any, _sem: Any = None) -> Any:
    """Elementwise min (for floats a NaN operand yields the other)."""
    return _sem.binary("minimum", x, y)


@builtin
def fma(x: Any, y: Any, z: Any, _sem: Any = None) -> Any:
    """x * y + z with one rounding."""
    return _sem.fma(x, y, z)


@builtin
def cdiv(x: Any, y: Any, _sem: Any = None) -> Any:
    """Ceiling division (x + y - 1) // y of non-negative integers (also usable on the host for grid sizes)."""
    return _sem.cdiv(x, y)


cdiv.__mt_host__ = lambda x, y: -(-x // y)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------- shapes


@builtin
def cast(x: Any, dtype: ScalarType, bitcast: bool = False, _sem: Any = None) -> Any:
    """Convert to `dtype` (same as `x.to(dtype, bitcast=...)`)."""
    return _sem.cast(x, dtype, bitcast)


@builtin
def bitcast_split(x: Any, dtype: ScalarType, _sem: Any = None) -> Any:
    """Width-changing bitcast: a tile [..., n] of 64-, 32- or 16-bit (integer) elements -> [..., n, 2] of `dtype`,
    half the width; element [..., i, 0] = the low half of x[..., i]'s bits, [..., i, 1] = the high half. E.g. two
    bf16 built side by side in one uint32 (`lo | hi << 16`) become a pair of bf16 with no instruction at all, and
    a uint32 split twice (uint16, then uint8) gives its 4 bytes in memory order."""
    return _sem.bitcast_split(x, dtype)


@builtin
def trans(x: Any, *dims: int, _sem: Any = None) -> Any:
    """Permute dims (`order`); with none given, reverse them (a 2-D transpose)."""
    return _sem.trans(x, dims)


@builtin
def cat(tiles: Any, axis: int = 0, _sem: Any = None) -> Any:
    """Concatenate a list of tiles of one shape and dtype (a power-of-two count of them) along `axis`. Its inverse
    is a constant slice, `x[16:32, :]` (power-of-two size, start a multiple of it)."""
    return _sem.cat(tiles, axis)


@builtin
def reshape(x: Any, shape: Any, _sem: Any = None) -> Any:
    """The same elements in row-major order with a new shape."""
    return _sem.reshape(x, shape)


@builtin
def broadcast_to(x: Any, shape: Any, _sem: Any = None) -> Any:
    """Repeat size-1 dims (and add leading dims) to reach `shape`."""
    return _sem.broadcast_to(x, shape)


@builtin
def expand_dims(x: Any, axis: int, _sem: Any = None) -> Any:
    """Insert a dim of size 1 at `axis` (same as `x[:, None]` for axis 1)."""
    return _sem.expand_dims(x, axis)


# -------------------------------------------------------------------------------------- compile time


@builtin
def grid_dependency_wait(_sem: Any = None) -> None:
    """Programmatic dependent launch (CUDA's cudaGridDependencySynchronize): wait until the kernels this launch
    depends on (the previous one in the stream) have finished and their writes are visible. A kernel that calls it
    is launched so that its programs may start while the previous kernel still runs; before the call a program
    may only read what no kernel still running writes (weights, or inputs from before the previous kernel) and
    must write nothing such a kernel reads. Where the launch is not early (the interpreter, or a driver without
    cuLaunchKernelEx) it returns at once. Pairs with `mt.launch_dependents()` in the previous kernel."""
    return _sem.griddep("mt.griddep_wait")


@builtin
def launch_dependents(_sem: Any = None) -> None:
    """Programmatic dependent launch (cudaTriggerProgrammaticLaunchCompletion): this program lets the next kernel
    in the stream start (up to its `mt.grid_dependency_wait()`) before this kernel has finished; once every
    program has called it or exited, the next kernel's programs may take free SMs. Call it after this kernel's own
    grid_dependency_wait: the next kernel may then read what this kernel's predecessors wrote. Only scheduling: the
    next kernel's wait still waits for all of this kernel."""
    return _sem.griddep("mt.griddep_launch")


@builtin
def fence(sem: str = "acq_rel", _sem: Any = None) -> None:
    """A GPU-scope memory fence (PTX `fence.<sem>.gpu`) in every thread, as every program on the device sees the
    thread's accesses: "release" orders its accesses before the fence before its writes after it, "acquire" its
    reads before the fence before its accesses after it, "acq_rel" (the default) both. It is what makes a flag
    between programs safe. To publish data: write it, `mt.barrier()` (every thread's writes done),
    `mt.fence("release")`, then signal with `mt.atomic_add(flag, 1)`. To consume it: poll the flag
    (`mt.atomic_add(flag, 0)` in a while loop) until it says ready, `mt.fence("acquire")`, then read. An acquire
    invalidates the SM's L1 on Hopper (every program on the SM then misses there once): fence only where needed.
    Programs that wait on other programs must all be running at once, or wait only on work claimed before theirs:
    the GPU does not preempt a spinning program."""
    return _sem.fence(sem)


@builtin
def barrier(_sem: Any = None) -> None:
    """Wait until every thread of the program reaches this point; memory writes made before it (global and shared)
    are visible to every thread of the program after it. Needed when threads read what other threads of the same
    program wrote through pointers (e.g. a scratch buffer, or an in-place update read back in another layout):
    tile operations on values never need it."""
    return _sem.barrier()


class static_range:
    """`for i in mt.static_range(N)`: a loop unrolled at compile time; `i` is a constant in each copy."""

    def __init__(self, *args: int):
        self.args = args


@builtin
def static_assert(condition: Any, message: str = "", _sem: Any = None) -> None:
    """Fail compilation with `message` when the compile-time `condition` is false."""
    return _sem.static_assert(condition, message)


# ------------------------------------------------------------------------------------ warp specialization


@builtin
def ring(shape: Any, dtype: ScalarType, stages: int, _sem: Any = None) -> Any:
    """A ring of `stages` shared-memory slots, each a tile of `shape` and `dtype`, through which the partitions of
    an `mt.warp_specialize` block hand tiles to each other (a full and an empty mbarrier per slot). Allocate it
    before the partitions; then, with `i` a running fill count (0, 1, 2, ...: fill i goes to slot i % stages):

        ring.put(i, desc, [row, col])   wait until slot i % stages is free, then TMA-load the tile of the descriptor's
                                        tensor whose first element is (row, col) into it (zeros outside the tensor)
        ring.put(i, tile)               wait until the slot is free, then store the tile into it
        x = ring.get(i)                 wait until fill i landed; x is the slot's tile (a wgmma mt.dot reads it in
                                        place as A, as B, or as B^T through mt.trans(x); with B from a slot, A
                                        may be an accumulator-layout tile in registers)
        ring.release(i)                 this partition is done with fill i: the slot may be refilled

    Every fill must be released by the partition that reads it before fill i + stages can go into its slot."""
    from .frontend.partitions import make_ring

    return make_ring(_sem, shape, dtype, stages)


class warp_specialize:
    """`with mt.warp_specialize():` holding `with mt.partition(...):` blocks: the partitions run at the same time,
    each on warps of its own (the first, the default partition, on the kernel's num_warps warps). They share the
    scalars, pointers, descriptors and `mt.ring` buffers defined before; each computes its own tiles. Nothing may
    follow the block in the kernel."""


class partition:
    """One partition of an `mt.warp_specialize` block: `warps` (a power of two; the default partition's is the
    kernel's num_warps) and `registers` per thread (setmaxnreg; 0 keeps ptxas's entry count; needs whole
    warpgroups), e.g. `with mt.partition(warps=4, registers=40):` for a TMA producer."""

    def __init__(self, warps: int | None = None, registers: int = 0):
        self.warps, self.registers = warps, registers
