"""mt.dot on CUDA cores: acc + a @ b with f32 FMAs — the path of dots that passes/dot_lowering.py left off the tensor
cores (f32 inputs, shapes the mma instructions do not tile); `lower_dot` sends the others to codegen/mma.py
(mma.sync) and codegen/wgmma.py (wgmma).

  1. a (M x K) and b (K x N), whatever their layouts, are written to shared memory as f32 (bf16 / f16 convert
     exactly; input_precision "tf32" rounds f32 inputs with cvt.rn.tf32.f32): A row-major with rows padded by
     one element (lanes reading different rows hit different banks), B row-major. Owners write; `bar.sync`.
  2. Each thread owns the result elements of its layout (the accumulator's layout) and runs a k loop: load the
     A values of its distinct rows and the B values of its distinct columns, one `fma.rn.f32` per owned element.
     The products of f16 / bf16 / f32 inputs are exact inside the fma, sums round in f32, k in increasing order.
  3. When A and B do not fit the shared-memory budget, K is split into chunks handled one after the other
     (each thread then writes only the elements of the current chunk, under per-register predicates).
"""
from __future__ import annotations

from minitriton.ir import Operation
from minitriton.ir.layouts import ThreadMap, log2

from .context import KernelContext
from .elementwise import upcast
from .mma import emit_tf32_round

UNROLL = 4


def lower_dot(ctx: KernelContext, op: Operation) -> None:
    """mt.dot: on tensor cores when passes/dot_lowering.py gave it an `#mt.mma` result (version 2: mma.sync,
    codegen/mma.py; version 3: wgmma, codegen/wgmma.py), else FMAs on CUDA cores (below)."""
    enc = op.result.type.encoding
    if enc is not None and enc.kind == "mma":
        if enc.get("version") == 2:
            from .mma import lower_dot as lower_mma
        else:
            from .wgmma import lower_dot as lower_mma  # type: ignore[no-redef]
        lower_mma(ctx, op)
        return
    a_v, b_v, c_v = op.operands
    (m, k), n = a_v.type.shape, b_v.type.shape[1]
    kc = k
    while (m * (kc + 1) + kc * n) * 4 > ctx.smem_limit and kc > 1:
        kc //= 2
    if (m * (kc + 1) + kc * n) * 4 > ctx.smem_limit:
        raise ctx.error(f"a {m}x{k} @ {k}x{n} dot does not fit in shared memory; use smaller blocks")
    a_pitch, b_offset = kc + 1, m * (kc + 1) * 4
    ctx.need_smem(b_offset + kc * n * 4)
    tf32 = op.attrs.get("input_precision", "ieee") == "tf32" and a_v.type.scalar.name == "f32"  # type: ignore
    a_vals = _as_f32(ctx, ctx.get(a_v), a_v.type.scalar, tf32)
    b_vals = _as_f32(ctx, ctx.get(b_v), b_v.type.scalar, tf32)
    c_map = ctx.tmap(op.result)
    acc = [ctx.new("f32") for _ in range(c_map.num_regs)]
    for d, c in zip(acc, ctx.get(c_v)):
        ctx.emit(f"mov.f32 {d}, {c};")
    for chunk in range(k // kc):
        ctx.barrier()
        _write(ctx, a_vals, ctx.tmap(a_v), (a_pitch, 1), 1, kc, chunk, 0)
        _write(ctx, b_vals, ctx.tmap(b_v), (n, 1), 0, kc, chunk, b_offset)
        ctx.barrier()
        _fma_loop(ctx, acc, c_map, a_pitch, b_offset, n, kc)
    ctx.bind(op.result, acc)


def _as_f32(ctx: KernelContext, regs: list[str], t, tf32: bool) -> list[str]:  # type: ignore[no-untyped-def]
    memo: dict[str, str] = {}
    for r in regs:
        if r not in memo:
            v = upcast(ctx, r, t)
            if tf32:  # round to 10 mantissa bits, and clear the 13 bits below them (the f32 the FMAs read)
                rounded, cleared = ctx.new("b32"), ctx.new("b32")
                emit_tf32_round(ctx, rounded, v)
                ctx.emit(f"and.b32 {cleared}, {rounded}, 0xFFFFE000;")
                v = cleared
            memo[r] = v
    return [memo[r] for r in regs]


def _write(ctx: KernelContext, vals: list[str], tmap: ThreadMap, strides: tuple[int, int], k_dim: int, kc: int,
           chunk: int, offset: int) -> None:
    """Store a tile's elements at offset + 4 * (row * strides[0] + col * strides[1]), k taken modulo kc; when
    the k extent exceeds kc only the elements of this chunk."""
    owner = ctx.owner_pred(tmap)
    guard = f"@{owner} " if owner else ""
    extent = tmap.dims[k_dim].size
    if extent == kc:
        addr = ctx.smem_addr(tmap, strides, 4, offset)
        for r, v in enumerate(vals):
            off = tmap.reg_offsets[r]
            ctx.emit(f"{guard}st.shared.b32 [{addr}+{4 * (off[0] * strides[0] + off[1] * strides[1])}], {v};")
        return
    for r, v in enumerate(vals):
        off = tmap.reg_offsets[r]
        coords = []
        for d in range(2):
            c = ctx.new("b32")
            ctx.emit(f"add.u32 {c}, {ctx.dim_base(tmap.dims[d])}, {off[d]};")
            coords.append(c)
        in_chunk, kk, lin, addr = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("b32")
        ctx.emit(f"shr.u32 {in_chunk}, {coords[k_dim]}, {log2(kc)};")
        ctx.emit(f"and.b32 {kk}, {coords[k_dim]}, {kc - 1};")
        coords[k_dim] = kk
        ctx.emit(f"mul.lo.u32 {lin}, {coords[0]}, {strides[0]};")
        ctx.emit(f"mad.lo.u32 {lin}, {coords[1]}, {strides[1]}, {lin};")
        ctx.emit(f"mad.lo.u32 {addr}, {lin}, 4, {ctx.smem};")
        p = ctx.new("pred")
        ctx.emit(f"setp.eq.u32 {p}, {in_chunk}, {chunk};")
        if owner:
            ctx.emit(f"and.pred {p}, {p}, {owner};")
        ctx.emit(f"@{p} st.shared.b32 [{addr}+{offset}], {v};")


def _fma_loop(ctx: KernelContext, acc: list[str], c_map: ThreadMap, a_pitch: int, b_offset: int, n: int,
              kc: int) -> None:
    rows = sorted({off[0] for off in c_map.reg_offsets})
    cols = sorted({off[1] for off in c_map.reg_offsets})
    pa, pb, kk, more = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("pred")
    ctx.emit(f"mov.u32 {pa}, {ctx.smem_addr(c_map, (a_pitch, 0), 4)};")
    ctx.emit(f"mov.u32 {pb}, {ctx.smem_addr(c_map, (0, 1), 4, b_offset)};")
    ctx.emit(f"mov.u32 {kk}, 0;")
    unroll = min(kc, UNROLL)
    loop = ctx.new_label("dot_k")
    ctx.label(loop)
    for u in range(unroll):
        a = {}
        for i in rows:
            a[i] = ctx.new("f32")
            ctx.emit(f"ld.shared.f32 {a[i]}, [{pa}+{4 * (i * a_pitch + u)}];")
        b = {}
        for j in cols:
            b[j] = ctx.new("f32")
            ctx.emit(f"ld.shared.f32 {b[j]}, [{pb}+{4 * (u * n + j)}];")
        for q, (i, j) in enumerate(c_map.reg_offsets):
            ctx.emit(f"fma.rn.f32 {acc[q]}, {a[i]}, {b[j]}, {acc[q]};")
    ctx.emit(f"add.u32 {pa}, {pa}, {4 * unroll};")
    ctx.emit(f"add.u32 {pb}, {pb}, {4 * n * unroll};")
    ctx.emit(f"add.u32 {kk}, {kk}, {unroll};")
    ctx.emit(f"setp.lt.u32 {more}, {kk}, {kc};")
    ctx.emit(f"@{more} bra {loop};")
