"""The cpu backend's row and elementwise kernels beyond the conformance suite: the pool of large
results (``opruntime_numpy.buffers``), the float32 math of ``_nb_math`` against float64 over the
whole float32 range, and the numba reductions' accuracy on long sums."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from opruntime_numpy import buffers

import opruntime as opr


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_pool_reuses_a_block_only_when_nothing_refers_to_it():
    buffers.clear()
    shape = (256, 32768)  # 32 MB of float32: glibc would map it fresh every time
    a = buffers.empty(shape, np.float32)
    first = _addr(a)
    del a
    b = buffers.empty(shape, np.float32)
    assert _addr(b) == first  # nothing refers to the block: reused
    view = b[1:].reshape(-1)[::2]  # a view of a view: its base is the block
    del b
    c = buffers.empty(shape, np.float32)
    assert _addr(c) != first  # the view keeps the block
    mv = memoryview(c)
    second = _addr(c)
    del c
    d = buffers.empty(shape, np.float32)
    assert _addr(d) not in (first, second)  # a memoryview keeps it too
    del view, mv, d
    gc.collect()
    e = buffers.empty((1024, 8192), np.float32)  # same size, another dtype view
    assert _addr(e) in (first, second) or len(buffers._blocks) <= 3
    assert e.shape == (1024, 8192) and e.dtype == np.float32 and e.flags.c_contiguous and e.flags.writeable
    buffers.clear()


def test_pool_leaves_small_results_to_numpy_and_is_bounded():
    small = buffers.empty((1024, 1024), np.float32)
    assert small.base is None  # NumPy's own array
    buffers.clear()
    keep = [buffers.empty((buffers.LARGE // 4,), np.float32) for _ in range(buffers.KEEP_BYTES // buffers.LARGE + 2)]
    assert sum(b.nbytes for b in buffers._blocks) <= buffers.KEEP_BYTES
    del keep
    buffers.clear()


def test_large_softmax_results_do_not_alias():
    x = np.random.default_rng(0).standard_normal((256, 32768)).astype(np.float32)
    with opr.override(ops={"softmax": {"kernel": "numpy.softmax.numba"}}, strict=True):
        y1 = opr.softmax(x, axis=-1)
        y2 = opr.softmax(x * 2, axis=-1)
        keep = np.asarray(y1).copy()
        y3 = opr.softmax(y1, axis=-1)  # y1 as an operand: its block is not handed out
    assert np.array_equal(np.asarray(y1), keep)
    assert not np.shares_memory(np.asarray(y1), np.asarray(y2))
    assert not np.shares_memory(np.asarray(y1), np.asarray(y3))
    ref = np.exp(x - x.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    assert np.allclose(keep, ref, atol=1e-6)


def _pinned(op: str):
    return opr.override(ops={op: {"kernel": f"numpy.{op}.numba"}}, strict=True)


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_numba_amax_nan_and_inf(axis):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((37, 9000)).astype(np.float32)  # rows longer than a block
    x[3, 5000] = np.nan
    x[5, 17] = np.inf
    x[7, 8999] = -np.inf
    x[9, :] = np.inf
    x[11, 4] = np.inf
    x[11, 4100] = np.nan
    with _pinned("amax"):
        got = np.asarray(opr.amax(x, axis=axis))
    ref = np.max(x, axis=axis)  # NaN propagates
    assert np.array_equal(got, ref, equal_nan=True)


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("shape,axis", [((1 << 22,), None), ((3, 1 << 20), -1), ((1 << 17, 5), 0), ((64, 4096), 0)])
def test_numba_long_sums_stay_accurate(op, shape, axis):
    x = (np.random.default_rng(2).random(shape, np.float64) + 0.5).astype(np.float32)  # all positive: errors add up
    with _pinned(op):
        got = np.asarray(opr.sum(x, axis=axis) if op == "sum" else opr.mean(x, axis=axis), np.float64)
    x64 = x.astype(np.float64)
    ref = x64.sum(axis=axis) if op == "sum" else x64.mean(axis=axis)
    assert np.max(np.abs(got - ref) / np.abs(ref)) < 1e-6


@pytest.mark.parametrize("shape,size", [((2, 3, 70, 90), 1), ((2, 3, 7, 7), 1), ((2, 3, 13, 11), (5, 4)), ((1, 2, 9, 9), 9)])
def test_numba_adaptive_avg_pool(shape, size):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    with _pinned("adaptive_avg_pool2d"):
        got = np.asarray(opr.adaptive_avg_pool2d(x, size))
    ref = opr.ops.OPS["adaptive_avg_pool2d"].reference(x.astype(np.float64), output_size=size)
    assert got.shape == ref.shape and np.allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("offset", [0.0, 1e3, 1e4])
def test_numba_layer_norm_one_pass_statistics_with_a_large_mean(offset):
    """float32 layer_norm takes E[x^2] - mean^2 in float64: rows far from zero keep their accuracy."""
    x = (np.random.default_rng(4).standard_normal((33, 1000)) + offset).astype(np.float32)
    with _pinned("layer_norm"):
        got = np.asarray(opr.layer_norm(x, 1000), np.float64)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(1, 300_001), (3, 100_003)])
def test_numba_softmax_few_long_rows_split_in_pieces(op, shape):
    """Fewer rows than 4x the threads: each row cut in pieces whose (max, sum) combine."""
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32) * 4
    x[0, 250_000 % shape[1]] = 60.0  # the max in a late piece: earlier pieces' sums rescale
    if shape[0] > 1:
        x[1, :] = -np.inf
        x[1, 5] = 3.0  # one finite value in a row of -inf
        x[2, 77] = np.nan
    with _pinned(op):
        got = np.asarray(getattr(opr, op)(x, axis=-1), np.float64)
    ref = opr.ops.OPS[op].reference(x.astype(np.float64), axis=-1)
    fin = np.isfinite(ref)
    assert np.array_equal(got[~fin], ref[~fin], equal_nan=True)
    assert np.linalg.norm(got[fin] - ref[fin]) / np.linalg.norm(ref[fin]) < 1e-5


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_numba_softmax_strided_axis_runs_of_rows(op):
    """Along axis 0 the rows are cut in runs whose per-column (max, sum) combine: specials in
    late runs, a column of -inf, one with a lone finite value, NaN and +inf."""
    x = np.random.default_rng(6).standard_normal((4000, 37)).astype(np.float32) * 4
    x[3900, 0] = 50.0  # the column's max in the last run
    x[:, 1] = -np.inf
    x[:, 2] = -np.inf
    x[2500, 2] = 1.0
    x[1234, 3] = np.nan
    x[3999, 4] = np.inf
    with _pinned(op):
        got = np.asarray(getattr(opr, op)(x, axis=0), np.float64)
    ref = opr.ops.OPS[op].reference(x.astype(np.float64), axis=0)
    fin = np.isfinite(ref)
    assert np.array_equal(got[~fin], ref[~fin], equal_nan=True)
    assert np.linalg.norm(got[fin] - ref[fin]) / np.linalg.norm(ref[fin]) < 1e-5



@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("layout", ["rows", "strided rows", "long rows", "split rows", "axis 0"])
def test_numba_softmax_sums_of_many_small_terms_stay_accurate(op, layout):
    """One dominant value per row and thousands of small exps: a float32 sum of them in order
    (a strided row is not vectorized) drifted 1.2e-5; sums of chunks are added in float64."""
    rng = np.random.default_rng(7)
    n, rows = {"rows": (4099, 8), "strided rows": (4099, 3), "long rows": (70_001, 64),
                     "split rows": (100_003, 2), "axis 0": (5003, 40)}[layout]
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    x[np.arange(rows), rng.integers(0, n, rows)] = 20.0  # p ~ 0.9 for the largest, many terms ~1e-9
    axis = -1
    if layout == "strided rows":
        x = np.ascontiguousarray(x.T).T
    elif layout == "axis 0":
        x, axis = np.ascontiguousarray(x.T), 0
    with _pinned(op):
        got = np.asarray(getattr(opr, op)(x, axis=axis), np.float64)
    ref = opr.ops.OPS[op].reference(x.astype(np.float64), axis=axis)
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 2e-6


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("layout", ["contiguous", "padded rows", "every other row", "one row", "float64"])
@pytest.mark.parametrize("n", [1, 7, 1023, 4099])
def test_numba_softmax_rows_with_the_next_row_prefetched(op, layout, n):
    """Rows in cache, the next row (and its output row) prefetched during each row: rows of unit
    stride whose rows are apart (a slice of wider rows, every other row), lengths that end inside
    a cache line, the last row (nothing after it), float64; specials in the first and last rows."""
    rng = np.random.default_rng(9)
    rows = 1 if layout == "one row" else 67
    dtype = np.float64 if layout == "float64" else np.float32
    base = (rng.standard_normal((2 * rows, n + 5)) * 4).astype(dtype)
    x = {"padded rows": base[:rows, 3:3 + n], "every other row": base[::2, :n]}.get(layout, base[:rows, :n])
    x = x if layout in ("padded rows", "every other row") else np.ascontiguousarray(x)
    x[-1, n // 2] = np.nan
    if rows > 1:
        x[0, :] = -np.inf
        x[1, n - 1] = np.inf
        x[2, : n - 1] = -np.inf
        x[-2] *= 1e37
    assert x.strides[1] == x.itemsize and (layout in ("contiguous", "one row", "float64")) == x.flags.c_contiguous
    with _pinned(op):
        got = np.asarray(getattr(opr, op)(x, axis=-1), np.float64)
    ref = opr.ops.OPS[op].reference(x.astype(np.float64), axis=-1)
    fin = np.isfinite(ref)
    assert np.array_equal(got[~fin], ref[~fin], equal_nan=True)
    assert fin[3:-1].all()  # the rows of plain values are compared below
    assert np.linalg.norm(got[fin] - ref[fin]) <= 1e-5 * np.linalg.norm(ref[fin])  # n = 1: log_softmax is exactly 0
