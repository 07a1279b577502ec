"""The cpu backend's numba binary kernels (``numpy.add.numba``...) past what the conformance cases
reach: problems larger than a task's block (runs of a repeated operand straddling the blocks,
the cycle wrapping inside a block), every operator and fused activation, either operand
repeated; and how the launcher sees the operands (flat views, the repeated operand in place,
never broadcast to the output's shape)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err

from opruntime.ops import OPS

pytest.importorskip("numba")

from opruntime_numpy import elementwise, jit

CHUNK = jit.loops("_nb_elementwise").CHUNK

#: (a, b): a channel bias of runs that do not divide the block, a column over rows longer than a
#: block, a scalar over several blocks, the repeated operand first (b - a order kept), a bias row
#: over short rows, two-sided broadcasting
SHAPES = [
    ((2, 3, CHUNK // 3 + 7), (3, 1)),
    ((3, 1), (3, CHUNK + 5)),
    ((2 * CHUNK + 3,), ()),
    ((), (5, CHUNK // 2 + 1)),
    ((CHUNK // 4 + 3, 9), (9,)),
    ((7, 1, 3001), (5, 3001)),
]


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s)).replace(" ", ""))
def test_large_broadcasts_against_the_reference(shapes, act, rng):
    for dtype in ("float32", "float16"):
        a = rng.standard_normal(shapes[0]).astype(dtype)
        b = rng.standard_normal(shapes[1]).astype(dtype)
        for op in ("add", "sub", "mul", "div"):
            bb = np.where(np.abs(b) < 0.5, 0.5, b).astype(dtype) if op == "div" else b
            problem = OPS[op].problem_for("cpu", [a.shape, bb.shape], dtype, activation=act)
            out = elementwise.prepare_numba(problem, None)(a, bb)
            ref = OPS[op].reference(a, bb, activation=act)
            assert out.shape == ref.shape and out.dtype == np.dtype(dtype)
            assert rel_err(out, ref) <= TOLERANCE[dtype], (op, act, dtype)


def _problem(sa, sb, **attrs):
    return OPS["add"].problem_for("cpu", [sa, sb], "float32", **attrs)


def test_the_launcher_reads_operands_in_place():
    """Flat views for equal shapes; a channel bias, a column or a scalar go to the cycling loop
    (read in place); a bias row stays a (1, cols) row; nothing is broadcast and copied."""
    assert elementwise._cycle(_problem((4, 8, 5, 5), (8, 1, 1))) == (0, 25, 8)
    assert elementwise._cycle(_problem((6, 1), (6, 7), activation="relu")) == (1, 7, 6)
    assert elementwise._cycle(_problem((3, 4), ())) == (0, 12, 1)
    assert elementwise._cycle(_problem((3, 4), (4,))) is None  # a bias row: binary's (1, cols)
    assert elementwise._cycle(_problem((3, 4), (3, 4))) is None
    a, b = np.ones((3, 4), np.float32), np.ones((3, 4), np.float32)
    a2, b2, shape = elementwise._two_d(_problem((3, 4), (3, 4)))(a, b)
    assert shape == (1, 12) and np.shares_memory(a2, a) and np.shares_memory(b2, b)
    row = np.ones(4, np.float32)
    a2, b2, shape = elementwise._two_d(_problem((3, 4), (4,)))(a, row)
    assert shape == (3, 4) and b2.shape == (1, 4) and np.shares_memory(b2, row)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_streamed_results_at_every_alignment(dtype, rng):
    """The non-temporal stores (``_streamed``): whole vectors from the result's first aligned
    element, scalars before and after, at each of the 16 offsets of a 64-byte line and lengths
    around a vector; NaN, infinities and signed zeros as the reference gives them."""
    nb = jit.loops("_nb_elementwise")
    for n in (0, 1, 15, 16, 17, 33, 1000):
        a = rng.standard_normal(n + 16).astype(dtype)
        b = rng.standard_normal(n + 16).astype(dtype)
        a[::7], b[::11] = np.nan, -np.inf
        a[3::13] = -0.0
        for off in range(16):
            av, bv = a[off:off + n], b[(off * 5) % 16:(off * 5) % 16 + n]  # operands misaligned their own ways
            for code, op in enumerate(("add", "sub", "mul", "div")):
                for act in (0, 2):
                    y = np.full(n + 16, 7.0, dtype)
                    nb._streamed(av, bv, y[off:off + n], code, act)
                    want = OPS[op].reference(av, bv, activation="relu" if act else None)
                    np.testing.assert_array_equal(y[off:off + n], want.astype(dtype), err_msg=f"{op} {act} {off} {n}")
                    assert (y[:off] == 7).all() and (y[off + n:] == 7).all()  # nothing written outside
            for code, want in ((1, -av), (2, np.where(av < 0, 0, av))):
                y = np.full(n + 16, 7.0, dtype)
                nb._streamed_unary(av, y[off:off + n], code)
                np.testing.assert_array_equal(y[off:off + n], want, err_msg=f"unary {code} {off} {n}")
                assert (y[:off] == 7).all() and (y[off + n:] == 7).all()


def test_large_results_take_the_streamed_loops(rng, monkeypatch):
    """Results past ``STREAM_BYTES`` go through the streamed loops (made to here with a threshold
    of 0): every operator, relu fused or not, neg and relu, a strided operand still the plain loop."""
    monkeypatch.setattr(elementwise.buffers, "STREAM_BYTES", 0)
    a = rng.standard_normal((5, 3 * CHUNK + 5)).astype(np.float32)
    b = rng.standard_normal((5, 3 * CHUNK + 5)).astype(np.float32)
    for op in ("add", "sub", "mul", "div"):
        for act in (None, "relu", "gelu"):
            for bv in (b, b[:, ::-1]):  # unit stride, then reversed (strided: the plain loop)
                problem = OPS[op].problem_for("cpu", [a.shape, bv.shape], "float32", activation=act)
                out = elementwise.prepare_numba(problem, None)(a, bv)
                assert rel_err(out, OPS[op].reference(a, bv, activation=act)) <= TOLERANCE["float32"], (op, act)
    for op in ("neg", "relu"):
        problem = OPS[op].problem_for("cpu", [a.shape], "float32")
        np.testing.assert_array_equal(elementwise.prepare_numba(problem, None)(a), OPS[op].reference(a))
