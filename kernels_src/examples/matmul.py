"""Tiled GEMM: C = act(A @ B + bias), fp32 accumulation over a K loop of mt.dot, any M, N, K (masked edges)."""
from __future__ import annotations

import torch

import minitriton as mt
from minitriton.runtime.jit import interpreting


@mt.func
def gelu(x):
    return 0.5 * x * (1.0 + mt.erf(x * 0.7071067811865476))


@mt.func
def activate(acc, rn, bias_ptr, N, HAS_BIAS, ACTIVATION):
    """act(acc + bias[rn]) for the columns rn of a C tile."""
    if HAS_BIAS:
        acc += mt.load(bias_ptr + rn, mask=rn < N, other=0.0).to(mt.float32)[None, :]
    if ACTIVATION == "relu":
        acc = mt.maximum(acc, 0.0)
    elif ACTIVATION == "gelu":
        acc = gelu(acc)
    elif ACTIVATION == "silu":
        acc = acc * mt.sigmoid(acc)
    else:
        mt.static_assert(ACTIVATION == "none", f"unknown activation {ACTIVATION}")
    return acc


@mt.func
def store_epilogue(acc, rm, rn, c_ptr, bias_ptr, M, N, stride_cm, stride_cn, HAS_BIAS, ACTIVATION):
    """C[rm, rn] = act(acc + bias[rn]), masked to the M x N matrix (shared by the GEMM examples)."""
    acc = activate(acc, rn, bias_ptr, N, HAS_BIAS, ACTIVATION)
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    mt.store(c_ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@mt.func
def grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M):
    """(row, column) of C tile number `tile` in grouped order: GROUP_M rows of C tiles are swept column by column,
    so consecutive tiles share the A rows and B columns they read (L2 reuse) instead of streaming all of B per row
    of tiles."""
    num_pid_m = mt.cdiv(M, BLOCK_M)
    num_pid_n = mt.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % in_group) % group_rows, (tile % in_group) // group_rows


@mt.func
def matmul_tile(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, HAS_BIAS, ACTIVATION, GROUP_M):
    """C tile of this program = act(A @ B + bias): the whole GEMM program, shared by the GEMM kernels (which differ
    only in how the compiler feeds the main loop)."""
    if GROUP_M > 0:  # a 1-D grid in grouped order
        pid_m, pid_n = grouped_tile(mt.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    else:  # a 2-D grid (M tiles, N tiles)
        pid_m = mt.program_id(0)
        pid_n = mt.program_id(1)
    rm = pid_m * BLOCK_M + mt.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + mt.arange(0, BLOCK_N)
    rk = mt.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = mt.zeros((BLOCK_M, BLOCK_N), mt.float32)
    for k in range(0, K, BLOCK_K):
        a = mt.load(a_ptrs, mask=(rm[:, None] < M) & (k + rk[None, :] < K), other=0.0)
        b = mt.load(b_ptrs, mask=(k + rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = mt.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    store_epilogue(acc, rm, rn, c_ptr, bias_ptr, M, N, stride_cm, stride_cn, HAS_BIAS, ACTIVATION)


@mt.kernel
def matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: mt.constexpr, BLOCK_N: mt.constexpr, BLOCK_K: mt.constexpr,
                  HAS_BIAS: mt.constexpr = False, ACTIVATION: mt.constexpr = "none", GROUP_M: mt.constexpr = 0):
    matmul_tile(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, HAS_BIAS, ACTIVATION, GROUP_M)


@mt.kernel
def matmul_tma_ring_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                           stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, a_tma, b_tma,
                           BLOCK_M: mt.constexpr, BLOCK_N: mt.constexpr, BLOCK_K: mt.constexpr,
                           HAS_BIAS: mt.constexpr = False, ACTIVATION: mt.constexpr = "none",
                           GROUP_M: mt.constexpr = 0):
    """matmul_kernel with the Hopper main loop fed by TMA (docs/kernels/gemm.md v2; `matmul_tma_ring`).

    a_tma / b_tma describe the same A and B as a_ptr / b_ptr (and M, N, K, the row strides) in the boxes the
    wgmma ring slots are filled with (codegen/tma.py wgmma_ring_boxes: [8, BLOCK_K] for A, [BLOCK_K, 64] for B).
    The code below never reads them: the loads define what the kernel computes (the interpreter and the mma.sync
    path run them); on Hopper the pipeline pass replaces their ring copies with TMA copies from the descriptor
    named like the pointer (a_ptr -> a_tma), one mbarrier per slot."""
    matmul_tile(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, HAS_BIAS, ACTIVATION, GROUP_M)


TMA_RING_B_COLUMNS = 64  # columns of a B box: one 128-byte column atom of the MN-major slot


def tma_ring_descriptors(a: torch.Tensor, b: torch.Tensor, block_k: int, paired_a: bool = False
                         ) -> tuple[mt.TensorDescriptor, mt.TensorDescriptor]:
    """The descriptors matmul_tma_ring_kernel takes: A (M x K) in [8, BLOCK_K] boxes, B (K x N) in
    [BLOCK_K, 64] boxes (tensor maps are cached per tensor and box by the runtime). paired_a (M a multiple of 64):
    A viewed as [M / 64, 8, 8, K] in [2, 1, 8, BLOCK_K] boxes instead, two of the permuted row groups per box
    (codegen/tma.py wgmma_ring_boxes rank 4: half the TMA instructions for A)."""
    b_desc = mt.TensorDescriptor.from_tensor(b, [block_k, TMA_RING_B_COLUMNS])
    if not paired_a:
        return mt.TensorDescriptor.from_tensor(a, [8, block_k]), b_desc
    (m, k), pitch = a.shape, a.stride(0)
    if m % 64:
        raise ValueError(f"paired A boxes view A as [M / 64, 8, 8, K]: M must be a multiple of 64, got {m}")
    view = mt.TensorDescriptor(a, (m // 64, 8, 8, k), (64 * pitch, 8 * pitch, pitch, a.stride(1)),
                               (2, 1, 8, block_k))
    return view, b_desc


# The same kernel warp-specialized (passes/warp_specialize.py, docs/kernels/gemm.md v3): a producer warpgroup issues
# the TMA copies (setmaxnreg 40), the num_warps consumer warps run the wgmmas and the epilogue (setmaxnreg 232);
# full / empty mbarriers per slot instead of the loop's block barrier. Launched with num_warps + 4 warps. With A in
# paired boxes (the default where M is a multiple of 64) it measured 98.1% / 94.3% of cuBLAS at 8192^3 / 4096^3
# (H200, 2026-12-01, BENCHMARKS.md).
matmul_tma_ws_kernel = mt.kernel(warp_specialize=True)(matmul_tma_ring_kernel.fn)


def matmul_tma_ws(a: torch.Tensor, b: torch.Tensor, config: mt.Config | None = None,
                  paired_a: bool = True) -> torch.Tensor:
    """matmul_tma_ring with the warp-specialized kernel (matmul_tma_ws_kernel); A in paired rank-4 boxes where M
    is a multiple of 64 unless paired_a=False."""
    return matmul_tma_ring(a, b, config, kernel=matmul_tma_ws_kernel, paired_a=paired_a)


def matmul_tma_ring(a: torch.Tensor, b: torch.Tensor, config: mt.Config | None = None,
                    kernel: mt.Kernel | None = None, paired_a: bool = False) -> torch.Tensor:
    """a @ b (bf16, fp32 accumulation) with matmul_tma_ring_kernel (or `kernel`, the same function compiled with
    other options) at `config` (default the first of MATMUL_CONFIGS). a and b need unit inner strides and 16-byte
    aligned rows (TMA). paired_a: A in rank-4 boxes of two row groups where M is a multiple of 64
    (`tma_ring_descriptors`: half the A boxes a stage), else the [8, BLOCK_K] boxes."""
    M, N, K = problem_size(a, b)
    config = config or MATMUL_CONFIGS[0]
    meta = dict(config.kwargs)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    options = {k: v for k, v in (("num_warps", config.num_warps), ("num_stages", config.num_stages)) if v}
    a_tma, b_tma = tma_ring_descriptors(a, b, meta["BLOCK_K"], paired_a and M % 64 == 0)
    (kernel or matmul_tma_ring_kernel)[_matmul_grid({"M": M, "N": N, **meta})](
        a, b, c, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        a_tma, b_tma, **meta, **options)
    return c


# The persistent GEMM, warp-specialized by hand (mt.warp_specialize; docs/warp_specialization.md): one program per
# SM loops over C tiles in grouped order; a producer warpgroup streams every tile's A and B boxes into two rings by
# TMA while the consumer warps run the wgmmas on the ring slots in place and store each tile. The producer runs
# ahead into the next tile's stages while the consumers store the current one, and no CTA starts from an empty
# ring but the first. `fill` counts ring fills across tiles: fill i goes to slot i % STAGES.
PRODUCER_REGISTERS = 40  # the TMA producer holds scalars only
C_BOX_COLUMNS = 64  # TMA-stored C boxes: 128-byte rows of bf16 (the 128B swizzle)
CONSUMER_REGISTERS = 232  # 2 x m64n256 accumulators and the epilogue: 232 x 256 + 40 x 128 <= 65536


@mt.kernel
def matmul_persistent_kernel(a_tma, b_tma, c_out, bias_ptr, M, N, K, stride_cm, stride_cn,
                             BLOCK_M: mt.constexpr, BLOCK_N: mt.constexpr, BLOCK_K: mt.constexpr,
                             STAGES: mt.constexpr, GROUP_M: mt.constexpr = 8, HAS_BIAS: mt.constexpr = False,
                             ACTIVATION: mt.constexpr = "none", TMA_STORE: mt.constexpr = False):
    """C = act(A @ B + bias) from TMA descriptors of A and B in the rings' boxes (`tma_ring_descriptors`),
    persistent over the C tiles (launch at most one program per resident slot: `matmul_persistent`). `c_out` is
    C's pointer, or with TMA_STORE a descriptor of C in [BLOCK_M, 64] boxes: each tile then goes out straight from
    the accumulator's registers through shared memory by TMA stores, which finish while the consumers start the
    next tile (stride_cm / stride_cn unused)."""
    a_ring = mt.ring((BLOCK_M, BLOCK_K), a_tma.dtype, STAGES)
    b_ring = mt.ring((BLOCK_K, BLOCK_N), b_tma.dtype, STAGES)
    num_tiles = mt.cdiv(M, BLOCK_M) * mt.cdiv(N, BLOCK_N)
    k_steps = mt.cdiv(K, BLOCK_K)
    with mt.warp_specialize():
        with mt.partition(registers=CONSUMER_REGISTERS):  # the kernel's num_warps: wgmma and the epilogue
            fill = 0
            for tile in range(mt.program_id(0), num_tiles, mt.num_programs(0)):
                pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
                acc = mt.zeros((BLOCK_M, BLOCK_N), mt.float32)
                for _ in range(0, k_steps):
                    acc = mt.dot(a_ring.get(fill), b_ring.get(fill), acc)
                    a_ring.release(fill)
                    b_ring.release(fill)
                    fill += 1
                rm = pid_m * BLOCK_M + mt.arange(0, BLOCK_M)
                rn = pid_n * BLOCK_N + mt.arange(0, BLOCK_N)
                if TMA_STORE:
                    c_out.store([pid_m * BLOCK_M, pid_n * BLOCK_N],
                                activate(acc, rn, bias_ptr, N, HAS_BIAS, ACTIVATION).to(c_out.dtype))
                else:
                    store_epilogue(acc, rm, rn, c_out, bias_ptr, M, N, stride_cm, stride_cn, HAS_BIAS, ACTIVATION)
        with mt.partition(warps=4, registers=PRODUCER_REGISTERS):  # one warpgroup: the TMA producer
            fill = 0
            for tile in range(mt.program_id(0), num_tiles, mt.num_programs(0)):
                pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
                for kk in range(0, k_steps):
                    a_ring.put(fill, a_tma, [pid_m * BLOCK_M, kk * BLOCK_K])
                    b_ring.put(fill, b_tma, [kk * BLOCK_K, pid_n * BLOCK_N])
                    fill += 1


def matmul_persistent(a: torch.Tensor, b: torch.Tensor, config: mt.Config | None = None,
                      paired_a: bool = True, bias: torch.Tensor | None = None, activation: str = "none",
                      programs: int | None = None, tma_store: bool = False) -> torch.Tensor:
    """act(a @ b + bias) with matmul_persistent_kernel at `config` (default the 128x256x64 3-stage one): as many
    programs as the GPU holds at once (or `programs`), none more than there are tiles. a and b need unit inner
    strides and 16-byte aligned rows (TMA). paired_a: A in rank-4 boxes where M is a multiple of 64. tma_store:
    C stored by TMA in [BLOCK_M, 64] boxes (N a multiple of 8, for C's 16-byte aligned rows)."""
    M, N, K = problem_size(a, b)
    config = config or PERSISTENT_CONFIG
    meta = {k: v for k, v in config.kwargs.items() if k != "GROUP_M"}
    meta["GROUP_M"] = config.kwargs.get("GROUP_M", 8)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    a_tma, b_tma = tma_ring_descriptors(a, b, meta["BLOCK_K"], paired_a and M % 64 == 0)
    c_out = mt.TensorDescriptor.from_tensor(c, [meta["BLOCK_M"], C_BOX_COLUMNS]) if tma_store else c
    args = (a_tma, b_tma, c_out, bias if bias is not None else c, M, N, K, c.stride(0), c.stride(1))
    options = dict(meta, STAGES=config.num_stages, num_warps=config.num_warps, HAS_BIAS=bias is not None,
                   ACTIVATION=activation, TMA_STORE=tma_store)
    tiles = mt.cdiv(M, meta["BLOCK_M"]) * mt.cdiv(N, meta["BLOCK_N"])
    if programs is None:
        programs = tiles if interpreting() else matmul_persistent_kernel.resident_programs(*args, **options)
    matmul_persistent_kernel[(max(1, min(programs, tiles)),)](*args, **options)
    return c


# Row-major operands as the JIT sees them: 16-byte aligned pointers, strides multiples of 16, unit inner strides.
_SIG = ("a_ptr:*bf16:16,b_ptr:*bf16:16,c_ptr:*bf16:16,bias_ptr:*bf16:16,M:i32,N:i32,K:i32,stride_am:i32:16,"
        "stride_ak:i32=1,stride_bk:i32:16,stride_bn:i32=1,stride_cm:i32:16,stride_cn:i32=1")
matmul_kernel.specialize(signature=_SIG, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
matmul_kernel.specialize(signature=_SIG, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, HAS_BIAS=True, ACTIVATION="gelu")
# The TMA-fed ring at the 128x128x64 config (M, N, K multiples of 16 as at 8192^3; descriptors in the ring's boxes).
_TMA_RING_SIG = (_SIG.replace("M:i32,N:i32,K:i32", "M:i32:16,N:i32:16,K:i32:16")
                 + ",a_tma:tensordesc<bf16[8,64]>,b_tma:tensordesc<bf16[64,64]>")
matmul_tma_ring_kernel.specialize(signature=_TMA_RING_SIG, num_warps=8, num_stages=4, BLOCK_M=128, BLOCK_N=128,
                                  BLOCK_K=64, GROUP_M=8)
matmul_tma_ws_kernel.specialize(signature=_TMA_RING_SIG, num_warps=8, num_stages=4, BLOCK_M=128, BLOCK_N=128,
                                BLOCK_K=64, GROUP_M=8)
# The persistent kernel at its default config, A in paired rank-4 boxes (M a multiple of 64, as at 8192^3).
matmul_persistent_kernel.specialize(
    signature="a_tma:tensordesc<bf16[2,1,8,64]>,b_tma:tensordesc<bf16[64,64]>,c_out:*bf16:16,bias_ptr:*bf16:16,"
              "M:i32:16,N:i32:16,K:i32:16,stride_cm:i32:16,stride_cn:i32=1",
    num_warps=8, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=3)


def problem_size(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    """(M, N, K) of a (M, K) @ (K, N) product; ValueError for operands that do not multiply."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    return a.shape[0], b.shape[1], a.shape[1]


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none",
           block: tuple[int, int, int] = (64, 64, 32)) -> torch.Tensor:
    """act(a @ b + bias) in a's dtype, accumulated in fp32."""
    M, N, K = problem_size(a, b)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    bm, bn, bk = block
    grid = (mt.cdiv(M, bm), mt.cdiv(N, bn))
    matmul_kernel[grid](a, b, c, bias if bias is not None else c, M, N, K, a.stride(0), a.stride(1),
                        b.stride(0), b.stride(1), c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                        HAS_BIAS=bias is not None, ACTIVATION=activation)
    return c


# A small autotuning space over the same kernel (the constexprs the configs set are left out of the launch).
# The Hopper main loop (passes/pipeline.py): wgmma reads cp.async ring slots in place, asynchronously. 128x256x64
# on 2 warpgroups (each m64n256k16, M split over them): 4 stages of 48 KB in dynamic shared memory + the
# epilogue's 32 KB of static scratch = 225 KB of the 227. From 4 stages on the loop has one barrier per iteration
# (copies 2 iterations ahead into the slot read 2 iterations back); 3 stages keep the two-barrier schedule (copies
# 2 ahead into the slot read 1 back): both 128x256 configs stay so the benchmark compares the schedules.
# 128x128x64: 5 stages of 32 KB (one barrier, copies 3 ahead) and 4 (one barrier, 2 ahead). 64x64x32 is the
# small-problem / interpreter config (index 4); 64x64x64 at 8 stages the skinny one. GROUP_M 8: grouped program
# order for L2 reuse (1-D grid).
MATMUL_CONFIGS = [
    mt.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
    mt.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    mt.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=5),
    mt.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
    mt.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=3),
    # skinny M (decode-sized GEMMs): one warpgroup, 8 stages of 16 KB; 64x8192x8192 runs 128 programs (one wave) at
    # 44.6 us against cuBLAS's 44.0 (99.3%, H200, 2026-11-30, tools/gemm_ab.py --rounds 3), where 128x128 s5
    # took 71.8 us
    mt.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}, num_warps=4, num_stages=8),
]
# The persistent kernel's default: 2 consumer warpgroups of m64n256, 3 stages of 48 KB.
PERSISTENT_CONFIG = mt.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8,
                              num_stages=3)
# Interpreted, the smallest tiles run fastest in numpy: interpret_config picks them.
matmul_kernel_autotuned = mt.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"], interpret_config=4)(matmul_kernel)


def _matmul_grid(meta: dict) -> tuple[int, int]:
    """One program per (BLOCK_M, BLOCK_N) tile of C (a 1-D grid in grouped order when GROUP_M is set); module-level
    so every launch reuses one launch function."""
    tiles_m, tiles_n = mt.cdiv(meta["M"], meta["BLOCK_M"]), mt.cdiv(meta["N"], meta["BLOCK_N"])
    if meta.get("GROUP_M", 0):
        return tiles_m * tiles_n, 1
    return tiles_m, tiles_n


def matmul_autotuned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in a's dtype (fp32 accumulation) with the tile sizes tuned per (M, N, K) over MATMUL_CONFIGS."""
    M, N, K = problem_size(a, b)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    matmul_kernel_autotuned[_matmul_grid](a, b, c, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                          c.stride(0), c.stride(1))
    return c


def reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none"
              ) -> torch.Tensor:
    c = a.double() @ b.double()
    if bias is not None:
        c = c + bias.double()
    c = {"none": lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
         "gelu": torch.nn.functional.gelu}[activation](c)
    return c.to(a.dtype)
