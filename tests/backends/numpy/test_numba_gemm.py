"""The GEMM loops of the cpu backend's numba kernels (``_nb_gemm``): ``numpy.linear.numba`` in
blocks of rows on numba's threads with the bias and activation applied per block, and
``numpy.matmul.numba`` in tasks of batch items and rows: odd sizes, size-1 dims, transposed and
strided operands, every activation, float32 and float64, one task and many, and the epilogue at
the values where erf saturates, at zeros, infinities and NaN."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err

import opruntime as opr
from opruntime.ops import OPS
from opruntime.ops.base import Case
from opruntime.plugins import registry
from opruntime.testing import check_kernel, failures, summary

pytest.importorskip("numba")

from opruntime_numpy import linear, matmul  # noqa: E402

CPU = opr.Device("cpu")
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")


def clean(findings) -> None:
    bad = failures(findings)
    assert not bad, f"{len(bad)} conformance failure(s):\n{summary(bad)}"


def _ln(x, n, activation=None, views=(), dtype="float32", bias=True, residual=False) -> Case:
    shapes = (x, (n, x[-1])) + (((n,),) if bias else ()) + (((*x[:-1], n),) if residual else ())
    return Case(shapes, {"activation": activation}, dtype, views, 1.0, (), "linear")


LINEAR = [
    *(_ln((37, 29), 23, act, dtype=dt) for act in ACTIVATIONS for dt in ("float32", "float64")),
    _ln((1, 7), 5, "gelu"), _ln((5, 1), 1, "relu"), _ln((2, 3, 17), 9, "silu", bias=False),
    _ln((33, 20), 11, "gelu", views=("T", "T")),  # a transposed weight: read in place (W.T's rows)
    _ln((41, 19), 13, "gelu_tanh", views=("slice", "slice")),
    _ln((3, 4), 6, None, bias=False),
    # a residual: copied into each block's rows, the block's GEMM adding to it (beta 1)
    *(_ln((37, 29), 23, act, dtype=dt, residual=True) for act in ACTIVATIONS for dt in ("float32", "float64")),
    _ln((2, 3, 17), 9, "relu", views=("slice", None, None, "T"), residual=True),
    _ln((1, 7), 5, "gelu", residual=True), _ln((4, 0), 3, "silu", residual=True),
]


@pytest.mark.parametrize("one_thread_flops", [linear.ONE_THREAD_FLOPS, 0.0], ids=["one_task", "tasks"])
def test_linear_rows_every_activation(monkeypatch, one_thread_flops):
    """Every case through one task in the calling thread, and (no flops threshold) through blocks
    of rows on the threads, every config."""
    monkeypatch.setattr(linear, "ONE_THREAD_FLOPS", one_thread_flops)
    clean(check_kernel(registry().kernels["numpy.linear.numba"], CPU, cases=LINEAR))


SPECIAL = [0.0, -0.0, 1e-30, -1e-3, 0.5, -0.5, 3.9, -3.9, 4.0, -4.0, 4.1, -4.1, 5.5, -5.5, 9.0, -9.0, 30.0, -30.0,
           100.0, -100.0, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_epilogue_special_values(monkeypatch, dtype, activation, bias):
    """x @ ones((n, 1)).T is x in every column: the epilogue sees the values themselves, in blocks
    of rows on the threads; its result matches the float64 reference (NaN and infinities exactly)."""
    monkeypatch.setattr(linear, "ONE_THREAD_FLOPS", 0.0)
    x = np.array(SPECIAL, dtype).reshape(-1, 1)
    w = np.ones((19, 1), dtype)
    b = (np.linspace(-2, 2, 19) * 0.25).astype(dtype) if bias else None
    problem = OPS["linear"].problem_for(CPU, [x.shape, w.shape] + ([b.shape] if bias else []), dtype,
                                        activation=activation)
    for config in linear.NUMBA_CONFIGS:
        out = linear.prepare_numba(problem, config)(x, w, *([b] if bias else []))
        ref = OPS["linear"].reference(x, w, b, activation=activation)
        assert rel_err(out, ref) <= TOLERANCE[dtype], (config, out, ref)


def _mm(a, b, views=(), dtype="float32") -> Case:
    return Case((a, b), {}, dtype, views, 1.0, (), "matmul")


MATMUL = [
    *(_mm((5, 37, 29), (5, 29, 23), dtype=dt) for dt in ("float32", "float64")),
    _mm((3, 1, 7), (3, 7, 1)), _mm((1, 1), (1, 1)), _mm((6, 9, 4), (4, 5)), _mm((9, 4), (6, 4, 5)),
    _mm((2, 1, 7, 13), (1, 3, 13, 5)),  # batch dims broadcast both ways: NumPy's matmul
    _mm((7, 3, 11), (7, 11, 2), ("T", "slice")), _mm((13,), (4, 13, 3)), _mm((67, 131), (131, 61)),
    _mm((0, 5), (5, 3)), _mm((2, 0, 3), (3, 4)),
]


def test_matmul_tasks_every_case():
    clean(check_kernel(registry().kernels["numpy.matmul.numba"], CPU, cases=MATMUL))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_batch_in_row_blocks(dtype):
    """A batch of 3 on the threads' 2 x 4 tasks: each item's rows in blocks."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 50, 20)).astype(dtype), rng.standard_normal((3, 20, 30)).astype(dtype)
    problem = OPS["matmul"].problem_for(CPU, [a.shape, b.shape], dtype)
    for config in matmul.NUMBA_CONFIGS:
        rows, tasks = matmul._plan(problem, config)
        out = matmul.prepare_numba(problem, config)(a, b)
        assert rel_err(out, np.matmul(a.astype(np.float64), b)) <= TOLERANCE[dtype], (rows, tasks)
    assert matmul._plan(problem, {"tasks_per_thread": 4})[0] < 50
