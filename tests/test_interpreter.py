"""The IR interpreter against numpy / torch references.

Kernels are built directly with minitriton.ir.Builder (through the small KernelBuilder below), verified, and run
with check_types=True so every op's result is also checked against the value representation (dtype, shape, bf16
rounding). Inputs are fresh random numbers, outputs are poisoned before each run, and each comparison states its
bound.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Callable, Sequence

import numpy as np
import pytest
import torch

from minitriton.errors import InterpreterError
from minitriton.interpreter import compile_function, interpret
from minitriton.ir import Block, Builder, Location, Region, Value, function_body, make_function, verify
from minitriton.ir.types import (PointerType, ScalarType, TensorType, Type, bf16, f16, f32, f64, i1, i8, i16, i32,
                                 i64, u8, u32, u64, with_scalar)

KERNEL_FILE = "kernel_under_test.py"
TORCH_DTYPE = {"i1": torch.bool, "i8": torch.int8, "ui8": torch.uint8, "i16": torch.int16, "i32": torch.int32,
               "ui32": torch.uint32, "i64": torch.int64, "f16": torch.float16, "bf16": torch.bfloat16,
               "f32": torch.float32, "f64": torch.float64}


def ptr(t: ScalarType) -> PointerType:
    return PointerType(t)


def tt(shape: Sequence[int], element: ScalarType | PointerType) -> TensorType:
    return TensorType(tuple(shape), element)


class KernelBuilder:
    """Builds one mt.func op by op; every op gets Location(KERNEL_FILE, self.line)."""

    def __init__(self, name: str, params: list[tuple[str, Type]], divisibility: list[int] | None = None):
        types = [t for _, t in params]
        self.func = make_function(name, types, [n for n, _ in params], loc=Location(KERNEL_FILE, 1),
                                  num_warps=4, divisibility=divisibility or [1] * len(params))
        self.b = Builder(function_body(self.func), Location(KERNEL_FILE, 2))
        self.arg = dict(zip((n for n, _ in params), function_body(self.func).args))

    def at(self, line: int) -> None:
        self.b.loc = Location(KERNEL_FILE, line)

    def op(self, name: str, operands: Sequence[Value], ty: Type, **attrs: Any) -> Value:
        return self.b.create1(name, list(operands), ty, **attrs)

    # values
    def const(self, value: Any, ty: Type) -> Value:
        return self.op("mt.constant", [], ty, value=value)

    def pid(self, axis: int) -> Value:
        return self.op("mt.program_id", [], i32, axis=axis)

    def nprog(self, axis: int) -> Value:
        return self.op("mt.num_programs", [], i32, axis=axis)

    def arange(self, start: int, end: int) -> Value:
        return self.op("mt.arange", [], tt([end - start], i32), start=start, end=end)

    # shapes
    def splat(self, v: Value, shape: Sequence[int]) -> Value:
        return self.op("mt.splat", [v], tt(shape, v.type.scalar))

    def bcast(self, v: Value, shape: Sequence[int]) -> Value:
        return self.op("mt.broadcast", [v], tt(shape, v.type.scalar))

    def expand(self, v: Value, axis: int) -> Value:
        shape = list(v.type.shape)
        shape.insert(axis, 1)
        return self.op("mt.expand_dims", [v], tt(shape, v.type.scalar), axis=axis)

    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        return self.op("mt.reshape", [v], tt(shape, v.type.scalar))

    def trans(self, v: Value, order: Sequence[int]) -> Value:
        shape = [v.type.shape[i] for i in order]
        return self.op("mt.trans", [v], tt(shape, v.type.scalar), order=list(order))

    # memory
    def addptr(self, p: Value, off: Value) -> Value:
        return self.op("mt.addptr", [p, off], p.type)

    def load(self, p: Value, mask: Value | None = None, other: Value | None = None) -> Value:
        operands = [p] + ([mask] if mask is not None else []) + ([other] if other is not None else [])
        return self.op("mt.load", operands, with_scalar(p.type, p.type.scalar.pointee))

    def store(self, p: Value, v: Value, mask: Value | None = None) -> None:
        self.b.create("mt.store", [p, v] + ([mask] if mask is not None else []))

    def atomic_add(self, p: Value, v: Value, mask: Value | None = None) -> Value:
        return self.op("mt.atomic_add", [p, v] + ([mask] if mask is not None else []), v.type)

    # elementwise
    def bin(self, name: str, a: Value, b: Value) -> Value:
        return self.op(f"mt.{name}", [a, b], a.type)

    def un(self, name: str, a: Value) -> Value:
        return self.op(f"mt.{name}", [a], a.type)

    def cmp(self, pred: str, a: Value, b: Value) -> Value:
        return self.op("mt.cmp", [a, b], with_scalar(a.type, i1), predicate=pred)

    def select(self, c: Value, a: Value, b: Value) -> Value:
        return self.op("mt.select", [c, a, b], a.type)

    def cast(self, v: Value, to: ScalarType) -> Value:
        return self.op("mt.cast", [v], with_scalar(v.type, to))

    def bitcast(self, v: Value, to: ScalarType | PointerType) -> Value:
        return self.op("mt.bitcast", [v], with_scalar(v.type, to))

    def reduce(self, v: Value, axis: int, kind: str) -> Value:
        shape = v.type.shape[:axis] + v.type.shape[axis + 1:]
        ty = tt(shape, v.type.scalar) if shape else v.type.scalar
        return self.op("mt.reduce", [v], ty, axis=axis, kind=kind)

    def scan(self, v: Value, axis: int, kind: str) -> Value:
        return self.op("mt.scan", [v], v.type, axis=axis, kind=kind)

    def dot(self, a: Value, b: Value, acc: Value, precision: str = "ieee") -> Value:
        return self.op("mt.dot", [a, b, acc], acc.type, input_precision=precision)

    # control flow
    def _region(self, arg_types: Sequence[Type], body: Callable[..., Sequence[Value]], end: str = "scf.yield"
                ) -> Region:
        block = Block(arg_types)
        outer, self.b.block = self.b.block, block
        values = list(body(*block.args))
        self.b.create(end, values)
        self.b.block = outer
        return Region([block])

    def for_(self, lb: Value, ub: Value, step: Value, inits: Sequence[Value],
             body: Callable[..., Sequence[Value]]) -> list[Value]:
        region = self._region([lb.type] + [v.type for v in inits], body)
        return self.b.create("scf.for", [lb, ub, step, *inits], [v.type for v in inits], regions=[region]).results

    def if_(self, cond: Value, result_types: Sequence[Type], then: Callable[[], Sequence[Value]],
            other: Callable[[], Sequence[Value]]) -> list[Value]:
        regions = [self._region([], then), self._region([], other)]
        return self.b.create("scf.if", [cond], list(result_types), regions=regions).results

    def while_(self, inits: Sequence[Value], before: Callable[..., Sequence[Value]],
               after: Callable[..., Sequence[Value]], fwd_types: Sequence[Type]) -> list[Value]:
        regions = [self._region([v.type for v in inits], before, "scf.condition"), self._region(fwd_types, after)]
        return self.b.create("scf.while", list(inits), list(fwd_types), regions=regions).results

    def finish(self) -> Any:
        self.b.create("mt.return", [])
        verify(self.func)
        return self.func


def run(func: Any, grid: Sequence[int], args: list) -> None:
    interpret(func, tuple(grid), args, check_types=True)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def poison(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.full(tuple(shape), float("nan"), dtype=dtype)
    if dtype == torch.bool:
        return torch.ones(tuple(shape), dtype=dtype)
    return torch.full(tuple(shape), 0x7F, dtype=dtype)


def rand(shape: Sequence[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.rand(tuple(shape), generator=gen) < 0.5
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**62)), min(info.max, 2**62), tuple(shape), generator=gen,
                         dtype=torch.int64).to(dtype)


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator()
    g.seed()  # fresh inputs every run
    return g


def block_offsets(k: KernelBuilder, block: int) -> Value:
    """pid * block + arange(block), as i32."""
    base = k.bin("mul", k.pid(0), k.const(block, i32))
    return k.bin("add", k.splat(base, [block]), k.arange(0, block))


# ------------------------------------------------------------------------------------------------ vector add


def vector_add_kernel(elem: ScalarType, block: int) -> Any:
    k = KernelBuilder("add", [("x", ptr(elem)), ("y", ptr(elem)), ("out", ptr(elem)), ("n", i32)])
    offs = block_offsets(k, block)
    mask = k.cmp("lt", offs, k.splat(k.arg["n"], [block]))
    px, py, po = (k.addptr(k.splat(k.arg[a], [block]), offs) for a in ("x", "y", "out"))
    total = k.bin("add", k.load(px, mask), k.load(py, mask))
    k.store(po, total, mask)
    return k.finish()


@pytest.mark.parametrize("elem", [f32, f16, bf16, i32, i64, f64])
def test_vector_add_masked(elem: ScalarType, gen: torch.Generator) -> None:
    n, block = 1000, 128  # 1000 is not a multiple of the block: the last program is partly masked
    dtype = TORCH_DTYPE[elem.name]
    x, y = rand([n], dtype, gen), rand([n], dtype, gen)
    storage = poison([n + 40], dtype)
    out = storage[:n]  # lanes past n would land in the poisoned tail if the mask failed
    run(vector_add_kernel(elem, block), [math.ceil(n / block)], [x, y, out, n])
    assert torch.equal(out, x + y)  # one IEEE addition (rounded from f32 for f16/bf16; wrapping for ints)
    assert torch.equal(storage[n:].view(torch.uint8), poison([40], dtype).view(torch.uint8))


def test_compiled_function_reuse(gen: torch.Generator) -> None:
    compiled = compile_function(vector_add_kernel(f32, 64))
    for n in (5, 64, 200):
        x, y, out = rand([n], torch.float32, gen), rand([n], torch.float32, gen), poison([n], torch.float32)
        compiled((math.ceil(n / 64),), [x, y, out, n])
        assert torch.equal(out, x + y)


# ------------------------------------------------------------------------------------------------ 2-D tiles


def tile_2d_kernel(bm: int, bn: int) -> Any:
    """out[i, j] = x[i, j] * 2 + 1 over an M x N matrix with arbitrary strides, one bm x bn tile per program."""
    params = [("x", ptr(f32)), ("out", ptr(f32)), ("M", i32), ("N", i32), ("sxm", i32), ("sxn", i32), ("som", i32)]
    k = KernelBuilder("tile2d", params)
    rm = k.bin("add", k.splat(k.bin("mul", k.pid(0), k.const(bm, i32)), [bm]), k.arange(0, bm))
    rn = k.bin("add", k.splat(k.bin("mul", k.pid(1), k.const(bn, i32)), [bn]), k.arange(0, bn))
    rows, cols = k.bcast(k.expand(rm, 1), [bm, bn]), k.bcast(k.expand(rn, 0), [bm, bn])
    mask = k.bin("and", k.cmp("lt", rows, k.splat(k.arg["M"], [bm, bn])),
                 k.cmp("lt", cols, k.splat(k.arg["N"], [bm, bn])))

    def address(base: str, stride_m: Value, stride_n: Value | None) -> Value:
        off = k.bin("mul", rows, k.splat(stride_m, [bm, bn]))
        col = cols if stride_n is None else k.bin("mul", cols, k.splat(stride_n, [bm, bn]))
        return k.addptr(k.splat(k.arg[base], [bm, bn]), k.bin("add", off, col))

    x = k.load(address("x", k.arg["sxm"], k.arg["sxn"]), mask)
    y = k.bin("add", k.bin("mul", x, k.const(2.0, tt([bm, bn], f32))), k.const(1.0, tt([bm, bn], f32)))
    k.store(address("out", k.arg["som"], None), y, mask)
    return k.finish()


@pytest.mark.parametrize("view", ["row_major", "transposed", "sliced"])
def test_2d_pointer_arithmetic(view: str, gen: torch.Generator) -> None:
    base = rand([45, 70], torch.float32, gen)
    x = {"row_major": base, "transposed": base.t(), "sliced": base[3:40:2, 5:]}[view]
    m, n = x.shape
    out = poison([m, n], torch.float32)
    bm, bn = 16, 32
    run(tile_2d_kernel(bm, bn), [math.ceil(m / bm), math.ceil(n / bn)], [x, out, m, n, x.stride(0), x.stride(1), n])
    assert torch.equal(out, x * 2 + 1)  # two exact-per-element IEEE ops, identical in torch


def test_pointers_to_different_tensors_in_one_tile(gen: torch.Generator) -> None:
    """A tile of pointers that mixes two tensors (select between them per lane)."""
    k = KernelBuilder("mix", [("a", ptr(f32)), ("b", ptr(f32)), ("out", ptr(f32))])
    offs = k.arange(0, 64)
    pa, pb = k.addptr(k.splat(k.arg["a"], [64]), offs), k.addptr(k.splat(k.arg["b"], [64]), offs)
    odd = k.cmp("ne", k.bin("and", offs, k.const(1, tt([64], i32))), k.const(0, tt([64], i32)))
    k.store(k.addptr(k.splat(k.arg["out"], [64]), offs), k.load(k.select(odd, pb, pa)))
    a, b, out = rand([64], torch.float32, gen), rand([64], torch.float32, gen), poison([64], torch.float32)
    run(k.finish(), [1], [a, b, out])
    assert torch.equal(out, torch.where(torch.arange(64) % 2 == 1, b, a))


def test_shape_ops_trans_reshape(gen: torch.Generator) -> None:
    k = KernelBuilder("shapes", [("x", ptr(f32)), ("t", ptr(f32)), ("r", ptr(f32))])
    rows = k.bcast(k.expand(k.arange(0, 8), 1), [8, 16])
    cols = k.bcast(k.expand(k.arange(0, 16), 0), [8, 16])
    x = k.load(k.addptr(k.splat(k.arg["x"], [8, 16]), k.bin("add", k.bin("mul", rows, k.const(16, tt([8, 16], i32))),
                                                              cols)))
    xt = k.trans(x, [1, 0])  # 16 x 8
    rt = k.bcast(k.expand(k.arange(0, 16), 1), [16, 8])
    ct = k.bcast(k.expand(k.arange(0, 8), 0), [16, 8])
    k.store(k.addptr(k.splat(k.arg["t"], [16, 8]), k.bin("add", k.bin("mul", rt, k.const(8, tt([16, 8], i32))), ct)),
            xt)
    flat = k.reshape(x, [4, 32])
    rr = k.bcast(k.expand(k.arange(0, 4), 1), [4, 32])
    cr = k.bcast(k.expand(k.arange(0, 32), 0), [4, 32])
    k.store(k.addptr(k.splat(k.arg["r"], [4, 32]), k.bin("add", k.bin("mul", rr, k.const(32, tt([4, 32], i32))), cr)),
            flat)
    x_in = rand([8, 16], torch.float32, gen)
    t_out, r_out = poison([16, 8], torch.float32), poison([4, 32], torch.float32)
    run(k.finish(), [1], [x_in, t_out, r_out])
    assert torch.equal(t_out, x_in.t()) and torch.equal(r_out, x_in.reshape(4, 32))


def test_program_ids_and_num_programs_3d_grid() -> None:
    k = KernelBuilder("grid", [("out", ptr(i32)), ("counts", ptr(i32))])
    x, y, z = k.pid(0), k.pid(1), k.pid(2)
    nx, ny, nz = k.nprog(0), k.nprog(1), k.nprog(2)
    linear = k.bin("add", k.bin("mul", k.bin("add", k.bin("mul", z, ny), y), nx), x)
    code = k.bin("add", k.bin("add", x, k.bin("mul", y, k.const(10, i32))), k.bin("mul", z, k.const(100, i32)))
    k.store(k.addptr(k.arg["out"], linear), code)
    counts = k.bin("add", k.bin("add", nx, k.bin("mul", ny, k.const(10, i32))), k.bin("mul", nz, k.const(100, i32)))
    k.store(k.addptr(k.arg["counts"], linear), counts)
    out, counts_out = poison([3, 4, 5], torch.int32), poison([3, 4, 5], torch.int32)
    run(k.finish(), [5, 4, 3], [out, counts_out])
    zz, yy, xx = torch.meshgrid(torch.arange(3), torch.arange(4), torch.arange(5), indexing="ij")
    assert torch.equal(out, (xx + 10 * yy + 100 * zz).int())
    assert (counts_out == 345).all()


# ------------------------------------------------------------------------------------------------ bf16 / f16


def test_bf16_load_f32_math_bf16_store_bit_exact(gen: torch.Generator) -> None:
    n = 512
    k = KernelBuilder("bf16", [("x", ptr(bf16)), ("out", ptr(bf16))])
    offs = k.arange(0, n)
    x = k.cast(k.load(k.addptr(k.splat(k.arg["x"], [n]), offs)), f32)
    y = k.bin("add", k.bin("mul", x, k.const(1.7, tt([n], f32))), k.const(0.3, tt([n], f32)))
    k.store(k.addptr(k.splat(k.arg["out"], [n]), offs), k.cast(y, bf16))
    func = k.finish()
    x_in = (torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 20)).to(torch.bfloat16)
    x_in[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.3e38, -0.0, 1e-40]).to(torch.bfloat16)
    out = torch.full([n], 0x7F7F, dtype=torch.int16).view(torch.bfloat16)
    run(func, [1], [x_in, out])
    ref = (x_in.float() * 1.7 + 0.3).to(torch.bfloat16)  # torch rounds f32 -> bf16 to nearest even
    # NaN bit patterns differ between torch's scalar (0x7FC0) and vector (0xFFFF) paths: compare NaNs by position
    assert torch.equal(out.isnan(), ref.isnan()) and out[0].isnan()
    finite = ~ref.isnan()
    assert torch.equal(out.view(torch.int16)[finite], ref.view(torch.int16)[finite])


def test_bf16_and_f16_elementwise_math_rounds_each_result(gen: torch.Generator) -> None:
    """f16/bf16 ops compute in f32 and round back, like torch's CPU kernels for mul/div/sqrt."""
    n = 256
    for elem in (bf16, f16):
        dtype = TORCH_DTYPE[elem.name]
        k = KernelBuilder("lowp", [("x", ptr(elem)), ("y", ptr(elem)), ("o1", ptr(elem)), ("o2", ptr(elem)),
                                   ("o3", ptr(elem)), ("o4", ptr(elem))])
        offs = k.arange(0, n)
        x, y = (k.load(k.addptr(k.splat(k.arg[a], [n]), offs)) for a in ("x", "y"))
        results = {"o1": k.bin("mul", x, y), "o2": k.bin("div", x, y), "o3": k.un("sqrt", k.un("abs", x)),
                   "o4": k.bin("add", x, k.const(0.1, tt([n], elem)))}
        for name, value in results.items():
            k.store(k.addptr(k.splat(k.arg[name], [n]), offs), value)
        xs, ys = rand([n], dtype, gen), rand([n], dtype, gen)
        outs = [poison([n], dtype) for _ in range(4)]
        run(k.finish(), [1], [xs, ys, *outs])
        tenth = torch.tensor(0.1, dtype=torch.float64).to(dtype).float()  # the constant rounds once to the type
        # the f32 sqrt from float64 (rounded twice, innocuous: 53 >= 2 * 24 + 2): torch's CPU f32 sqrt is not
        # always correctly rounded (sqrt(1 - 2**-11) comes out 1 ulp high), the interpreter's and the GPU's are
        f32_sqrt = xs.double().abs().sqrt().float()
        refs = [xs.float() * ys.float(), xs.float() / ys.float(), f32_sqrt, xs.float() + tenth]
        for out, ref in zip(outs, refs):
            # f32 results of f16/bf16 inputs, rounded once more: double rounding is innocuous here, so bit-exact
            assert torch.equal(out, ref.to(dtype)), elem


# ------------------------------------------------------------------------------------------------ reduce / scan


def reduce_kernel(elem: ScalarType, kind: str, axis: int, scan: bool, shape: tuple[int, int]) -> Any:
    m, n = shape
    k = KernelBuilder("red", [("x", ptr(elem)), ("out", ptr(elem)), ("total", ptr(elem))])
    rows, cols = k.bcast(k.expand(k.arange(0, m), 1), [m, n]), k.bcast(k.expand(k.arange(0, n), 0), [m, n])
    flat = k.bin("add", k.bin("mul", rows, k.const(n, tt([m, n], i32))), cols)
    x = k.load(k.addptr(k.splat(k.arg["x"], [m, n]), flat))
    if scan:
        k.store(k.addptr(k.splat(k.arg["out"], [m, n]), flat), k.scan(x, axis, kind))
        k.store(k.arg["total"], k.reduce(k.reshape(x, [m * n]), 0, kind))  # and a full reduction to a scalar
    else:
        r = k.reduce(x, axis, kind)
        idx = k.arange(0, shape[1 - axis])
        k.store(k.addptr(k.splat(k.arg["out"], [shape[1 - axis]]), idx), r)
        k.store(k.arg["total"], k.reduce(r, 0, kind))  # rank 1 -> scalar
    return k.finish()


NP_REDUCE = {"sum": np.add, "max": np.fmax, "min": np.fmin}


@pytest.mark.parametrize("elem", [f32, i32, u8, f16, bf16])
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("scan", [False, True])
def test_reduce_and_scan(elem: ScalarType, kind: str, axis: int, scan: bool, gen: torch.Generator) -> None:
    shape = (8, 32)
    dtype = TORCH_DTYPE[elem.name]
    x = rand(shape, dtype, gen)
    out = poison(shape if scan else [shape[1 - axis]], dtype)
    total = poison([1], dtype)
    run(reduce_kernel(elem, kind, axis, scan, shape), [1], [x, out, total])
    ufunc = NP_REDUCE[kind] if elem.is_float else {"sum": np.add, "max": np.maximum, "min": np.minimum}[kind]
    # Reference in numpy: integers in their own type (sums wrap), floats in float64 then rounded to the type.
    xn = x.numpy() if elem.name != "bf16" else x.float().numpy()
    compute = np.float64 if elem.is_float else xn.dtype
    if scan:
        ref = ufunc.accumulate(xn.astype(compute), axis=axis, dtype=compute)
        ref_total = ufunc.reduce(xn.reshape(-1).astype(compute), dtype=compute)
    else:
        ref = ufunc.reduce(xn.astype(compute), axis=axis, dtype=compute)
        ref_total = ufunc.reduce(ufunc.reduce(xn.astype(compute), axis=axis, dtype=compute).astype(xn.dtype)
                                 .astype(compute), dtype=compute)
    ref_t = torch.from_numpy(np.asarray(ref)).to(dtype)
    ref_total_t = torch.tensor([ref_total]).to(dtype)
    if kind != "sum" or not elem.is_float:
        assert torch.equal(out, ref_t) and torch.equal(total, ref_total_t)  # exact: max/min, wrapping int sums
    else:
        # f32 sums accumulate in f32 (f16/bf16 in f32, then one rounding): bound = a few roundings of the type
        eps = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}[elem.name]
        scale = np.abs(xn.astype(np.float64)).sum()
        assert (out.double() - ref_t.double()).abs().max() <= 2 * eps * scale
        assert abs(total.double().item() - float(ref_total)) <= 2 * eps * scale


def test_float_max_min_ignore_nan(gen: torch.Generator) -> None:
    k = KernelBuilder("nanmax", [("x", ptr(f32)), ("mx", ptr(f32)), ("mn", ptr(f32)), ("ew", ptr(f32))])
    offs = k.arange(0, 16)
    x = k.load(k.addptr(k.splat(k.arg["x"], [16]), offs))
    k.store(k.arg["mx"], k.reduce(x, 0, "max"))
    k.store(k.arg["mn"], k.reduce(x, 0, "min"))
    k.store(k.addptr(k.splat(k.arg["ew"], [16]), offs), k.bin("maximum", x, k.const(0.5, tt([16], f32))))
    xs = rand([16], torch.float32, gen)
    xs[3] = float("nan")
    mx, mn, ew = poison([1], torch.float32), poison([1], torch.float32), poison([16], torch.float32)
    run(k.finish(), [1], [xs, mx, mn, ew])
    finite = xs[~xs.isnan()]
    assert mx.item() == finite.max().item() and mn.item() == finite.min().item()
    assert torch.equal(ew, torch.fmax(xs, torch.tensor(0.5)))  # NaN lane gives 0.5


# ------------------------------------------------------------------------------------------------ dot


def dot_kernel(elem: ScalarType, m: int, n: int, kk: int, precision: str) -> Any:
    k = KernelBuilder("dot", [("a", ptr(elem)), ("b", ptr(elem)), ("c", ptr(f32)), ("out", ptr(f32))])

    def tile(name: str, rows: int, cols: int) -> Value:
        r, c = k.bcast(k.expand(k.arange(0, rows), 1), [rows, cols]), k.bcast(k.expand(k.arange(0, cols), 0),
                                                                                [rows, cols])
        return k.addptr(k.splat(k.arg[name], [rows, cols]),
                        k.bin("add", k.bin("mul", r, k.const(cols, tt([rows, cols], i32))), c))

    acc = k.load(tile("c", m, n))
    k.store(tile("out", m, n), k.dot(k.load(tile("a", m, kk)), k.load(tile("b", kk, n)), acc, precision))
    return k.finish()


def tf32_reference(x: torch.Tensor) -> torch.Tensor:
    """f32 -> tf32, to nearest with ties to even (PTX cvt.rn.tf32.f32), computed on the int32 bits in torch."""
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000).to(torch.int32).view(torch.float32)
    return torch.where(x.isfinite(), rounded, x)


@pytest.mark.parametrize("elem,precision", [(f32, "ieee"), (f16, "ieee"), (bf16, "ieee"), (f32, "tf32")])
def test_dot(elem: ScalarType, precision: str, gen: torch.Generator) -> None:
    m, n, kk = 32, 16, 64
    dtype = TORCH_DTYPE[elem.name]
    a, b, c = rand([m, kk], dtype, gen), rand([kk, n], dtype, gen), rand([m, n], torch.float32, gen)
    out = poison([m, n], torch.float32)
    run(dot_kernel(elem, m, n, kk, precision), [1], [a, b, c, out])
    a64, b64 = a.double(), b.double()
    if precision == "tf32":
        a64, b64 = tf32_reference(a.float()).double(), tf32_reference(b.float()).double()
    ref = c.double() + a64 @ b64
    magnitude = c.double().abs() + a64.abs() @ b64.abs()
    # Exact products and a float64 sum rounded once to f32: within one f32 rounding (2**-24 relative) of the
    # magnitude, plus float64 summation error.
    assert ((out.double() - ref).abs() <= 2.0**-24 * magnitude + 1e-12).all()
    if precision == "tf32":  # and tf32 really rounded the inputs: the exact-input product differs noticeably
        exact = c.double() + a.double() @ b.double()
        assert (out.double() - exact).abs().max() > 1e-5


# ------------------------------------------------------------------------------------------------ control flow


def test_scf_for_with_carried_tile_and_scalar(gen: torch.Generator) -> None:
    """acc = sum of rows lb, lb+step, ... < ub of x (tile carried), count = number of iterations (scalar carried)."""
    n = 64
    k = KernelBuilder("loop", [("x", ptr(f32)), ("out", ptr(f32)), ("count", ptr(i32)), ("lb", i32), ("ub", i32)])
    cols = k.arange(0, n)

    def body(iv: Value, acc: Value, count: Value) -> list[Value]:
        row = k.bin("add", k.splat(k.bin("mul", iv, k.const(n, i32)), [n]), cols)
        x = k.load(k.addptr(k.splat(k.arg["x"], [n]), row))
        return [k.bin("add", acc, x), k.bin("add", count, k.const(1, i32))]

    acc, count = k.for_(k.arg["lb"], k.arg["ub"], k.const(3, i32), [k.const(0.0, tt([n], f32)), k.const(0, i32)],
                        body)
    k.store(k.addptr(k.splat(k.arg["out"], [n]), cols), acc)
    k.store(k.arg["count"], count)
    func = k.finish()
    x = rand([20, n], torch.float32, gen)
    for lb, ub in ((1, 20), (5, 5), (2, 3)):
        out, cnt = poison([n], torch.float32), poison([1], torch.int32)
        run(func, [1], [x, out, cnt, lb, ub])
        ref = torch.zeros(n)
        for r in range(lb, ub, 3):
            ref = ref + x[r]  # same order of f32 additions as the kernel: exact
        assert torch.equal(out, ref) and cnt.item() == len(range(lb, ub, 3))


def test_scf_while_collatz(gen: torch.Generator) -> None:
    """steps = number of Collatz steps from n to 1; a scalar loop whose trip count depends on data."""
    k = KernelBuilder("collatz", [("n", i32), ("out", ptr(i32))])

    def before(v: Value, steps: Value) -> list[Value]:
        return [k.cmp("ne", v, k.const(1, i32)), v, steps]

    def after(v: Value, steps: Value) -> list[Value]:
        odd = k.cmp("eq", k.bin("and", v, k.const(1, i32)), k.const(1, i32))
        nxt = k.select(odd, k.bin("add", k.bin("mul", v, k.const(3, i32)), k.const(1, i32)),
                       k.bin("shr", v, k.const(1, i32)))
        return [nxt, k.bin("add", steps, k.const(1, i32))]

    _, steps = k.while_([k.arg["n"], k.const(0, i32)], before, after, [i32, i32])
    k.store(k.arg["out"], steps)
    func = k.finish()
    for start in torch.randint(1, 10_000, (5,), generator=gen).tolist() + [1, 27]:
        out = poison([1], torch.int32)
        run(func, [1], [start, out])
        v, ref = start, 0
        while v != 1:
            v, ref = (3 * v + 1 if v % 2 else v // 2), ref + 1
        assert out.item() == ref


def test_scf_if_on_program_id(gen: torch.Generator) -> None:
    """Even programs store x * 2, odd programs x - 1; a tile and a scalar are yielded."""
    n = 32
    k = KernelBuilder("branch", [("x", ptr(f32)), ("out", ptr(f32)), ("flag", ptr(i32))])
    offs = block_offsets(k, n)
    x = k.load(k.addptr(k.splat(k.arg["x"], [n]), offs))
    even = k.cmp("eq", k.bin("rem", k.pid(0), k.const(2, i32)), k.const(0, i32))
    y, f = k.if_(even, [tt([n], f32), i32],
                 lambda: [k.bin("mul", x, k.const(2.0, tt([n], f32))), k.const(10, i32)],
                 lambda: [k.bin("sub", x, k.const(1.0, tt([n], f32))), k.const(20, i32)])
    k.store(k.addptr(k.splat(k.arg["out"], [n]), offs), y)
    k.store(k.addptr(k.arg["flag"], k.pid(0)), f)
    xs, out, flag = rand([4 * n], torch.float32, gen), poison([4 * n], torch.float32), poison([4], torch.int32)
    run(k.finish(), [4], [xs, out, flag])
    even_rows = (torch.arange(4 * n) // n) % 2 == 0
    assert torch.equal(out, torch.where(even_rows, xs * 2, xs - 1))
    assert flag.tolist() == [10, 20, 10, 20]


# ------------------------------------------------------------------------------------------------ casts


def elementwise_kernel(src: ScalarType, dst: ScalarType, n: int, make: Callable[[KernelBuilder, Value], Value]) -> Any:
    k = KernelBuilder("ew", [("x", ptr(src)), ("out", ptr(dst))])
    offs = k.arange(0, n)
    k.store(k.addptr(k.splat(k.arg["out"], [n]), offs), make(k, k.load(k.addptr(k.splat(k.arg["x"], [n]), offs))))
    return k.finish()


def run_cast(src: ScalarType, dst: ScalarType, values: list, bit: bool = False) -> list:
    n = 1 << max(0, (len(values) - 1).bit_length())
    x = torch.tensor(values + [values[0]] * (n - len(values)), dtype=TORCH_DTYPE[src.name])
    out = poison([n], TORCH_DTYPE[dst.name])
    run(elementwise_kernel(src, dst, n, lambda k, v: (k.bitcast if bit else k.cast)(v, dst)), [1], [x, out])
    return out[: len(values)].tolist()


NAN, INF = float("nan"), float("inf")


def test_float_to_int_casts_truncate_saturate_and_nan_to_zero() -> None:
    vals = [NAN, INF, -INF, -1.5, 1.5, -2.7, 2.7, 1e10, -1e10, 3e9, -0.0, 255.9, 256.0, -128.5, 2.0**63]
    assert run_cast(f32, i32, vals) == [0, 2**31 - 1, -2**31, -1, 1, -2, 2, 2**31 - 1, -2**31, 2**31 - 1, 0, 255,
                                       256, -128, 2**31 - 1]
    assert run_cast(f32, u32, vals) == [0, 2**32 - 1, 0, 0, 1, 0, 2, 2**32 - 1, 0, 3_000_000_000, 0, 255, 256, 0,
                                       2**32 - 1]
    assert run_cast(f32, i8, vals) == [0, 127, -128, -1, 1, -2, 2, 127, -128, 127, 0, 127, 127, -128, 127]
    assert run_cast(f32, u8, vals) == [0, 255, 0, 0, 1, 0, 2, 255, 0, 255, 0, 255, 255, 0, 255]
    assert run_cast(f32, i64, vals) == [0, 2**63 - 1, -2**63, -1, 1, -2, 2, 10**10, -10**10, 3 * 10**9, 0, 255, 256,
                                       -128, 2**63 - 1]
    assert run_cast(f32, i1, vals) == [True, True, True, True, True, True, True, True, True, True, False, True, True,
                                      True, True]


def test_int_casts_wrap_and_to_float_round() -> None:
    assert run_cast(i32, u32, [-1, -2**31, 5]) == [2**32 - 1, 2**31, 5]
    assert run_cast(i32, i8, [200, -129, 0x12345678, -1]) == [-56, 127, 0x78, -1]
    assert run_cast(i32, i64, [-5, 2**31 - 1]) == [-5, 2**31 - 1]
    assert run_cast(u8, i32, [255, 0, 128]) == [255, 0, 128]  # zero-extends
    assert run_cast(i8, i32, [-1, -128]) == [-1, -128]  # sign-extends
    assert run_cast(i32, f32, [16777217, -16777219, 3]) == [16777216.0, -16777220.0, 3.0]  # nearest even
    assert run_cast(i32, i1, [0, 5, -1]) == [False, True, True]
    assert run_cast(i1, i32, [True, False]) == [1, 0]


def test_float_to_float_casts() -> None:
    assert run_cast(f32, f16, [70000.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, -1e-8, NAN])[:4] == \
        [INF, 1.0, 1.0 + 2.0**-9, -0.0]  # overflow -> inf, ties to even, underflow -> signed zero
    assert math.isnan(run_cast(f32, f16, [NAN])[0])
    bf_vals = [1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20, 3.4e38, -INF]
    assert run_cast(f32, bf16, bf_vals) == [1.0, 1.0 + 2.0**-6, 1.0 + 2.0**-7, INF, -INF]
    # f64 -> bf16 rounds once: a value just above a bf16 tie must round up even though f32 would make it a tie
    # (and one just below a tie must round down although f32 rounds it up onto the tie)
    above, below = 1.0 + 2.0**-8 + 2.0**-40, 1.0 + 2.0**-8 - 2.0**-40
    assert run_cast(f64, bf16, [above, below, 1.0 + 2.0**-8, -above]) == [1.0 + 2.0**-7, 1.0, 1.0, -1.0 - 2.0**-7]
    assert run_cast(bf16, f32, [1.5, -3.0]) == [1.5, -3.0]
    assert run_cast(f16, bf16, [65504.0]) == [65536.0]


def test_bitcasts() -> None:
    f32_bits = lambda v: struct.unpack("<i", struct.pack("<f", v))[0]  # noqa: E731
    assert run_cast(f32, i32, [1.0, -2.5, INF], bit=True) == [f32_bits(1.0), f32_bits(-2.5), 0x7F800000]
    assert run_cast(f32, u32, [-0.0], bit=True) == [0x80000000]
    assert run_cast(i32, f32, [0x3FC00000, -0x40000000], bit=True) == [1.5, -2.0]
    assert run_cast(bf16, i16, [1.0, -2.0], bit=True) == [0x3F80, -0x4000]
    assert run_cast(i16, bf16, [0x3FC0, 0x7F80], bit=True) == [1.5, INF]
    assert run_cast(f16, i16, [1.0], bit=True) == [0x3C00]


def test_pointer_int_bitcast_round_trip(gen: torch.Generator) -> None:
    """ptr -> i64, add 4 bytes per lane by integer math, i64 -> ptr, load: equals x."""
    k = KernelBuilder("p2i", [("x", ptr(f32)), ("out", ptr(f32))])
    offs = k.arange(0, 16)
    addr = k.bin("add", k.splat(k.bitcast(k.arg["x"], i64), [16]),
                 k.bin("mul", k.cast(offs, i64), k.const(4, tt([16], i64))))
    k.store(k.addptr(k.splat(k.arg["out"], [16]), offs), k.load(k.bitcast(addr, ptr(f32))))
    x, out = rand([16], torch.float32, gen), poison([16], torch.float32)
    run(k.finish(), [1], [x, out])
    assert torch.equal(out, x)


# ------------------------------------------------------------------------------------------------ integers


def c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def wrap(v: int, bits: int, signed: bool) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


@pytest.mark.parametrize("elem", [i32, u32, i8, i64, u64])
def test_integer_div_rem_shifts_cmp(elem: ScalarType, gen: torch.Generator) -> None:
    n, bits, signed = 64, elem.bits, elem.is_signed
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    a = [int(v) for v in np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen))).integers(
        lo, hi, n, dtype=np.int64 if bits < 64 or signed else np.uint64)]
    b = [int(v) or 3 for v in np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen))).integers(
        lo, hi, n, dtype=np.int64 if bits < 64 or signed else np.uint64)]
    b[:4] = [1, 2, 7, bits + 3]  # small divisors and an over-wide shift
    if signed:
        a[4], b[4] = lo, -1  # INT_MIN / -1 wraps
        b[5] = -7
    shifts = [v % (bits + 8) for v in b]  # include shift amounts >= the bit width
    np_dt = elem.numpy_name
    names = ["div", "rem", "shl", "shr", "lt", "mul", "sub"]
    k = KernelBuilder("ints", [("a", ptr(elem)), ("b", ptr(elem)), ("s", ptr(elem))] +
                      [(nm, ptr(i1 if nm == "lt" else elem)) for nm in names])
    offs = k.arange(0, n)
    va, vb, vs = (k.load(k.addptr(k.splat(k.arg[x], [n]), offs)) for x in ("a", "b", "s"))
    results = {"div": k.bin("div", va, vb), "rem": k.bin("rem", va, vb), "shl": k.bin("shl", va, vs),
               "shr": k.bin("shr", va, vs), "lt": k.cmp("lt", va, vb), "mul": k.bin("mul", va, vb),
               "sub": k.bin("sub", va, vb)}
    for nm in names:
        k.store(k.addptr(k.splat(k.arg[nm], [n]), offs), results[nm])
    func = k.finish()
    arrays = [torch.from_numpy(np.array(v, dtype=np.int64).astype(np_dt) if signed or bits < 64 else
                               np.array(v, dtype=np.uint64)) for v in (a, b, shifts)]
    outs = {nm: torch.from_numpy(np.full(n, 0x7F, dtype=bool if nm == "lt" else np_dt)) for nm in names}
    run(func, [1], arrays + [outs[nm] for nm in names])
    got = {nm: [int(v) for v in outs[nm].numpy()] for nm in names}
    q = [wrap(c_div(x, y), bits, signed) for x, y in zip(a, b)]
    assert got["div"] == q
    assert got["rem"] == [wrap(x - c_div(x, y) * y, bits, signed) for x, y in zip(a, b)]
    assert got["shl"] == [wrap(x << s, bits, signed) if s < bits else 0 for x, s in zip(a, shifts)]
    assert got["shr"] == [x >> min(s, bits - 1) if signed else (x >> s if s < bits else 0) for x, s in zip(a, shifts)]
    assert got["lt"] == [int(x < y) for x, y in zip(a, b)]
    assert got["mul"] == [wrap(x * y, bits, signed) for x, y in zip(a, b)]
    assert got["sub"] == [wrap(x - y, bits, signed) for x, y in zip(a, b)]


def test_signed_vs_unsigned_compare_same_bits() -> None:
    k = KernelBuilder("cmp", [("s", ptr(i1)), ("u", ptr(i1))])
    minus_one, one = k.const(-1, i32), k.const(1, i32)
    k.store(k.arg["s"], k.cmp("lt", minus_one, one))
    k.store(k.arg["u"], k.cmp("lt", k.cast(minus_one, u32), k.cast(one, u32)))
    s, u = poison([1], torch.bool), poison([1], torch.bool)
    s[0], u[0] = False, True
    run(k.finish(), [1], [s, u])
    assert s.item() is True and u.item() is False


# ------------------------------------------------------------------------------------------------ float math


@pytest.mark.parametrize("name,ref,bound", [
    ("exp", torch.exp, 2e-7), ("exp2", torch.exp2, 2e-7), ("log", torch.log, 2e-7), ("log2", torch.log2, 2e-7),
    ("sqrt", torch.sqrt, 1e-7), ("rsqrt", torch.rsqrt, 2e-7), ("sigmoid", torch.sigmoid, 3e-7),
    ("sin", torch.sin, 2e-7), ("cos", torch.cos, 2e-7), ("tanh", torch.tanh, 3e-7), ("erf", torch.erf, 3e-7),
    ("floor", torch.floor, 0), ("ceil", torch.ceil, 0), ("neg", torch.neg, 0), ("abs", torch.abs, 0),
])
def test_f32_math_vs_float64(name: str, ref: Callable, bound: float, gen: torch.Generator) -> None:
    n = 256
    x = rand([n], torch.float32, gen) * 3
    if name in ("log", "log2", "sqrt", "rsqrt"):
        x = x.abs() + 1e-3
    out = poison([n], torch.float32)
    run(elementwise_kernel(f32, f32, n, lambda k, v: k.un(name, v)), [1], [x, out])
    want = ref(x.double())
    # numpy's float32 routines: within a few ulp (bound: relative to |want|, absolute near zero for sin/cos and
    # for log/log2, whose result vanishes at x = 1 while their error stays about an ulp of the argument; fresh
    # inputs near 1 failed the relative bound now and then)
    floor = 1.0 if name in ("sin", "cos", "log", "log2") else 0
    assert ((out.double() - want).abs() <= bound * want.abs().clamp(min=floor)
            + (0 if bound == 0 else 1e-30)).all(), name


def test_f32_binary_math(gen: torch.Generator) -> None:
    n = 128
    k = KernelBuilder("fbin", [("a", ptr(f32)), ("b", ptr(f32)), ("c", ptr(f32))] +
                      [(nm, ptr(f32)) for nm in ("div", "rem", "pow", "fma", "minimum")])
    offs = k.arange(0, n)
    va, vb, vc = (k.load(k.addptr(k.splat(k.arg[x], [n]), offs)) for x in ("a", "b", "c"))
    outs = {"div": k.bin("div", va, vb), "rem": k.bin("rem", va, vb), "pow": k.bin("pow", k.un("abs", va), vb),
            "fma": k.op("mt.fma", [va, vb, vc], va.type), "minimum": k.bin("minimum", va, vb)}
    for nm, v in outs.items():
        k.store(k.addptr(k.splat(k.arg[nm], [n]), offs), v)
    a, b, c = (rand([n], torch.float32, gen) for _ in range(3))
    b[0], a[1] = 0.0, NAN
    res = {nm: poison([n], torch.float32) for nm in outs}
    run(k.finish(), [1], [a, b, c, *res.values()])
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(res["div"], a / b, **exact)  # IEEE division (x/0 = inf), correctly rounded in both
    torch.testing.assert_close(res["rem"], torch.fmod(a, b), **exact)  # an exact operation
    want_pow = a.double().abs() ** b.double()
    torch.testing.assert_close(res["pow"].double(), want_pow, rtol=4e-7, atol=0, equal_nan=True)
    want_fma = (a.double() * b.double() + c.double()).float()  # exact product, one rounding (double rounding aside)
    torch.testing.assert_close(res["fma"], want_fma, rtol=2.0**-23, atol=0, equal_nan=True)
    torch.testing.assert_close(res["minimum"], torch.fmin(a, b), **exact)
    assert res["minimum"][1] == b[1]  # min(NaN, b) = b


# ------------------------------------------------------------------------------------------------ memory


def oob_kernel(kind: str, masked: bool, line: int) -> Any:
    """Loads (or stores) x[offs] for offs = arange(32) + shift; line `line` holds the memory op."""
    k = KernelBuilder("oob", [("x", ptr(f32)), ("out", ptr(f32)), ("shift", i32), ("n", i32)])
    offs = k.bin("add", k.arange(0, 32), k.splat(k.arg["shift"], [32]))
    mask = k.cmp("lt", offs, k.splat(k.arg["n"], [32])) if masked else None
    px, po = k.addptr(k.splat(k.arg["x"], [32]), offs), k.addptr(k.splat(k.arg["out"], [32]), k.arange(0, 32))
    if kind == "load":
        k.at(line)
        v = k.load(px, mask, k.const(-1.0, tt([32], f32)) if masked else None)
        k.at(line + 1)
        k.store(po, v)
    elif kind == "prefetch":  # checked like a load, though it reads nothing
        k.at(line)
        k.b.create("mt.prefetch", [px] + ([mask] if masked else []), attrs={"level": "L1"})
        k.store(po, k.load(po))
    else:
        v = k.load(po)
        k.at(line)
        k.store(px, v, mask)
    return k.finish()


@pytest.mark.parametrize("kind", ["load", "store", "prefetch"])
def test_unmasked_out_of_bounds_raises_with_location(kind: str, gen: torch.Generator) -> None:
    x, out = rand([40], torch.float32, gen), rand([32], torch.float32, gen)
    before = x.clone()
    with pytest.raises(InterpreterError) as err:
        run(oob_kernel(kind, masked=False, line=42), [1], [x, out, 10, 40])
    message = str(err.value)
    assert f"{KERNEL_FILE}:42" in message and "out of bounds" in message and "'x'" in message
    assert "lane (30,)" in message  # the first offending lane: offset 40 of a 40-element tensor
    assert torch.equal(x, before)  # nothing was written by the failing store
    with pytest.raises(InterpreterError, match="before the start"):
        run(oob_kernel(kind, masked=False, line=42), [1], [x, out, -3, 40])


@pytest.mark.parametrize("kind", ["load", "store", "prefetch"])
def test_masked_out_of_bounds_is_fine(kind: str, gen: torch.Generator) -> None:
    base = rand([48], torch.float32, gen)
    x = base[:40]  # the storage continues past x: a masked lane must still not touch it
    out = poison([32], torch.float32) if kind == "load" else rand([32], torch.float32, gen)
    before = base.clone()
    run(oob_kernel(kind, masked=True, line=7), [1], [x, out, 20, 40])
    if kind == "load":
        assert torch.equal(out[:20], x[20:]) and (out[20:] == -1.0).all()
        assert torch.equal(base, before)
    elif kind == "prefetch":
        assert torch.equal(base, before)
    else:
        assert torch.equal(base[20:40], out[:20]) and torch.equal(base[40:], before[40:])
        assert torch.equal(base[:20], before[:20])


def test_view_with_storage_offset_bounds_are_the_storage(gen: torch.Generator) -> None:
    """Bounds are the whole storage (like the GPU's allocation), not the view: reading before a view's first
    element but inside its storage is legal; leaving the storage is not."""
    base = rand([64], torch.float32, gen)
    k = KernelBuilder("before", [("x", ptr(f32)), ("out", ptr(f32))])
    offs = k.bin("sub", k.arange(0, 16), k.const(8, tt([16], i32)))
    k.store(k.addptr(k.splat(k.arg["out"], [16]), k.arange(0, 16)), k.load(k.addptr(k.splat(k.arg["x"], [16]), offs)))
    func = k.finish()
    out = poison([16], torch.float32)
    run(func, [1], [base[10:], out])
    assert torch.equal(out, base[2:18])
    with pytest.raises(InterpreterError, match="bytes before the start"):
        run(func, [1], [base[4:], out])


def test_misaligned_and_wild_pointers_raise(gen: torch.Generator) -> None:
    def kernel(byte_offset: int) -> Any:
        k = KernelBuilder("mis", [("x", ptr(f32)), ("out", ptr(f32))])
        k.at(99)
        addr = k.bin("add", k.bitcast(k.arg["x"], i64), k.const(byte_offset, i64))
        k.store(k.arg["out"], k.load(k.bitcast(addr, ptr(f32))))
        return k.finish()

    x, out = rand([8], torch.float32, gen), poison([1], torch.float32)
    with pytest.raises(InterpreterError, match=r"kernel_under_test.py:99.*misaligned"):
        run(kernel(2), [1], [x, out])
    with pytest.raises(InterpreterError, match="no buffer"):
        run(kernel(-(1 << 42)), [1], [x, out])


def test_store_duplicate_addresses_last_lane_wins(gen: torch.Generator) -> None:
    k = KernelBuilder("dup", [("x", ptr(f32)), ("out", ptr(f32))])
    offs = k.arange(0, 64)
    v = k.load(k.addptr(k.splat(k.arg["x"], [64]), offs))
    k.store(k.addptr(k.splat(k.arg["out"], [64]), k.bin("rem", offs, k.const(8, tt([64], i32)))), v)
    x, out = rand([64], torch.float32, gen), poison([8], torch.float32)
    run(k.finish(), [1], [x, out])
    assert torch.equal(out, x[56:])  # lane 56 + j is the last to write out[j]


def test_atomic_add_histogram_and_old_values(gen: torch.Generator) -> None:
    n, bins = 128, 8
    k = KernelBuilder("hist", [("idx", ptr(i32)), ("hist", ptr(i32)), ("old", ptr(i32)), ("fsum", ptr(f32)),
                               ("vals", ptr(f32))])
    offs = block_offsets(k, n)
    idx = k.load(k.addptr(k.splat(k.arg["idx"], [n]), offs))
    keep = k.cmp("ne", idx, k.const(bins - 1, tt([n], i32)))  # masked lanes (last bin) must not count
    old = k.atomic_add(k.addptr(k.splat(k.arg["hist"], [n]), idx), k.const(1, tt([n], i32)), keep)
    k.store(k.addptr(k.splat(k.arg["old"], [n]), offs), old)
    vals = k.load(k.addptr(k.splat(k.arg["vals"], [n]), offs))
    k.atomic_add(k.addptr(k.splat(k.arg["fsum"], [n]), idx), vals)
    idx_in = torch.randint(0, bins, (2 * n,), generator=gen, dtype=torch.int32)
    hist, old_out, fsum = torch.zeros(bins, dtype=torch.int32), poison([2 * n], torch.int32), torch.zeros(bins)
    vals_in = rand([2 * n], torch.float32, gen)
    run(k.finish(), [2], [idx_in, hist, old_out, fsum, vals_in])
    ref = torch.bincount(idx_in.long(), minlength=bins).int()
    ref[bins - 1] = 0
    assert torch.equal(hist, ref)
    # Lanes apply in order (program 0 before program 1, row-major within a tile): old = count of earlier equals.
    for i in range(2 * n):
        b = int(idx_in[i])
        want = 0 if b == bins - 1 else int((idx_in[:i] == b).sum())
        assert old_out[i].item() == want
    ref_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx_in.long(), vals_in.double())
    assert (fsum.double() - ref_sum).abs().max() <= 2 * n * 2.0**-24 * vals_in.abs().sum()  # sequential f32 adds


def test_scalar_pointer_load_store_atomic(gen: torch.Generator) -> None:
    """Scalar (non-tile) memory ops: a masked scalar load with `other`, and a scalar atomic add returning the old
    value."""
    k = KernelBuilder("scalars", [("x", ptr(f32)), ("out", ptr(f32)), ("acc", ptr(i64)), ("old", ptr(i64))])
    p = k.addptr(k.arg["x"], k.pid(0))
    odd = k.cmp("eq", k.bin("and", k.pid(0), k.const(1, i32)), k.const(1, i32))
    v = k.load(p, odd, k.const(-5.0, f32))
    k.store(k.addptr(k.arg["out"], k.pid(0)), v)
    old = k.atomic_add(k.arg["acc"], k.cast(k.pid(0), i64))
    k.store(k.addptr(k.arg["old"], k.pid(0)), old)
    x, out = rand([6], torch.float32, gen), poison([6], torch.float32)
    acc, old_out = torch.tensor([1000], dtype=torch.int64), poison([6], torch.int64)
    run(k.finish(), [6], [x, out, acc, old_out])
    assert torch.equal(out, torch.where(torch.arange(6) % 2 == 1, x, torch.tensor(-5.0)))
    assert acc.item() == 1000 + 15 and old_out.tolist() == [1000, 1000, 1001, 1003, 1006, 1010]


# ------------------------------------------------------------------------------------------------ arguments


def test_scalar_arguments_and_divisibility_check(gen: torch.Generator) -> None:
    k = KernelBuilder("axpy", [("x", ptr(f32)), ("out", ptr(f32)), ("alpha", f32), ("n", i32)], [16, 16, 1, 16])
    offs = k.arange(0, 16)
    x = k.load(k.addptr(k.splat(k.arg["x"], [16]), offs))
    k.store(k.addptr(k.splat(k.arg["out"], [16]), offs), k.bin("mul", x, k.splat(k.arg["alpha"], [16])))
    func = k.finish()
    x_in, out = rand([20], torch.float32, gen), poison([16], torch.float32)
    run(func, [1], [x_in, out, 0.25, 32])
    assert torch.equal(out, x_in[:16] * 0.25)
    with pytest.raises(InterpreterError, match="'x'.*divisible by 16"):
        run(func, [1], [x_in[1:], out, 0.25, 32])  # 4 bytes past an aligned storage start
    with pytest.raises(InterpreterError, match="'n'.*divisible by 16"):
        run(func, [1], [x_in, out, 0.25, 33])
    with pytest.raises(InterpreterError, match="takes 4 arguments"):
        run(func, [1], [x_in, out, 0.25])
    with pytest.raises(InterpreterError, match="does not fit i32"):
        run(func, [1], [x_in, out, 0.25, 2**40])


def test_unknown_op_names_its_location() -> None:
    k = KernelBuilder("unknown", [("x", ptr(f32))])
    k.at(77)
    k.b.create("mt.convert_layout_from_the_future", [k.arg["x"]], [ptr(f32)])
    k.b.create("mt.return", [])
    with pytest.raises(InterpreterError, match=r"kernel_under_test.py:77.*unknown op 'mt.convert_layout_from_the"):
        interpret(k.func, (1,), [torch.zeros(1)])


def test_layout_encodings_are_ignored(gen: torch.Generator) -> None:
    """A tiled module (tensor types carrying layouts) interprets like the untiled one."""
    from minitriton.ir.types import layout

    func = vector_add_kernel(f32, 64)
    enc = layout("blocked", size_per_thread=[4], threads_per_warp=[32], warps_per_cta=[4], order=[0])
    for op in func.walk():
        for r in op.results:
            if isinstance(r.type, TensorType):
                r.type = r.type.with_encoding(enc)
    # and a layout conversion (inserted by the tiling pass) changes no value
    store = next(op for op in func.walk() if op.name == "mt.store")
    value = store.operands[1]
    convert = Builder(store.parent, store.loc).create("mt.convert_layout", [value], [value.type])
    store.parent.ops.remove(convert)
    store.parent.insert(store.parent.ops.index(store), convert)
    store.operands[1] = convert.result
    x, y, out = rand([100], torch.float32, gen), rand([100], torch.float32, gen), poison([100], torch.float32)
    run(func, [2], [x, y, out, 100])
    assert torch.equal(out, x + y)
