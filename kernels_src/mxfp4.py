"""Reference MXFP4 (OCP MX v1.0) helpers in torch: exact dequantization, quantization, random test data.

Format (see /work/shared/reference/moe_mxfp4.md §2):
- E2M1 elements, 4 bits: sign, 2 exponent bits (bias 1), 1 mantissa bit; the 16 codes decode to
  ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (code 8 is -0.0).
- Two elements per byte, **low nibble = the even element** (gpt-oss, HF, triton_kernels, torchao convention):
  `blocks[..., j] = code[2j] | code[2j + 1] << 4`, so packed weights are `uint8 [..., K/2]`.
- One E8M0 scale byte per 32 consecutive elements along K: `scales uint8 [..., ceil(K/32)]`, X = 2**(s - 127).
  s = 0x00 is 2**-127 (exact, a float32 subnormal), s = 0xFF is NaN (the spec: every element of its block is NaN).
  A row whose K is not a multiple of 32 has a partial last block.

Everything here decodes exactly: float64 holds every E2M1 value times every scale 2**-127 .. 2**127 exactly.
"""
from __future__ import annotations

import torch

# The 16 E2M1 codes in code order: 0..7 positive, 8..15 negative (8 is -0.0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # elements per E8M0 scale
E8M0_NAN = 0xFF


def e2m1_table(dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
    """The decode table: `e2m1_table()[code]` is the value of a 4-bit code."""
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def e8m0_to_float(scales: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Scale bytes as floats with the spec's semantics: 2**(s - 127) for 0..254 (exact), NaN for 0xFF."""
    e = scales.to(torch.int32)
    x = torch.ldexp(torch.ones_like(e, dtype=torch.float64), (e - 127).to(torch.float64))
    x = torch.where(e == E8M0_NAN, torch.full_like(x, float("nan")), x)
    return x.to(dtype)


def unpack_codes(blocks: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """4-bit codes `uint8 [..., K]` of packed bytes `uint8 [..., ceil(K/2)]` (low nibble = even element)."""
    if blocks.dtype != torch.uint8:
        raise TypeError(f"packed MXFP4 blocks must be uint8, got {blocks.dtype}")
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(*blocks.shape[:-1], -1)
    k = codes.shape[-1] if k is None else k
    if not codes.shape[-1] - 1 <= k <= codes.shape[-1]:
        raise ValueError(f"k={k} does not match {blocks.shape[-1]} packed bytes per row")
    return codes[..., :k]


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of unpack_codes: `uint8 [..., K]` codes (0..15) -> `uint8 [..., ceil(K/2)]` (odd K padded with 0)."""
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, k: int | None = None,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Exact values `[..., K]` of MXFP4 weights: blocks `uint8 [..., ceil(K/2)]`, scales `uint8 [..., ceil(K/32)]`.

    In float64 (the default) the result is exact for every code and every scale byte; 0xFF scales give NaN for
    their whole block (the OCP spec).
    """
    codes = unpack_codes(blocks, k)
    k = codes.shape[-1]
    nb = -(-k // BLOCK)
    if scales.shape[:-1] != blocks.shape[:-1] or scales.shape[-1] != nb:
        raise ValueError(f"scales {tuple(scales.shape)} do not fit blocks {tuple(blocks.shape)} with K={k} "
                         f"(expected [..., {nb}])")
    values = e2m1_table(torch.float64, blocks.device)[codes.long()]
    scale = e8m0_to_float(scales).repeat_interleave(BLOCK, dim=-1)[..., :k]
    return (values * scale).to(dtype)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 of `w [..., K]` along the last dim with the OCP reference rule: scale = 2**(floor(log2 amax) - 2),
    elements rounded to nearest even E2M1 and saturated at ±6. Returns (blocks uint8 [..., ceil(K/2)],
    scales uint8 [..., ceil(K/32)]). All-zero blocks get scale byte 0."""
    w = w.to(torch.float64)
    k = w.shape[-1]
    nb = -(-k // BLOCK)
    padded = torch.nn.functional.pad(w, (0, nb * BLOCK - k)).reshape(*w.shape[:-1], nb, BLOCK)
    amax = padded.abs().amax(dim=-1)
    exp = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - 2
    s = torch.where(amax > 0, (exp + 127).clamp(0, 254), torch.zeros_like(exp)).to(torch.uint8)
    scaled = padded / e8m0_to_float(s)[..., None]
    codes = nearest_e2m1_codes(scaled)
    codes = codes.reshape(*w.shape[:-1], nb * BLOCK)[..., :k]
    return pack_codes(codes), s


def nearest_e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of float values: round to nearest, ties to the even mantissa, saturate at ±6; -0.0 keeps its
    sign."""
    mags = e2m1_table(torch.float64, v.device)[:8]
    a = v.abs().clamp(max=6.0)
    dist = (a[..., None] - mags).abs()
    best = dist.min(dim=-1, keepdim=True).values
    # Ties: the two nearest magnitudes are neighbours; the one with an even code (mantissa 0) wins.
    even = (torch.arange(8, device=v.device) % 2 == 0)
    tie_break = torch.where(even, 0, 1)
    score = torch.where(dist == best, tie_break, 2)
    mag_code = score.argmin(dim=-1)
    sign = torch.signbit(v).to(torch.int64) * 8
    return (mag_code + sign).to(torch.uint8)


def random_mxfp4(shape: tuple[int, ...], k: int, generator: torch.Generator | None = None,
                 scale_range: tuple[int, int] = (118, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 weights `[*shape, K]`: uniform codes (all 16, including -0.0) and scale bytes drawn uniformly
    from scale_range = [lo, hi). Returns (blocks uint8 [*shape, ceil(K/2)], scales uint8 [*shape, ceil(K/32)]);
    the padding nibble of an odd K is 0."""
    codes = torch.randint(0, 16, (*shape, k), generator=generator, dtype=torch.uint8)
    scales = torch.randint(scale_range[0], scale_range[1], (*shape, -(-k // BLOCK)), generator=generator,
                           dtype=torch.uint8)
    return pack_codes(codes), scales
