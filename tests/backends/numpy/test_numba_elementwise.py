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
