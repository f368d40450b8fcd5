"""The frontend's IR, checked on its printed text: folding, control flow, promotion, helpers."""
from __future__ import annotations

import minitriton as mt
from minitriton.frontend import compile_to_ir
from minitriton.ir import PointerType, print_module, types as T, verify

F32P = PointerType(T.f32)


def ir(fn, arg_types=None, **constexprs) -> str:
    import inspect
    params = [p for p in inspect.signature(fn).parameters if p not in constexprs and p.upper() != p]
    types = arg_types or {p: (F32P if p.endswith("ptr") else T.i32) for p in params}
    m = compile_to_ir(fn, types, constexprs)
    verify(m)
    return print_module(m, with_locs=False)


def test_constexpr_if_is_folded() -> None:
    def k(x_ptr, BLOCK):
        if BLOCK > 64:
            mt.store(x_ptr, 1.0)
        else:
            mt.store(x_ptr, 2.0)

    text = ir(k, BLOCK=128)
    assert "scf.if" not in text and "value = 1.0" in text and "value = 2.0" not in text


def test_static_range_unrolls() -> None:
    def k(x_ptr):
        for i in mt.static_range(3):
            mt.store(x_ptr + i, i * 1.5)

    text = ir(k)
    assert "scf.for" not in text and text.count('"mt.store"') == 3 and "value = 3.0" in text


def test_runtime_loop_carries_python_number_as_f32_scalar() -> None:
    def k(x_ptr, n):
        acc = 0
        for i in range(n):
            acc += mt.load(x_ptr + i)
        mt.store(x_ptr, acc)

    text = ir(k)
    assert '"scf.for"' in text and "-> f32" in text
    assert "^bb0(%arg2: i32, %arg3: f32)" in text


def test_while_loop() -> None:
    def k(x_ptr, n):
        i = 0
        while i < n:
            i = i * 2 + 1
        mt.store(x_ptr, i.to(mt.float32))

    text = ir(k)
    assert '"scf.while"' in text and '"scf.condition"' in text


def test_weak_typing_keeps_tile_dtype() -> None:
    def k(x_ptr, y_ptr):
        x = mt.load(x_ptr + mt.arange(0, 16)).to(mt.bfloat16)
        mt.store(y_ptr + mt.arange(0, 16), x * 2.0)

    text = ir(k)
    assert '"mt.mul"' in text and "(tensor<16xbf16>, tensor<16xbf16>) -> tensor<16xbf16>" in text


def test_int_division_promotes_to_float_and_floordiv_truncates() -> None:
    def k(x_ptr, n):
        a = n / 2
        b = n // 2
        mt.store(x_ptr, a + b)

    text = ir(k)
    assert '"mt.div"(' in text and "(f32, f32) -> f32" in text and "(i32, i32) -> i32" in text


def test_helper_inlined_with_defaults_and_tuples() -> None:
    @mt.func
    def stats(x, scale=2.0):
        return mt.max(x, axis=0) * scale, mt.sum(x, axis=0)

    def k(x_ptr):
        x = mt.load(x_ptr + mt.arange(0, 32))
        hi, total = stats(x)
        mt.store(x_ptr, hi + total)

    text = ir(k)
    assert 'kind = "max"' in text and 'kind = "sum"' in text and "value = 2.0" in text


def test_broadcasting_pointer_arithmetic() -> None:
    def k(x_ptr, stride):
        rows = mt.arange(0, 8)
        cols = mt.arange(0, 16)
        p = x_ptr + rows[:, None] * stride + cols[None, :]
        mt.store(p, mt.zeros((8, 16), mt.float32))

    text = ir(k)
    assert "tensor<8x16x!mt.ptr<f32>>" in text and '"mt.broadcast"' in text and '"mt.expand_dims"' in text


def test_equal_to_one_and_divisibility_specialization() -> None:
    def k(x_ptr, stride):
        mt.store(x_ptr + stride, 1.0)

    m = compile_to_ir(k, {"x_ptr": F32P, "stride": T.i32}, {}, divisibility={"x_ptr": 16}, equal_to_one={"stride"})
    f = m.functions[0]
    assert f.attrs["divisibility"] == [16, 1]
    text = print_module(m, with_locs=False)
    assert '"mt.addptr"(%arg0, %' in text and "value = 1}" in text


def test_if_with_runtime_condition_merges_variables() -> None:
    def k(x_ptr, n):
        v = 1.0
        w = 5
        if n > 3:
            v = 2.0
        else:
            w = 6
        mt.store(x_ptr, v + w)

    text = ir(k)
    assert '"scf.if"' in text and "-> (f32, i32)" in text


def test_locations_point_at_source_lines() -> None:
    def k(x_ptr):
        y = mt.load(x_ptr)
        mt.store(x_ptr, y + 1.0)

    import inspect
    _, start = inspect.getsourcelines(k)
    m = compile_to_ir(k, {"x_ptr": F32P}, {})
    ops = {op.name: op for op in m.walk()}
    assert ops["mt.load"].loc.line == start + 1
    assert ops["mt.store"].loc.line == start + 2
    assert ops["mt.load"].loc.file == __file__


def test_where_with_two_python_constants() -> None:
    def k(x_ptr):
        t = mt.arange(0, 16)
        mt.store(x_ptr + t, mt.where(t > 3, 1, 0).to(mt.float32))

    text = ir(k)
    assert '"mt.select"' in text and "tensor<16xi32>" in text
