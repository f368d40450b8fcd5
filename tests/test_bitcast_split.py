"""mt.bitcast_split, the width-changing bitcast ([..., n] of 32 / 64 bits -> [..., n, 2] of half the width, low half
first): IR text and verifier, frontend errors, the interpreter against numpy's view of the same bytes, the compiled
PTX replayed in the simulator against the interpreter (bit for bit), and the tiling rule (a register rename: the
result keeps the operand's layout plus an in-thread pair dim; an in-thread sum over the pair dim gives it back).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import minitriton as mt
from minitriton.errors import CompilationError
from minitriton.frontend import compile_to_ir
from minitriton.ir import Operation, parse_module, print_module, tensor
from minitriton.ir.ops import OPS
from minitriton.ir.ops import VerifyError
from minitriton.ir.types import PointerType, ScalarType, TensorType
from minitriton.codegen import ptxas_path, run_ptxas
from minitriton.passes import run_passes

ptx_helpers = pytest.importorskip("ptx_helpers")

# (source type, half type) pairs the op supports, and the torch dtypes holding them
PAIRS = [("ui32", "bf16"), ("i32", "f16"), ("f32", "bf16"), ("f32", "ui16"), ("i32", "i16"), ("i64", "i32"), ("f64", "f32"),
         ("ui64", "f32"), ("i16", "ui8"), ("ui16", "i8")]
TORCH = {"ui32": torch.int32, "i32": torch.int32, "f32": torch.float32, "i64": torch.int64, "ui64": torch.int64,
         "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16, "ui16": torch.int16,
         "i16": torch.int16, "ui8": torch.uint8, "i8": torch.int8}
MT = {"bf16": mt.bfloat16, "f16": mt.float16, "ui16": mt.uint16, "i16": mt.int16, "i32": mt.int32,
      "f32": mt.float32, "ui8": mt.uint8, "i8": mt.int8}


@mt.kernel
def split_kernel(x_ptr, o_ptr, N: mt.constexpr, HALF: mt.constexpr):
    i = mt.arange(0, N)
    pair = mt.bitcast_split(mt.load(x_ptr + i), HALF)
    mt.store(o_ptr + 2 * i[:, None] + mt.arange(0, 2)[None, :], pair)


def _make(src: str, half: str, n: int, num_warps: int = 2):  # type: ignore[no-untyped-def]
    types = {"x_ptr": PointerType(ScalarType(src)), "o_ptr": PointerType(ScalarType(half))}
    return ptx_helpers.dsl(split_kernel, types, {"N": n, "HALF": MT[half]},
                           divisibility={"x_ptr": 16, "o_ptr": 16}, num_warps=num_warps)


def _random_words(src: str, n: int, half: str, gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns whose halves are finite numbers when the halves are floats (NaN payloads aside, every
    pattern is reproduced bit for bit; finite halves also let the comparison use values)."""
    if half in ("bf16", "f16", "f32"):
        halves = (torch.randn(2 * n, generator=gen, dtype=torch.float64) * 3).to(TORCH[half])
        halves[:4] = torch.tensor([0.0, -0.0, 1e-40 if half != "f16" else 1e-7, -65504.0], dtype=torch.float64
                                  ).to(TORCH[half])  # zero signs and a subnormal survive untouched
        return halves.view(TORCH[src])
    bits = 8 * torch.empty((), dtype=TORCH[src]).element_size()
    return torch.randint(-2 ** (bits - 1), 2 ** (bits - 1) - 1, (n,), generator=gen, dtype=torch.int64
                         ).to(TORCH[src]).view(TORCH[src])


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def test_ir_text_round_trips_and_the_verifier_checks_shapes() -> None:
    m = compile_to_ir(split_kernel, {"x_ptr": PointerType(ScalarType("ui32")),
                                     "o_ptr": PointerType(ScalarType("bf16"))}, {"N": 64, "HALF": mt.bfloat16})
    text = print_module(m)
    assert '"mt.bitcast_split"' in text and "(tensor<64xui32>) -> tensor<64x2xbf16>" in text
    assert print_module(parse_module(text)) == text
    word = next(o for o in m.functions[0].walk() if o.name == "mt.bitcast_split").operands[0]  # tensor<64xui32>
    bf16, i8 = ScalarType("bf16"), ScalarType("i8")
    for operand, result in ((word, tensor([64, 2], i8)), (word, tensor([128], bf16)), (word, tensor([64, 4], bf16)),
                            (op_of_16_bits(m), tensor([64, 2], bf16))):
        with pytest.raises(VerifyError, match="bitcast_split"):
            OPS["mt.bitcast_split"].check(Operation("mt.bitcast_split", [operand], [result]))


def op_of_16_bits(m):  # type: ignore[no-untyped-def]
    """A value of type tensor<64xbf16> (for the verifier test): a cast of the kernel's loaded words."""
    load = next(o for o in m.functions[0].walk() if o.name == "mt.load")
    return Operation("mt.cast", [load.result], [tensor([64], ScalarType("bf16"))]).result


@mt.kernel
def split_16_bit(x_ptr, o_ptr, N: mt.constexpr):
    i = mt.arange(0, N)
    mt.store(o_ptr + i, mt.sum(mt.bitcast_split(mt.load(x_ptr + i), mt.int8), axis=1))


def test_frontend_rejects_widths_that_do_not_halve() -> None:
    """32 -> 8 bits (a quarter) and a 16-bit float source (no 8-bit floats) are refused; i16 -> i8 compiles."""
    for src in ("i32", "f16"):
        with pytest.raises(CompilationError, match="bitcast_split splits"):
            compile_to_ir(split_16_bit, {"x_ptr": PointerType(ScalarType(src)),
                                         "o_ptr": PointerType(ScalarType("i8"))}, {"N": 16})
    compile_to_ir(split_16_bit, {"x_ptr": PointerType(ScalarType("i16")), "o_ptr": PointerType(ScalarType("i8"))},
                  {"N": 16})


@pytest.mark.parametrize("src,half", PAIRS)
def test_interpreter_and_ptx_match_the_bytes(src: str, half: str) -> None:
    """Element [i, 0] is the low half of word i and [i, 1] the high half: exactly the little-endian bytes of the
    words, read back as halves (numpy's view). Interpreter and the PTX replayed in the simulator, bit for bit; and
    ptxas accepts the PTX (bfe takes integer registers: an f32 source is moved to one first)."""
    n = 128
    gen = torch.Generator().manual_seed(7)
    x = _random_words(src, n, half, gen)
    out = torch.full((2 * n,), 77, dtype=TORCH[half]) if not TORCH[half].is_floating_point else \
        torch.full((2 * n,), float("nan"), dtype=TORCH[half])
    make = _make(src, half, n)
    want = _bits(x)  # the same bytes
    got_interp = ptx_helpers.run_interpreted(make, (1,), [x, out])[1]
    assert np.array_equal(_bits(got_interp), want)
    ptx, _, _ = ptx_helpers.lower(make)
    assert "mov.b32 {" in ptx or "mov.b64 {" in ptx or "bfe." in ptx
    if ptxas_path() is not None:
        run_ptxas(ptx)  # raises on PTX that ptxas rejects
    got_sim = ptx_helpers.run_simulated(make, (1,), [x, out], ptx)[1]
    assert np.array_equal(_bits(got_sim), want)


@mt.kernel
def pair_words(q_ptr, o_ptr, N: mt.constexpr):
    """Bytes [N, 2] -> one word per byte pair (byte 0 low, byte 1 at bit 16) by an in-thread sum, then split back
    into two 16-bit halves: each half is its byte."""
    i = mt.arange(0, N)
    p = mt.arange(0, 2)
    q = mt.load(q_ptr + 2 * i[:, None] + p[None, :]).to(mt.uint32)
    word = mt.sum(q << (16 * p.to(mt.uint32))[None, :], axis=1)
    mt.store(o_ptr + 2 * i[:, None] + p[None, :], mt.bitcast_split(word, mt.uint16))


def test_tiling_keeps_pairs_in_thread_without_conversions() -> None:
    """The layouts the tiling pass gives bitcast_split: the result holds each pair in one thread (pair dim fastest)
    and the operand is its slice over the pair dim, so the split itself is a register rename; and the result is
    right (interpreter and simulator)."""
    n = 256
    make = ptx_helpers.dsl(pair_words, {"q_ptr": PointerType(ScalarType("ui8")),
                                        "o_ptr": PointerType(ScalarType("ui16"))}, {"N": n},
                           divisibility={"q_ptr": 16, "o_ptr": 16}, num_warps=2)
    module = run_passes(make(), ["tiling"])
    split = next(op for op in module.functions[0].walk() if op.name == "mt.bitcast_split")
    enc, operand = split.result.type.encoding, split.operands[0].type.encoding
    assert enc.get("sizePerThread")[1] == 2 and enc.get("threadsPerWarp")[1] == 1 and enc.get("order")[0] == 1
    assert operand.kind == "slice" and operand.get("dim") == 1 and operand.get("parent") == enc
    ptx, _, _ = ptx_helpers.lower(make)
    q = torch.randint(0, 256, (2 * n,), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    out = torch.full((2 * n,), 77, dtype=torch.int16)
    for got in (ptx_helpers.run_interpreted(make, (1,), [q, out])[1],
                ptx_helpers.run_simulated(make, (1,), [q, out], ptx)[1]):
        assert torch.equal(got.to(torch.int32) & 0xFFFF, q.to(torch.int32))


@mt.kernel
def word_bytes(x_ptr, o_ptr, N: mt.constexpr):
    """Each uint32 split twice (uint16 halves, then bytes): its 4 bytes in memory order."""
    i = mt.arange(0, N)
    b = mt.bitcast_split(mt.bitcast_split(mt.load(x_ptr + i), mt.uint16), mt.uint8)  # [N, 2, 2]
    k = mt.arange(0, 2)
    mt.store(o_ptr + 4 * i[:, None, None] + 2 * k[None, :, None] + k[None, None, :], b)


def test_splitting_twice_gives_the_bytes_in_memory_order() -> None:
    n = 128
    make = ptx_helpers.dsl(word_bytes, {"x_ptr": PointerType(ScalarType("ui32")),
                                        "o_ptr": PointerType(ScalarType("ui8"))}, {"N": n},
                           divisibility={"x_ptr": 16, "o_ptr": 16}, num_warps=1)
    x = torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), generator=torch.Generator().manual_seed(5), dtype=torch.int64
                      ).to(torch.int32)
    out = torch.zeros(4 * n, dtype=torch.uint8)
    ptx, _, _ = ptx_helpers.lower(make)
    for got in (ptx_helpers.run_interpreted(make, (1,), [x, out])[1],
                ptx_helpers.run_simulated(make, (1,), [x, out], ptx)[1]):
        assert torch.equal(got, x.view(torch.uint8))
