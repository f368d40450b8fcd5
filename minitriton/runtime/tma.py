"""Host-side tensor descriptors: `mt.TensorDescriptor.from_tensor(t, block_shape)`, passed to a kernel argument.

    a_desc = mt.TensorDescriptor.from_tensor(a, [64, 64])      # a: (M, K) bf16, moved in 64x64 boxes
    kernel[grid](a_desc, ...)                                   # in the kernel: a_desc.load([m0, k0])

A descriptor names a global tensor (its address, shape and strides, in elements) and the box shape that loads and
stores move. On the GPU it becomes a CUtensorMap, built once by `cuTensorMapEncodeTiled` (cuda-bindings) and passed
by value: its 128 bytes fill the kernel's `.param .align 64 .b8 name[128]` parameter. Under MINITRITON_INTERPRET=1
the interpreter reads the tensor directly (shape, strides and zero fill from this object); no CUDA call is made.

The kernel is specialized on `code` (`tensordesc<bf16[64,64]>`: element type and block shape; the global shape and
strides are runtime values inside the tensor map). The encoding is:
  - global dims and strides innermost first; strides in bytes, the innermost (1 element) left out;
  - box = block_shape innermost first, element strides all 1, no interleave, L2 promotion none, zero OOB fill;
  - swizzle 128B when a block row is exactly 128 bytes, else none (TensorDescType.swizzle_bytes, which the codegen
    reads too, so host and kernel agree).
TMA's requirements are checked here, on every device (so interpreted kernels fail where GPU ones would): a 16-byte
aligned base address, a contiguous innermost dim, outer strides that are multiples of 16 bytes, blocks of rank 1-5
with power-of-two dims of at most 256 and rows of a multiple of 16 bytes.

Tensor maps are cached per (data_ptr, shape, strides, dtype, block): equal keys give identical tensor maps.

`pointer_tensor_map(address, element, rows, cols, row_stride, box, swizzle)` encodes (cached) the map of a plain
row-major matrix argument from raw launch values: what a launcher needs to feed a TMA ring from a kernel written
with pointers only (docs/kernels/gemm.md v2; the launcher does not call it yet: today the kernel passes the
descriptors, matmul.py matmul_tma_ring).
"""
from __future__ import annotations

import ctypes
import functools
from collections import OrderedDict
from typing import Any, Sequence

from minitriton.ir.types import TRITON_SPELLINGS, ScalarType, TensorDescType, TensorType

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64  # the `.param .align 64 .b8 [128]` declaration (Triton's)
CACHE_ENTRIES = 4096
MAX_STRIDE_BYTES = 1 << 40
MAX_DIM = 1 << 32

# Element type name -> cuTensorMapEncodeTiled data type (8- and 16-bit ints move as unsigned: same bits, zero fill).
_TMA_DATA_TYPES = {
    "i8": "UINT8", "ui8": "UINT8", "i16": "UINT16", "ui16": "UINT16", "i32": "INT32", "ui32": "UINT32",
    "i64": "INT64", "ui64": "UINT64", "f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT32", "f64": "FLOAT64",
}
# The tensor-map swizzle enum (NONE=0, 32B=1, 64B=2, 128B=3: the reverse of the wgmma descriptor's 1=128B ... 3=32B).
_SWIZZLE_ENUM = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}

_cache: OrderedDict[tuple, bytes] = OrderedDict()


class TensorDescriptorError(ValueError):
    """A tensor and block shape that TMA cannot describe."""


class TensorDescriptor:
    """A global tensor and the box shape TMA moves (see the module docstring). Build with `from_tensor`."""

    __slots__ = ("tensor", "shape", "strides", "block_shape", "element", "type", "code", "_key", "_map")

    def __init__(self, tensor: Any, shape: Sequence[int], strides: Sequence[int], block_shape: Sequence[int]):
        self.tensor = tensor
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.block_shape = tuple(int(b) for b in block_shape)
        self.element = element_type(tensor.dtype)
        self.type = TensorDescType(TensorType(self.block_shape, self.element))
        self.code = descriptor_code(self.type)
        self._check()
        self._key = (tensor.data_ptr(), self.shape, self.strides, self.element.name, self.block_shape)
        self._map: bytes | None = None

    @classmethod
    def from_tensor(cls, tensor: Any, block_shape: Sequence[int]) -> "TensorDescriptor":
        """The descriptor of `tensor` (any torch tensor TMA can address, on the GPU or, interpreted, the CPU) moved in
        boxes of `block_shape` (one entry per dim of the tensor)."""
        return cls(tensor, tuple(tensor.shape), tuple(tensor.stride()), block_shape)

    def _check(self) -> None:
        if len(self.shape) != len(self.block_shape):
            raise TensorDescriptorError(f"block shape {list(self.block_shape)} has rank {len(self.block_shape)} but "
                                        f"the tensor has shape {list(self.shape)}")
        problem = self.type.problem()
        if problem is not None:
            raise TensorDescriptorError(problem)
        size = self.element.bytes
        if self.strides[-1] != 1:
            raise TensorDescriptorError(f"TMA needs a contiguous innermost dim (stride 1), got strides "
                                        f"{list(self.strides)}; call .contiguous() first")
        if self.tensor.data_ptr() % 16:
            raise TensorDescriptorError(f"TMA needs a 16-byte aligned base address, got {self.tensor.data_ptr():#x}")
        for s in self.strides[:-1]:
            if s * size % 16 or not 0 < s * size < MAX_STRIDE_BYTES:
                raise TensorDescriptorError(f"TMA needs outer strides that are positive multiples of 16 bytes below "
                                            f"2**40, got strides {list(self.strides)} ({size}-byte elements)")
        if any(not 0 < d <= MAX_DIM for d in self.shape):
            raise TensorDescriptorError(f"TMA needs dims between 1 and 2**32, got shape {list(self.shape)}")

    @property
    def swizzle_bytes(self) -> int:
        return self.type.swizzle_bytes

    def tensor_map(self) -> bytes:
        """The 128-byte CUtensorMap (encoded on first use, then cached): the kernel parameter's bytes."""
        if self._map is None:
            if self.tensor.get_device() < 0:
                raise TensorDescriptorError(f"{self!r} describes a CPU tensor: a GPU launch needs a CUDA tensor "
                                            "(or set MINITRITON_INTERPRET=1 to run the kernel on the CPU)")
            self._map = _cached_tensor_map(self)
        return self._map

    def __repr__(self) -> str:
        return (f"TensorDescriptor({self.code}, shape={list(self.shape)}, strides={list(self.strides)}, "
                f"device={self.tensor.device})")


def descriptor_code(ty: TensorDescType) -> str:
    """The specialization spelling `tensordesc<bf16[64,64]>` (parse_descriptor_code reads it back)."""
    return f"tensordesc<{ty.element.triton_name}[{','.join(map(str, ty.block_shape))}]>"


def parse_descriptor_code(text: str) -> TensorDescType | None:
    """The TensorDescType of `tensordesc<bf16[64,64]>` (None when `text` is not such a spelling; ValueError when it
    is one that names an unknown type or an invalid block)."""
    body = text.strip()
    if not (body.startswith("tensordesc<") and body.endswith("]>") and "[" in body):
        return None
    name, _, dims = body[len("tensordesc<"):-2].partition("[")
    element = TRITON_SPELLINGS.get(name.strip())
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise ValueError(f"bad block shape in {text!r}") from None
    if element is None:
        raise ValueError(f"unknown element type {name.strip()!r} in {text!r}")
    ty = TensorDescType(TensorType(shape, element))
    problem = ty.problem()
    if problem is not None:
        raise ValueError(f"{text!r}: {problem}")
    return ty


@functools.lru_cache(maxsize=None)
def _torch_elements() -> dict[Any, ScalarType]:
    from .specialize import torch_pointer_codes

    return {dtype: TRITON_SPELLINGS[codes[0][1:]] for dtype, codes in torch_pointer_codes().items()}


def element_type(dtype: Any) -> ScalarType:
    """The IR element type of a torch dtype TMA can move."""
    t = _torch_elements().get(dtype)
    if t is None or t.name not in _TMA_DATA_TYPES:
        raise TensorDescriptorError(f"TMA cannot move {dtype} tensors (it moves "
                                    f"{', '.join(sorted(_TMA_DATA_TYPES))})")
    return t


# ------------------------------------------------------------------------------------------- encoding


def encode_arguments(desc: TensorDescriptor) -> dict[str, Any]:
    """The cuTensorMapEncodeTiled arguments, as plain Python values (innermost dim first)."""
    size = desc.element.bytes
    return {
        "data_type": _TMA_DATA_TYPES[desc.element.name],
        "rank": len(desc.shape),
        "address": desc.tensor.data_ptr(),
        "dims": list(reversed(desc.shape)),
        "strides_bytes": [s * size for s in reversed(desc.strides[:-1])],
        "box": list(reversed(desc.block_shape)),
        "element_strides": [1] * len(desc.shape),
        "swizzle": desc.swizzle_bytes,
    }


def encode_tensor_map(desc: TensorDescriptor) -> bytes:
    """Call cuTensorMapEncodeTiled (cuda-bindings) and return the 128 bytes of the CUtensorMap."""
    return _encode(encode_arguments(desc), repr(desc))


def _encode(a: dict[str, Any], what: str) -> bytes:
    """cuTensorMapEncodeTiled of the plain-value arguments `a` (encode_arguments' keys): the map's 128 bytes."""
    from cuda.bindings import driver as cu

    result = cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + a["data_type"]), a["rank"], a["address"],
        [cu.cuuint64_t(d) for d in a["dims"]], [cu.cuuint64_t(s) for s in a["strides_bytes"]],
        [cu.cuuint32_t(b) for b in a["box"]], [cu.cuuint32_t(e) for e in a["element_strides"]],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, _SWIZZLE_ENUM[a["swizzle"]]),
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    err, tmap = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise TensorDescriptorError(f"cuTensorMapEncodeTiled failed ({err}) for {what} with {a}")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


# ------------------------------------------------------------------- tensor maps of plain pointer arguments


def pointer_map_arguments(address: int, element: ScalarType, rows: int, cols: int, row_stride: int,
                          box: Sequence[int], swizzle: int) -> dict[str, Any]:
    """The cuTensorMapEncodeTiled arguments (encode_arguments' keys) of a row-major rows x cols matrix at global
    `address` with `row_stride` elements between rows (a pointer argument and the kernel's size and stride
    arguments), moved in boxes of `box` = (rows, cols) with `swizzle` (0 or 128): what a launch path builds for a
    TMA-fed ring from a kernel written with plain pointers (codegen/tma.py wgmma_ring_boxes gives the boxes).
    TensorDescriptorError when TMA cannot address it (the same rules as TensorDescriptor)."""
    size = element.bytes
    if element.name not in _TMA_DATA_TYPES or swizzle not in _SWIZZLE_ENUM:
        raise TensorDescriptorError(f"no tensor map of {element} with swizzle {swizzle}")
    if address % 16 or row_stride * size % 16 or not 0 < row_stride * size < MAX_STRIDE_BYTES:
        raise TensorDescriptorError(f"TMA needs a 16-byte aligned address and a row pitch that is a positive "
                                    f"multiple of 16 bytes, got {address:#x} and {row_stride} elements of {size} B")
    if not (0 < rows <= MAX_DIM and 0 < cols <= MAX_DIM):
        raise TensorDescriptorError(f"TMA needs dims between 1 and 2**32, got {rows} x {cols}")
    box_rows, box_cols = (int(b) for b in box)
    if not (0 < box_rows <= 256 and 0 < box_cols <= 256) or (swizzle and box_cols * size != swizzle):
        raise TensorDescriptorError(f"box {list(box)} of {size}-byte elements: dims of at most 256, rows of exactly "
                                    f"the {swizzle}-byte swizzle span")
    return {"data_type": _TMA_DATA_TYPES[element.name], "rank": 2, "address": int(address),
            "dims": [int(cols), int(rows)], "strides_bytes": [int(row_stride) * size],
            "box": [box_cols, box_rows], "element_strides": [1, 1], "swizzle": swizzle}


def pointer_tensor_map(address: int, element: ScalarType, rows: int, cols: int, row_stride: int,
                       box: Sequence[int], swizzle: int) -> bytes:
    """The 128-byte tensor map of pointer_map_arguments(...), encoded once per distinct arguments (cached)."""
    a = pointer_map_arguments(address, element, rows, cols, row_stride, box, swizzle)
    key = ("pointer", a["address"], element.name, rows, cols, row_stride, tuple(a["box"]), swizzle)
    data = _cache.get(key)
    if data is None:
        data = _encode(a, f"a {rows} x {cols} {element} matrix at {address:#x}")
        _remember(key, data)
    else:
        _cache.move_to_end(key)
    return data


def _cached_tensor_map(desc: TensorDescriptor) -> bytes:
    key = desc._key
    data = _cache.get(key)
    if data is None:
        data = encode_tensor_map(desc)
        _remember(key, data)
    else:
        _cache.move_to_end(key)
    return data


def _remember(key: tuple, data: bytes) -> None:
    if len(data) != TENSOR_MAP_BYTES:
        raise TensorDescriptorError(f"a tensor map has {TENSOR_MAP_BYTES} bytes, the encoder gave {len(data)}")
    _cache[key] = data
    if len(_cache) > CACHE_ENTRIES:
        _cache.popitem(last=False)


def clear_cache() -> None:
    """Forget every encoded tensor map (tests)."""
    _cache.clear()
