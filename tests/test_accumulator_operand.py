"""The mma.sync accumulator read in place as a tf32 A operand (minitriton/ir/mma_layouts.py accumulator_as_tf32_a):
the register renaming exists under the column map tf32_a_column and not without it."""
from __future__ import annotations

import numpy as np
import pytest

from minitriton.ir.layouts import identity, register_permutation
from minitriton.ir.mma_layouts import (accumulator_as_tf32_a, dot_operand_layout, dot_operand_thread_map,
                                       mma_layout, mma_thread_map, tf32_a_column)


@pytest.mark.parametrize("wm, shape", [(1, (16, 8)), (1, (16, 32)), (4, (64, 128)), (8, (128, 128)), (2, (64, 16))])
def test_accumulator_renames_into_the_tf32_a_operand(wm: int, shape: tuple[int, int]) -> None:
    acc = mma_layout(2, [wm, 1], [16, 8])
    perm = accumulator_as_tf32_a(acc, shape)
    assert perm is not None and sorted(perm) == list(range(len(perm)))  # every register used once
    src, dst = mma_thread_map(acc, shape), dot_operand_thread_map(dot_operand_layout(0, acc, 1), shape)
    for tid in range(dst.num_threads):  # the element each A register names is in that accumulator register
        for r, s in enumerate(perm):
            row, k = dst.element(tid, r)
            assert src.element(tid, s) == (row, tf32_a_column(k))
    assert register_permutation(src, dst, identity) is None  # without the column map the data would move


def test_no_renaming_where_it_cannot_exist() -> None:
    assert accumulator_as_tf32_a(mma_layout(2, [2, 2], [16, 8]), (32, 16)) is None  # A's copies along N
    assert accumulator_as_tf32_a(mma_layout(2, [4, 1], [16, 8]), (32, 16)) is None  # M not a multiple of 64
    assert accumulator_as_tf32_a(mma_layout(3, [4, 1], [16, 64, 16]), (64, 64)) is None  # wgmma accumulators


def test_column_map_is_a_permutation_and_the_product_is_unchanged() -> None:
    """S K^T with S's columns and K^T's rows permuted by the same map is the same product (the contract a dot
    taking the accumulator in place must keep), and the map moves nothing across 8-column blocks."""
    n = 32
    cols = [tf32_a_column(k) for k in range(n)]
    assert sorted(cols) == list(range(n)) and all(c // 8 == k // 8 for k, c in enumerate(cols))
    rng = np.random.default_rng(5)
    s, kt = rng.standard_normal((16, n)), rng.standard_normal((n, 8))
    np.testing.assert_allclose(s[:, cols] @ kt[cols, :], s @ kt, rtol=1e-12)


@pytest.mark.parametrize("w", [1, 4, 8])
@pytest.mark.parametrize("k_width", [1, 2])
def test_transposed_accumulator_renames_into_the_b_operand(w: int, k_width: int) -> None:
    """S^T [V, K] held as an accumulator on warps [W, 1] is the B operand [K, V] of a dot on warps [1, W]
    (bf16: plain order; tf32: kPairs), so x @ S needs no shared memory for S."""
    from minitriton.ir.mma_layouts import transposed_accumulator_as_b

    acc = mma_layout(2, [w, 1], [16, 8])
    shape = (16 * w, 32)
    perm = transposed_accumulator_as_b(acc, shape, k_width)
    assert perm is not None and sorted(perm) == list(range(len(perm)))
    assert transposed_accumulator_as_b(mma_layout(2, [w, 2], [16, 8]), (16 * w, 32), k_width) is None
