"""Tensor descriptors (TMA) on the CPU: the IR type and ops, the frontend, the interpreter's TMA semantics, the host
descriptor (the cuTensorMapEncodeTiled call mocked), the runtime path, the PTX (ptxas), and the PTX run in the
simulator (tests/ptx_sim_tma.py) against the interpreter. GPU runs are in test_tma_gpu.py."""
from __future__ import annotations

import ctypes
import re
import struct
from typing import Any

import pytest
import torch

import minitriton as mt
from minitriton import compiler
from minitriton.codegen import run_ptxas
from minitriton.codegen.tma import swizzle
from minitriton.errors import CompilationError, InterpreterError
from minitriton.frontend import compile_to_ir
from minitriton.interpreter import interpret
from minitriton.ir import VerifyError, parse_module, parse_type, print_module, verify
from minitriton.ir.core import Operation
from minitriton.ir.parser import ParseError
from minitriton.ir.types import (PointerType, ScalarType, TensorDescType, TensorType, bf16, f16, f32, i8, i32,
                                 tensor)
from minitriton.runtime import set_driver, tma
from minitriton.runtime.launcher import Launcher
from minitriton.runtime.specialize import SignatureError, parse_arg_spec, parse_signature
from ptx_helpers import dsl, lower
from ptx_sim import SimError, run_ptx
from tma_kernels import (box_reference, pointers_to_tma, random_tensor, store_reference, tma_3d_to_pointers,
                         tma_block_sums, tma_copy_scaled, tma_store_whole_boxes, tma_to_pointers)

TORCH_OF = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i8": torch.int8}


def desc_type(shape: tuple[int, ...], element: ScalarType) -> TensorDescType:
    return TensorDescType(TensorType(shape, element))


def descriptor(t: torch.Tensor, block: list[int]) -> Any:
    return mt.TensorDescriptor.from_tensor(t, block)


# ------------------------------------------------------------------------------------------- IR


def test_descriptor_type_prints_parses_and_knows_its_swizzle() -> None:
    for text, swz in [("!mt.tensordesc<tensor<64x64xbf16>>", 128), ("!mt.tensordesc<tensor<32x32xf32>>", 128),
                      ("!mt.tensordesc<tensor<64x32xbf16>>", 0), ("!mt.tensordesc<tensor<2x4x16xi8>>", 0)]:
        t = parse_type(text)
        assert isinstance(t, TensorDescType) and str(t) == text and t.swizzle_bytes == swz
    assert parse_type("(!mt.tensordesc<tensor<8x8xf16>>, i32) -> ()").inputs[0] == desc_type((8, 8), f16)
    for bad, message in [("!mt.tensordesc<f32>", "takes a tensor type"), ("!mt.ptr<tensor<4xf32>>", "scalar"),
                         ("!mt.tensordesc<tensor<64x4xbf16>>", "multiple of 16 bytes"),
                         ("!mt.tensordesc<tensor<512x8xf32>>", "at most 256"),
                         ("!mt.tensordesc<tensor<8x8xi1>>", "cannot hold i1"),
                         ("!mt.foo<tensor<8x8xf32>>", "unknown type")]:
        with pytest.raises(ParseError, match=message):
            parse_type(bad)


def copy_module(block: tuple[int, int] = (64, 32), element: ScalarType = bf16) -> Any:
    d = desc_type(block, element)
    return compile_to_ir(tma_copy_scaled, {"src": d, "dst": d}, {"BM": block[0], "BN": block[1]})


def test_descriptor_ops_come_from_the_frontend_and_round_trip() -> None:
    module = copy_module()
    verify(module)
    text = print_module(module)
    assert '"mt.descriptor_load"(%arg0, ' in text and '"mt.descriptor_store"(%arg1, ' in text
    assert "-> tensor<64x32xbf16>" in text
    assert print_module(parse_module(text)) == text
    tiled = compiler.build_ir(tma_copy_scaled, {"src": desc_type((64, 32), bf16), "dst": desc_type((64, 32), bf16)},
                              {"BM": 64, "BN": 32}, keep_ir=True)[1]
    for stage_text in tiled.values():
        assert print_module(parse_module(stage_text)) == stage_text
    assert "#mt.blocked<{sizePerThread = [1, 8]" in tiled["tiling"]  # 16-byte vectors read from shared memory


def test_descriptor_op_checks() -> None:
    func = copy_module().functions[0]
    load = next(o for o in func.walk() if o.name == "mt.descriptor_load")
    store = next(o for o in func.walk() if o.name == "mt.descriptor_store")
    desc, row, col = load.operands
    verify(func)

    def broken(op: Operation, message: str) -> None:
        with pytest.raises(VerifyError, match=message):
            from minitriton.ir.ops import OPS
            OPS[op.name].check(op)

    broken(Operation("mt.descriptor_load", [desc, row], [load.result.type]), "2 coordinates")
    broken(Operation("mt.descriptor_load", [row, row, col], [load.result.type]), "must be a !mt.tensordesc")
    broken(Operation("mt.descriptor_load", [desc, row, col], [tensor([64, 32], f32)]), "result must be")
    f = Operation("mt.constant", [], [f32], {"value": 1.0})
    broken(Operation("mt.descriptor_load", [desc, row, f.result], [load.result.type]), "i32 scalars")
    broken(Operation("mt.descriptor_store", [desc, row, col, row], []), "stored tile must be")
    broken(Operation("mt.descriptor_store", [store.operands[0], row, col, store.operands[3]],
                     [load.result.type]), "expects")


@mt.kernel
def bad_offsets(src, out, KIND: mt.constexpr):
    if KIND == "count":
        x = src.load([0])
    elif KIND == "float":
        x = src.load([0, 1.5])
    elif KIND == "attr":
        x = src.shape
    else:
        src.store([0, 0], mt.zeros((16, 8), mt.float32))  # neither the block's shape nor whole blocks
        x = src.load([0, 0])
    mt.store(out, mt.sum(x.to(mt.float32)))


@pytest.mark.parametrize("kind,message", [("count", "needs 2 offsets"), ("float", "integer scalars"),
                                          ("attr", "has no attribute 'shape'"), ("shape", "cannot store a tile")])
def test_frontend_reports_descriptor_mistakes(kind: str, message: str) -> None:
    with pytest.raises(CompilationError, match=message):
        compile_to_ir(bad_offsets, {"src": desc_type((16, 16), f32), "out": PointerType(f32)}, {"KIND": kind})


# ----------------------------------------------------------------------------------- interpreter


@pytest.fixture
def interpreting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")


@pytest.mark.parametrize("dtype,block", [("bf16", (64, 64)), ("f32", (16, 32)), ("i8", (8, 64))])
@pytest.mark.parametrize("coords", [(8, 16), (-5, 0), (40, 64), (-64, 0), (0, 1024), (-5, -16)])
def test_interpreted_load_is_a_zero_filled_box(interpreting: None, dtype: str, block: tuple[int, int],
                                              coords: tuple[int, int]) -> None:
    src = random_tensor((50, 96), TORCH_OF[dtype])
    out = random_tensor(block, TORCH_OF[dtype])
    tma_to_pointers[(1,)](descriptor(src, list(block)), out, *coords, block[1], BM=block[0], BN=block[1])
    assert torch.equal(out, box_reference(src, coords, block))


@pytest.mark.parametrize("coords", [(3, 8), (45, 72), (40, 80), (100, 0)])
def test_interpreted_store_clips_to_the_tensor(interpreting: None, coords: tuple[int, int]) -> None:
    tile = random_tensor((16, 32), torch.float32)
    dst = random_tensor((50, 96), torch.float32)
    before = dst.clone()
    pointers_to_tma[(1,)](tile, descriptor(dst, [16, 32]), *coords, 32, BM=16, BN=32)
    assert torch.equal(dst, store_reference(before, tile, coords))


@pytest.mark.parametrize("kernel,coords,message", [
    ("load", (0, 4), "innermost coordinate .4. times the element size .2 bytes. must be a multiple of 16"),
    ("store", (0, 12), "innermost coordinate .12. times the element size .2 bytes. must be a multiple of 16"),
    ("store", (-8, 0), "must not start before the tensor")])
def test_interpreter_rejects_what_faults_on_the_h200(interpreting: None, kernel: str, coords: tuple[int, int],
                                                     message: str) -> None:
    """Coordinates the H200's TMA unit faults on (docs/tma.md) are errors at the kernel line on the CPU."""
    t = random_tensor((32, 64), torch.bfloat16)
    with pytest.raises(InterpreterError, match=message) as info:
        if kernel == "load":
            tma_to_pointers[(1,)](descriptor(t, [16, 32]), torch.empty(16, 32, dtype=torch.bfloat16), *coords, 32,
                                  BM=16, BN=32)
        else:
            pointers_to_tma[(1,)](random_tensor((16, 32), torch.bfloat16), descriptor(t, [16, 32]), *coords, 32,
                                  BM=16, BN=32)
    assert "tma_kernels.py" in str(info.value)


def test_interpreted_descriptors_follow_strided_views(interpreting: None) -> None:
    big = random_tensor((80, 128), torch.bfloat16)
    view = big[8:72, 16:80]  # strides (128, 1), not contiguous
    dst = torch.zeros(80, 64, dtype=torch.bfloat16)
    tma_copy_scaled[(2, 1)](descriptor(view, [64, 64]), descriptor(dst, [64, 64]), BM=64, BN=64)
    assert torch.equal(dst[:64], view * 2) and not dst[64:].any()


def test_interpreted_loop_over_descriptor_blocks(interpreting: None) -> None:
    src = random_tensor((64, 200), torch.bfloat16)
    out = torch.empty(64, 64, dtype=torch.float32)
    tma_block_sums[(2,)](descriptor(src, [32, 64]), out, 200, BM=32, BK=64)
    want = torch.nn.functional.pad(src.float(), (0, 56)).reshape(64, 4, 64).sum(1)
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-5)


def test_interpreter_checks_descriptor_arguments() -> None:
    func = copy_module().functions[0]
    ok = descriptor(random_tensor((64, 32), torch.bfloat16), [64, 32])
    with pytest.raises(InterpreterError, match="pass an mt.TensorDescriptor"):
        interpret(func, (1,), [torch.zeros(4), ok])
    with pytest.raises(InterpreterError, match="specialized for"):
        interpret(func, (1,), [descriptor(random_tensor((64, 64), torch.bfloat16), [64, 64]), ok])


# -------------------------------------------------------------------------------------- host side


def test_from_tensor_checks_what_tma_needs() -> None:
    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    d = descriptor(t, [64, 64])
    assert d.code == "tensordesc<bf16[64,64]>" and d.swizzle_bytes == 128 and d.type == desc_type((64, 64), bf16)
    assert descriptor(t, [32, 32]).swizzle_bytes == 0
    problems = [
        (lambda: descriptor(t, [64]), "rank"),
        (lambda: descriptor(t, [64, 4]), "multiple of 16 bytes"),
        (lambda: descriptor(t, [64, 48]), "power of two"),
        (lambda: descriptor(t.t(), [64, 64]), "contiguous innermost"),
        (lambda: descriptor(torch.zeros(65, dtype=torch.bfloat16)[1:].view(8, 8), [8, 8]), "16-byte aligned"),
        (lambda: descriptor(torch.zeros(8, 12, dtype=torch.bfloat16)[:, :8], [8, 8]), "multiples of 16 bytes"),
        (lambda: descriptor(torch.zeros(8, 8, dtype=torch.bool), [8, 16]), "TMA cannot move"),
    ]
    for make, message in problems:
        with pytest.raises(tma.TensorDescriptorError, match=message):
            make()


class FakeTensorMap:
    def __init__(self, data: bytes):
        self.buffer = ctypes.create_string_buffer(data, len(data))

    def getPtr(self) -> int:  # noqa: N802 - cuda-bindings' spelling
        return ctypes.addressof(self.buffer)


@pytest.fixture
def encode_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """cuTensorMapEncodeTiled replaced by a recorder returning a recognizable 128-byte map."""
    from cuda.bindings import driver as cu

    calls: list = []

    def fake(*args: Any) -> tuple:
        calls.append(args)
        return cu.CUresult.CUDA_SUCCESS, FakeTensorMap(bytes((len(calls) * 7 + i) % 256 for i in range(128)))

    monkeypatch.setattr(cu, "cuTensorMapEncodeTiled", fake)
    tma.clear_cache()
    yield calls
    tma.clear_cache()


@pytest.mark.parametrize("dtype,shape,block,strides,swizzle_name", [
    (torch.bfloat16, (300, 200), [64, 64], None, "CU_TENSOR_MAP_SWIZZLE_128B"),
    (torch.float32, (100, 48), [16, 16], None, "CU_TENSOR_MAP_SWIZZLE_NONE"),
    (torch.float16, (7, 40, 24), [2, 8, 8], None, "CU_TENSOR_MAP_SWIZZLE_NONE"),
    (torch.float32, (96, 64), [32, 32], (128, 1), "CU_TENSOR_MAP_SWIZZLE_128B"),
])
def test_tensor_map_encoding_arguments(encode_calls: list, dtype: torch.dtype, shape: tuple, block: list,
                                       strides: tuple | None, swizzle_name: str) -> None:
    from cuda.bindings import driver as cu

    base = torch.zeros(shape[0] * (strides[0] if strides else 1) * 2 + 64, dtype=dtype)
    t = base[: shape[0] * strides[0]].view(shape[0], strides[0])[:, :shape[1]] if strides else \
        torch.zeros(shape, dtype=dtype)
    d = descriptor(t, block)
    data = tma.encode_tensor_map(d)
    assert len(data) == 128 and data == bytes((7 + i) % 256 for i in range(128))
    (args,) = encode_calls
    kind, rank, address, dims, gstrides, box, estrides, interleave, swz, l2, oob = args
    size = t.element_size()
    assert kind == getattr(cu.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" +
                           {torch.bfloat16: "BFLOAT16", torch.float32: "FLOAT32", torch.float16: "FLOAT16"}[dtype])
    assert rank == len(shape) and address == t.data_ptr()
    assert [int(x) for x in dims] == list(reversed(shape))  # innermost first
    assert [int(x) for x in gstrides] == [s * size for s in reversed(t.stride()[:-1])]  # bytes, innermost left out
    assert [int(x) for x in box] == list(reversed(block))
    assert [int(x) for x in estrides] == [1] * len(shape)
    assert swz == getattr(cu.CUtensorMapSwizzle, swizzle_name)
    assert interleave == cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert oob == cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
    assert l2 == cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE


class OnGpu(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0 (descriptors of it encode; nothing reads its memory)."""

    def get_device(self) -> int:  # type: ignore[override]
        return 0


def test_tensor_maps_are_cached_per_tensor_and_block(encode_calls: list) -> None:
    t = torch.zeros(64, 64, dtype=torch.bfloat16).as_subclass(OnGpu)
    first = descriptor(t, [64, 64]).tensor_map()
    assert descriptor(t, [64, 64]).tensor_map() == first and len(encode_calls) == 1
    assert descriptor(t, [32, 64]).tensor_map() != first and len(encode_calls) == 2
    with pytest.raises(tma.TensorDescriptorError, match="CPU tensor"):
        descriptor(torch.zeros(64, 64, dtype=torch.bfloat16), [64, 64]).tensor_map()


def test_descriptor_spellings_parse() -> None:
    spec = parse_arg_spec("tensordesc<bf16[64,64]>")
    assert spec.type == desc_type((64, 64), bf16) and spec.code == "tensordesc<bf16[64,64]>"
    args = parse_signature("a:tensordesc<fp32[16,32]>, n:i32", ["a", "n"])
    assert args["a"].type == desc_type((16, 32), f32) and args["n"].type == i32
    for bad in ("tensordesc<bf16[64,4]>", "tensordesc<nope[8,8]>", "tensordesc<bf16>"):
        with pytest.raises(SignatureError):
            parse_arg_spec(bad)
    key = tma_to_pointers.specialization_key(descriptor(torch.zeros(64, 64), [16, 32]), torch.zeros(16, 32), 3, 5,
                                             32, BM=16, BN=32)
    assert key[0] == "tensordesc<fp32[16,32]>"  # no tensor map is encoded for a key


class FakeDriver:
    """Just enough of the driver interface (runtime/driver.py) to launch: records each parameter's bytes, read
    through the `void *[]` array as the driver does (`sizes`: the parameter sizes per kernel name)."""

    def __init__(self, sizes: dict[str, list[int]]) -> None:
        self.sizes = sizes
        self.launches: list[tuple[str, list[bytes], list[int]]] = []

    def current_device(self) -> int:
        return 0

    def current_stream(self, device: int) -> int:
        return 0

    def load_function(self, image: Any, name: str, device: int) -> str:
        return name

    def max_shared_per_block(self, device: int) -> int:
        return 227 * 1024

    def set_max_dynamic_shared(self, fn: Any, nbytes: int) -> None:
        pass

    def launch(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int, stream: Any,
               params: int, extra: int) -> tuple[int]:
        pointers = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        sizes = self.sizes[fn]
        self.launches.append((fn, [ctypes.string_at(pointers[i], n) for i, n in enumerate(sizes)],
                              [pointers[i] for i in range(len(sizes))]))
        return (0,)

    def error_message(self, err: int) -> str:
        return f"fake error {err}"

    def is_invalid_context(self, err: int) -> bool:
        return False

    def ensure_context(self, device: int) -> None:
        pass


def test_a_launch_passes_the_tensor_maps_in_128_byte_slots(encode_calls: list, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MINITRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MINITRITON_INTERPRET", raising=False)
    fake = FakeDriver({"tma_to_pointers": [128, 8, 4, 4, 4], "pointers_to_tma": [8, 128, 4, 4, 4]})
    previous = set_driver(fake)
    try:
        src = descriptor(torch.zeros(64, 64, dtype=torch.float32).as_subclass(OnGpu), [16, 32])
        out = torch.zeros(16, 32, dtype=torch.float32).as_subclass(OnGpu)
        dst = descriptor(torch.zeros(64, 64, dtype=torch.float32).as_subclass(OnGpu), [16, 32])
        tma_to_pointers[(1,)](src, out, 3, 5, 32, BM=16, BN=32)
        pointers_to_tma[(1,)](out, dst, -2, 5, 32, BM=16, BN=32)
    finally:
        set_driver(previous)
    (_, first, _), (_, second, _) = fake.launches
    assert first[0] == src.tensor_map() and second[1] == dst.tensor_map() and first[0] != second[1]
    assert struct.unpack("<Q", first[1])[0] == out.data_ptr() == struct.unpack("<Q", second[0])[0]
    assert [struct.unpack("<i", b)[0] for b in first[2:]] == [3, 5, 32]
    assert [struct.unpack("<i", b)[0] for b in second[2:]] == [-2, 5, 32]
    assert len(encode_calls) == 2


def test_launcher_packs_tensor_maps(encode_calls: list) -> None:
    meta = {"name": "k", "num_warps": 4, "params": [
        {"name": "n", "type": "i32", "size": 4, "align": 4},
        {"name": "d", "type": "tensordesc<bf16[64,64]>", "size": 128, "align": 64}]}
    launcher = Launcher(compiler.CompiledKernel("k", "", None, meta), ["d", "n"])
    d = descriptor(torch.zeros(64, 64, dtype=torch.bfloat16).as_subclass(OnGpu), [64, 64])
    launcher.pack(launcher.params.buffer, 0, d, 11)
    assert launcher.params.slot_bytes(1) == d.tensor_map() and launcher.params.offsets[1] % 64 == 0
    assert launcher.params.slot_bytes(0) == struct.pack("<i", 11)


# ------------------------------------------------------------------------------------- PTX, ptxas


def compile_ptx(kernel: Any, types: dict, constexprs: dict) -> str:
    return compiler.compile_kernel(kernel, types, constexprs, target="ptx").ptx


@pytest.mark.parametrize("element,block", [(bf16, (64, 64)), (bf16, (64, 32)), (f32, (32, 32)), (i8, (32, 128))])
def test_ptx_assembles_for_sm90a(element: ScalarType, block: tuple[int, int]) -> None:
    d = desc_type(block, element)
    ptx = compile_ptx(tma_copy_scaled, {"src": d, "dst": d}, {"BM": block[0], "BN": block[1]})
    for needle in (".param .align 64 .b8 tma_copy_scaled_param_0[128]", "cvta.param.u64",
                   "mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                   "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "mbarrier.try_wait.parity.shared::cta.b64", "fence.proxy.async.shared::cta",
                   "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group", "cp.async.bulk.wait_group 0"):
        assert needle in ptx, needle
    align = 1024 if d.swizzle_bytes else 128
    assert f".shared .align {align} .b8 smem[" in ptx
    assert re.search(rf"expect_tx\.shared::cta\.b64 _, \[%r\d+\], {d.box_bytes};", ptx)  # the whole box
    report = run_ptxas(ptx, "sm_90a")
    assert report.cubin and report.spill_stores == 0


def test_compiled_metadata_describes_the_descriptor_parameter() -> None:
    d = desc_type((64, 64), bf16)
    ck = compiler.compile_kernel(tma_to_pointers, {"src": d, "out": PointerType(bf16), "row": i32, "col": i32,
                                                   "stride_o": i32}, {"BM": 64, "BN": 64}, target="ptx")
    first = ck.metadata["params"][0]
    assert (first["type"], first["size"], first["align"]) == ("tensordesc<bf16[64,64]>", 128, 64)


def test_swizzle_matches_the_h200_rule() -> None:
    """16-byte chunk j of the box's 128-byte row r sits at chunk j ^ (r % 8) (measured on the H200)."""
    seen = set()
    for offset in range(4096):
        r, j, within = offset // 128, offset % 128 // 16, offset % 16
        got = swizzle(offset, 128)
        assert got == r * 128 + (j ^ (r % 8)) * 16 + within
        seen.add(got)
    assert seen == set(range(4096)) and swizzle(1234, 0) == 1234


# --------------------------------------------------------------------------- PTX in the simulator


def both_ways(kernel: Any, types: dict, constexprs: dict, grid: tuple, make_args: Any, ptx: str | None = None
              ) -> tuple[list, list]:
    """Run the kernel in the interpreter and its PTX in the simulator on fresh copies of the same arguments."""
    make = dsl(kernel, types, constexprs)
    ref = make_args()
    interpret(make().functions[0], grid, ref)
    text, name, threads = lower(make)
    got = make_args()
    run_ptx(ptx or text, name, grid, got, threads)
    return ref, got


def load_case(dtype: str, block: tuple[int, int], coords: tuple[int, int], shape: tuple[int, int] = (50, 192)):
    element = ScalarType(dtype)
    src = random_tensor(shape, TORCH_OF[dtype])
    out0 = random_tensor(block, TORCH_OF[dtype])
    types = {"src": desc_type(block, element), "out": PointerType(element), "row": i32, "col": i32,
             "stride_o": i32}
    return types, {"BM": block[0], "BN": block[1]}, lambda: [descriptor(src, list(block)), out0.clone(), *coords,
                                                              block[1]]


@pytest.mark.parametrize("dtype,block", [("bf16", (64, 64)), ("f32", (32, 32)), ("bf16", (16, 32)),
                                         ("f16", (8, 128)), ("i8", (32, 128))])
@pytest.mark.parametrize("coords", [(8, 16), (-3, 96)])
def test_simulated_tma_load_matches_the_interpreter(dtype: str, block: tuple[int, int],
                                                   coords: tuple[int, int]) -> None:
    types, consts, make_args = load_case(dtype, block, coords)
    ref, got = both_ways(tma_to_pointers, types, consts, (1,), make_args)
    assert torch.equal(got[1], ref[1])
    assert torch.equal(ref[1], box_reference(ref[0].tensor, coords, block))


@pytest.mark.parametrize("dtype,block", [("bf16", (64, 64)), ("f32", (16, 32)), ("i8", (32, 128))])
@pytest.mark.parametrize("coords", [(5, 16), (45, 160), (30, 144)])
def test_simulated_tma_store_matches_the_interpreter(dtype: str, block: tuple[int, int],
                                                    coords: tuple[int, int]) -> None:
    element = ScalarType(dtype)
    tile = random_tensor(block, TORCH_OF[dtype])
    dst0 = random_tensor((50, 192), TORCH_OF[dtype])
    types = {"x": PointerType(element), "dst": desc_type(block, element), "row": i32, "col": i32, "stride_x": i32}
    ref, got = both_ways(pointers_to_tma, types, {"BM": block[0], "BN": block[1]}, (1,),
                         lambda: [tile, descriptor(dst0.clone(), list(block)), *coords, block[1]])
    assert torch.equal(got[1].tensor, ref[1].tensor)
    assert torch.equal(ref[1].tensor, store_reference(dst0, tile, coords))


def test_simulated_copy_of_a_strided_view_with_clipped_edges() -> None:
    big = random_tensor((90, 160), torch.bfloat16)
    types = {"src": desc_type((64, 64), bf16), "dst": desc_type((64, 64), bf16)}
    outputs: list[torch.Tensor] = []  # the whole destination tensor of each run (the descriptor sees a view)

    def make_args() -> list:
        outputs.append(torch.zeros(90, 160, dtype=torch.bfloat16))
        return [descriptor(big[5:75, 16:136], [64, 64]), descriptor(outputs[-1][:70, 8:128], [64, 64])]

    both_ways(tma_copy_scaled, types, {"BM": 64, "BN": 64}, (2, 2), make_args)
    ref, got = outputs
    assert torch.equal(got, ref)
    assert torch.equal(ref[:70, 8:128], big[5:75, 16:136] * 2)
    ref[:70, 8:128] = 0
    assert not ref.any()  # the 128-wide blocks past the view's edges were clipped


def test_simulated_rank3_box() -> None:
    src = random_tensor((3, 10, 24), torch.float32)
    types = {"src": desc_type((2, 4, 16), f32), "out": PointerType(f32), "a": i32, "b": i32, "c": i32}
    ref, got = both_ways(tma_3d_to_pointers, types, {"B0": 2, "B1": 4, "B2": 16}, (1,),
                         lambda: [descriptor(src, [2, 4, 16]), torch.full((2, 4, 16), 7.0), 2, -1, 12])
    assert torch.equal(got[1], ref[1]) and torch.equal(ref[1], box_reference(src, (2, -1, 12), (2, 4, 16)))


def block_sums_case() -> tuple:
    src = random_tensor((64, 200), torch.bfloat16)
    types = {"src": desc_type((32, 64), bf16), "out": PointerType(f32), "K": i32}
    return types, {"BM": 32, "BK": 64}, (2,), lambda: [descriptor(src, [32, 64]), torch.full((64, 64), 5.0), 200]


def test_simulated_loop_reuses_the_barrier_phase_by_phase() -> None:
    types, consts, grid, make_args = block_sums_case()
    ref, got = both_ways(tma_block_sums, types, consts, grid, make_args)
    assert torch.equal(got[1], ref[1])


def test_simulated_tma_matmul_example_matches_the_interpreter() -> None:
    from minitriton.kernels.examples.matmul_tma import matmul_tma_kernel, reference

    M, N, K = 70, 64, 136
    a, b = random_tensor((M, K), torch.bfloat16), random_tensor((K, N), torch.bfloat16)
    d = desc_type((64, 64), bf16)
    types = {"a_desc": d, "b_desc": d, "c_ptr": PointerType(bf16), "bias_ptr": PointerType(bf16), "M": i32,
             "N": i32, "K": i32, "stride_cm": i32, "stride_cn": i32}
    ref, got = both_ways(matmul_tma_kernel, types, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}, (2, 1),
                         lambda: [descriptor(a, [64, 64]), descriptor(b, [64, 64]), torch.full((M, N), 3.0,
                                  dtype=torch.bfloat16), torch.zeros(N, dtype=torch.bfloat16), M, N, K, N, 1])
    # The inputs arrive bit-exactly; the interpreter sums in f64, the PTX in f32 (k in order): after rounding to
    # bf16 the two differ by at most one bf16 ulp (2**-8 relative) where the f32 sum lands next to a tie.
    assert torch.allclose(got[2].float(), ref[2].float(), rtol=2**-7, atol=1e-3)
    assert (got[2] != ref[2]).float().mean() < 0.01
    want = reference(a, b).double()
    assert ((ref[2].double() - want).norm() / want.norm()).item() < 4e-3  # bf16 output rounding


# The simulator's TMA checks must catch PTX that breaks the rules (each mutation of correct PTX must fail).

def mutated(ptx: str, pattern: str, replacement: str) -> str:
    new, n = re.subn(pattern, replacement, ptx)
    assert n, f"pattern {pattern!r} not in the PTX"
    return new


@pytest.mark.parametrize("pattern,replacement,error", [
    (r"cvta\.param\.u64 (%rd\d+), (%rd\d+);", r"mov.b64 \1, \2;", "param-space address"),
    (r"(\$L_tma_wait_\d+:\n)(.*\n)(.*\n)", r"", "before waiting on its mbarrier"),
    (r"(expect_tx\.shared::cta\.b64 _, \[%r\d+\]), \d+;", r"\1, 1024;", "expected fewer"),
    (r"(expect_tx\.shared::cta\.b64 _, \[%r\d+\]), \d+;", r"\1, 16384;", "deadlock"),
    (r"  fence\.proxy\.async\.shared::cta;\n  bar\.sync 0;\n  @%p\d+ cp\.async\.bulk\.tensor\.2d\.global",
     "  bar.sync 0;\n  @%p1 cp.async.bulk.tensor.2d.global", "not fenced"),
    (r"  (@%p\d+ )?cp\.async\.bulk\.wait_group(\.read)? 0;\n", "", "store in flight"),  # both waits gone
    (r"  @(%p\d+) mbarrier\.arrive", r"  mbarrier.arrive", "more arrivals"),
])
def test_simulator_rejects_broken_tma_ptx(pattern: str, replacement: str, error: str) -> None:
    types = {"src": desc_type((64, 64), bf16), "dst": desc_type((64, 64), bf16)}
    make = dsl(tma_copy_scaled, types, {"BM": 64, "BN": 64})
    ptx, name, threads = lower(make)
    src = random_tensor((64, 64), torch.bfloat16)
    args = [descriptor(src, [64, 64]), descriptor(torch.zeros(64, 64, dtype=torch.bfloat16), [64, 64])]
    run_ptx(ptx, name, (1,), args, threads)  # the unmutated PTX passes
    with pytest.raises(SimError, match=error):
        run_ptx(mutated(ptx, pattern, replacement), name, (1,), args, threads)


def test_simulator_catches_a_missing_phase_flip() -> None:
    types, consts, grid, make_args = block_sums_case()
    make = dsl(tma_block_sums, types, consts)
    ptx, name, threads = lower(make)
    with pytest.raises(SimError, match="deadlock"):
        run_ptx(mutated(ptx, r"  xor\.b32 (%r\d+), \1, 1;\n", ""), name, grid, make_args(), threads)


def test_a_wrong_unswizzle_reads_a_wrong_tile() -> None:
    types, consts, make_args = load_case("bf16", (64, 64), (0, 0))
    make = dsl(tma_to_pointers, types, consts)
    ptx, name, threads = lower(make)
    args = make_args()
    run_ptx(mutated(ptx, r"and\.b32 (%r\d+), (%r\d+), 112;", r"and.b32 \1, \2, 0;"), name, (1,), args, threads)
    assert not torch.equal(args[1], box_reference(args[0].tensor, (0, 0), (64, 64)))


# ------------------------------------------------------------------------------------------ the example


def test_tma_matmul_example_specializations_compile() -> None:
    from minitriton.kernels.examples.matmul_tma import matmul_tma_kernel

    assert len(matmul_tma_kernel.specializations) == 2
    for spec in matmul_tma_kernel.specializations:
        ck = spec.compile(target="cubin", keep_ir=True)
        assert "cp.async.bulk.tensor.2d" in ck.ptx and ".shared .align 1024" in ck.ptx  # 64 x bf16 = 128B rows
        assert ck.cubin is not None and ck.metadata["spill_stores"] == 0
        for text in ck.ir.values():
            assert print_module(parse_module(text)) == text


@pytest.mark.parametrize("M,N,K", [(64, 64, 64), (130, 72, 200)])
def test_interpreted_tma_matmul_example(interpreting: None, M: int, N: int, K: int) -> None:
    from minitriton.kernels.examples import matmul_tma

    a, b = random_tensor((M, K), torch.bfloat16), random_tensor((K, N), torch.bfloat16)
    bias = random_tensor((N,), torch.bfloat16)
    got = matmul_tma.matmul(a, b, bias, "gelu").double()
    want = matmul_tma.reference(a, b, bias, "gelu").double()
    assert ((got - want).norm() / want.norm()).item() < 4e-3  # bf16 output rounding
    with pytest.raises(tma.TensorDescriptorError, match="multiples of 16 bytes"):
        matmul_tma.matmul(random_tensor((64, 60), torch.bfloat16), random_tensor((60, 64), torch.bfloat16))


# ------------------------------------------------------------------------------- tiles of whole boxes


@pytest.mark.parametrize("box,tile,shape", [((32, 32), (32, 128), (40, 200)), ((16, 64), (64, 64), (70, 96)),
                                            ((32, 32), (64, 64), (64, 64))])
def test_store_of_whole_boxes(box: tuple[int, int], tile: tuple[int, int], shape: tuple[int, int]) -> None:
    """A tile of several [BM, BN] boxes stored through one descriptor: the interpreter and the PTX (rounds of
    boxes, one TMA store each, on the simulator) both write 2 * x inside the tensor and clip the rest."""
    m, n = shape
    x = random_tensor((m, n), torch.float32)
    grid = (-(-m // tile[0]), -(-n // tile[1]))
    types = {"x_ptr": PointerType(f32), "dst": desc_type(box, f32), "M": i32, "N": i32}
    consts = {"TILE_M": tile[0], "TILE_N": tile[1]}
    got = torch.full((m, n), float("nan"))
    interpret(dsl(tma_store_whole_boxes, types, consts)().functions[0], grid, [x, descriptor(got, list(box)), m, n])
    assert torch.equal(got, 2 * x)
    ptx, name, threads = lower(dsl(tma_store_whole_boxes, types, consts))
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == (tile[0] // box[0]) * (tile[1] // box[1])
    assert "cp.async.bulk.wait_group.read 0;" in ptx and "cp.async.bulk.wait_group 0;\n  ret;" in ptx
    sim = torch.full((m, n), float("nan"))
    run_ptx(ptx, name, grid, [x, descriptor(sim, list(box)), m, n], threads)
    assert torch.equal(sim, 2 * x)


def test_store_of_a_tile_that_is_not_whole_boxes_is_an_error() -> None:
    types = {"x_ptr": PointerType(f32), "dst": desc_type((32, 64), f32), "M": i32, "N": i32}
    with pytest.raises(CompilationError, match="whole blocks"):
        compile_to_ir(tma_store_whole_boxes, types, {"TILE_M": 64, "TILE_N": 32})
