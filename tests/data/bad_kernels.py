"""Kernels with one mistake each. The line marked `# ERR` is where the CompilationError must point.
(These are plain functions: the tests compile them with minitriton.frontend.compile_to_ir.)"""
import torch

import minitriton as mt

GLOBAL_TENSOR = torch.zeros(4)


@mt.func
def helper_with_error(x):
    return x + undefined_thing  # ERR


def unsupported_break(x_ptr, n):
    for i in range(n):
        break  # ERR


def unsupported_while_else(x_ptr, n):
    i = 0
    while i < n:  # ERR
        i += 1
    else:
        pass


def shape_mismatch(x_ptr):
    a = mt.arange(0, 16)
    b = mt.arange(0, 32)
    c = a + b  # ERR


def non_power_of_two(x_ptr):
    offs = mt.arange(0, 100)  # ERR


def missing_constexpr(x_ptr, BLOCK: mt.constexpr):  # ERR
    offs = mt.arange(0, BLOCK)


def runtime_arange_bound(x_ptr, n):
    offs = mt.arange(0, n)  # ERR


def pointer_plus_float(x_ptr):
    p = x_ptr + 1.5  # ERR


def dot_shape_mismatch(x_ptr):
    a = mt.zeros((16, 32), mt.bfloat16)
    b = mt.zeros((16, 16), mt.bfloat16)
    c = mt.dot(a, b)  # ERR


def dot_dtype_mismatch(x_ptr):
    a = mt.zeros((16, 16), mt.bfloat16)
    b = mt.zeros((16, 16), mt.float32)
    c = mt.dot(a, b)  # ERR


def loop_carried_type_change(x_ptr, n):
    acc = mt.zeros((16,), mt.bfloat16)
    for i in range(n):
        acc = acc + mt.zeros((16,), mt.float32)  # ERR


def branch_type_mismatch(x_ptr, n):
    v = mt.zeros((16,), mt.float32)
    if n > 0:  # ERR
        v = mt.zeros((16,), mt.int32)


def tile_condition(x_ptr):
    t = mt.arange(0, 16)
    if t > 3:  # ERR
        pass


def call_plain_python(x_ptr):
    y = torch.exp(x_ptr)  # ERR


def use_global_tensor(x_ptr):
    y = GLOBAL_TENSOR  # ERR


def undefined_name(x_ptr):
    y = z + 1  # ERR


def error_inside_helper(x_ptr):
    y = helper_with_error(mt.arange(0, 16))


def store_shape_mismatch(x_ptr):
    mt.store(x_ptr, mt.arange(0, 16))  # ERR


def helper_wrong_arg_count(x_ptr):
    y = helper_with_error(1, 2)  # ERR


def builtin_wrong_arg_count(x_ptr):
    y = mt.program_id()  # ERR


def bad_cast_target(x_ptr):
    y = mt.arange(0, 16).to(3)  # ERR


def bitcast_width(x_ptr):
    y = mt.arange(0, 16).to(mt.float16, bitcast=True)  # ERR


def load_non_pointer(x_ptr, n):
    y = mt.load(n)  # ERR


def load_bad_cache_modifier(x_ptr, n):
    y = mt.load(x_ptr, cache_modifier=".cx")  # ERR


def load_bad_l2_prefetch(x_ptr, n):
    y = mt.load(x_ptr, l2_prefetch=512)  # ERR


def load_layout_rank(x_ptr, n):
    y = mt.load(x_ptr + mt.arange(0, 16), layout=mt.blocked([1, 1], [1, 32], [1, 4], [0, 1]))  # ERR


def fence_bad_sem(x_ptr, n):
    mt.fence("seq_cst")  # ERR


def prefetch_bad_level(x_ptr, n):
    mt.prefetch(x_ptr + mt.arange(0, 16), level="L3")  # ERR


def return_in_runtime_loop(x_ptr, n):
    for i in range(n):
        if i > 2:
            return  # ERR


def float_shift(x_ptr):
    y = mt.zeros((16,), mt.float32) << 2  # ERR


def used_after_loop(x_ptr, n):
    for i in range(n):
        tmp = i * 2
    y = tmp + 1  # ERR


def static_assert_fails(x_ptr, BLOCK: mt.constexpr):
    mt.static_assert(BLOCK % 16 == 0, "BLOCK must be a multiple of 16")  # ERR


def division_by_zero_constexpr(x_ptr, BLOCK: mt.constexpr):
    y = BLOCK // 0  # ERR


def reduce_bad_axis(x_ptr):
    y = mt.sum(mt.arange(0, 16), axis=1)  # ERR


def lambda_expression(x_ptr):
    f = lambda v: v  # ERR
