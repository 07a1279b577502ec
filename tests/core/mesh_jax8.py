"""Sharded operators on 8 JAX host devices, checked against the float64 references.

JAX makes its host devices when it starts, so these tests need a process whose JAX started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``: ``test_mesh.py`` runs this file in one
(the name does not match ``test_*.py``, so the main session never collects it).
"""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import ShapeError
from opruntime.mesh import MeshTensor
from opruntime.ops.base import wide
from opruntime.testing.numerics import TOLERANCE, rel_err

NAMES = [f"jax:cpu:{i}" for i in range(8)]
if sum(d.name.startswith("jax:cpu:") for d in opr.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (run by test_mesh.py)",
                allow_module_level=True)

ROWS = opr.mesh(NAMES, policy="always")
COLS = opr.mesh(NAMES, axis=-1, policy="always")
AUTO = opr.mesh(NAMES)


def rand(rng: np.random.Generator, *shape: int, dtype: str = "float32") -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def check(op: str, out: MeshTensor, *host: np.ndarray, dtype: str = "float32", **attrs) -> None:
    assert isinstance(out, MeshTensor) and out.device == ROWS
    ref = opr.OPS[op].reference(*wide(list(host)), **attrs)
    assert out.shape == ref.shape and out.dtype == np.dtype(dtype)
    assert rel_err(out.numpy(), ref) <= TOLERANCE[dtype]


def strategy(op: str, *args, **attrs) -> str:
    return opr.explain(op, *args, **attrs).strategy.kind


# -- matmul ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [13, 8, 1, 0])
def test_matmul_by_rows_uneven_one_and_empty(rng, m):
    a, b = rand(rng, m, 20), rand(rng, 20, 7)
    ta = opr.tensor(a, device=ROWS)
    assert ta.counts == tuple(np.array_split(np.arange(m), 8)[i].size for i in range(8))
    out = opr.matmul(ta, b)  # b (host) joins as replicated
    check("matmul", out, a, b)
    if m:
        assert out.axis == 0 and out.counts == ta.counts and strategy("matmul", ta, b) == "shards"


def test_matmul_by_columns_of_b(rng):
    a, b = rand(rng, 9, 16), rand(rng, 16, 11)
    tb = opr.tensor(b, device=COLS)
    out = opr.matmul(ROWS.replicate(a), tb)
    check("matmul", out, a, b)
    assert out.axis == 1 and out.counts == tb.counts


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_along_k_sums_with_psum(rng, dtype):
    a, b = rand(rng, 6, 13, dtype=dtype), rand(rng, 13, 5, dtype=dtype)  # K = 13: uneven
    ta, tb = opr.tensor(a, device=COLS), ROWS.shard(b, axis=0)
    out = opr.matmul(ta, tb)
    check("matmul", out, a, b, dtype=dtype)
    assert out.axis is None and strategy("matmul", ta, tb) == "sum"
    for piece in out.pieces:  # every member holds the whole sum
        assert rel_err(piece.numpy(), a.astype(np.float64) @ b) <= TOLERANCE[dtype]


def test_batched_matmul_by_batch_and_non_contiguous_input(rng):
    base = rand(rng, 5, 12, 9)
    a = base[:, ::2, :]  # a strided host view
    b = rand(rng, 9, 4)
    check("matmul", opr.matmul(opr.tensor(a, device=ROWS), b), a, b)


def test_matmul_with_a_split_weight_runs_whole_and_says_why(rng):
    a, b = rand(rng, 10, 12), rand(rng, 12, 6)
    ta, tb = ROWS.shard(a), ROWS.shard(b)  # b split along K while a is split along M: no rule
    out = opr.matmul(ta, tb)
    check("matmul", out, a, b)
    e = opr.explain("matmul", ta, tb)
    assert e.strategy.kind == "whole" and "no rule" in e.strategy.why
    assert out.counts == (10, 0, 0, 0, 0, 0, 0, 0)  # computed whole: kept on the first member


# -- the selection rule ----------------------------------------------------------------------------
def test_a_small_matmul_stays_on_one_device(rng):
    a, b = rand(rng, 64, 64), rand(rng, 64, 64)
    ta = opr.tensor(a, device=AUTO)
    e = opr.explain("matmul", ta, b)
    assert e.strategy.kind == "whole" and e.strategy.single < e.strategy.sharded
    assert "one device is estimated faster" in str(e)
    out = opr.matmul(ta, b)
    assert out.counts == (64, 0, 0, 0, 0, 0, 0, 0) and out.pieces[0].device.name == "jax:cpu:0"
    assert rel_err(out.numpy(), a.astype(np.float64) @ b) <= TOLERANCE["float32"]


def test_a_large_matmul_is_sharded(rng):
    a, b = rand(rng, 512, 512), rand(rng, 512, 512)
    ta = opr.tensor(a, device=AUTO)
    e = opr.explain("matmul", ta, b)
    assert e.strategy.kind == "shards" and e.strategy.sharded < e.strategy.single
    assert "jax.matmul" in str(e)  # the kernel chosen for the pieces


# -- the model operators ---------------------------------------------------------------------------
def test_conv2d_by_batch(rng):
    x, w, bias = rand(rng, 11, 3, 8, 8), rand(rng, 4, 3, 3, 3), rand(rng, 4)
    out = opr.conv2d(opr.tensor(x, device=ROWS), w, bias, padding=1)
    check("conv2d", out, x, w, bias, padding=1)
    assert out.axis == 0


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_by_rows(rng, op):
    x = rand(rng, 13, 33)
    out = getattr(opr, op)(opr.tensor(x, device=ROWS), axis=-1)
    check(op, out, x, axis=-1)
    assert out.axis == 0


def test_softmax_along_the_split_axis_runs_whole(rng):
    x = rand(rng, 13, 5)
    tx = opr.tensor(x, device=ROWS)
    check("softmax", opr.softmax(tx, axis=0), x, axis=0)
    e = opr.explain("softmax", tx, axis=0)
    assert e.strategy.kind == "whole" and "computes across" in e.strategy.why


def test_linear_and_norms_by_rows(rng):
    x = rand(rng, 10, 3, 16)
    w, b = rand(rng, 8, 16), rand(rng, 8)
    gamma, beta = rand(rng, 16), rand(rng, 16)
    tx = opr.tensor(x, device=ROWS)
    check("linear", opr.linear(tx, w, b, activation="gelu"), x, w, b, activation="gelu")
    r = rand(rng, 10, 3, 8)  # a residual split as x is follows its rows; the weights are replicated
    tr = opr.tensor(r, device=ROWS)
    check("linear", opr.linear(tx, w, b, activation="relu", residual=tr), x, w, b, r, activation="relu")
    assert strategy("linear", tx, w, b, residual=tr) == "shards"
    check("linear", opr.linear(tx, w, residual=tr), x, w, None, r)
    assert strategy("linear", tx, w, residual=tr) == "shards"
    check("layer_norm", opr.layer_norm(tx, 16, gamma, beta), x, gamma, beta, normalized_shape=16)
    check("rms_norm", opr.rms_norm(tx, 16, gamma), x, gamma, normalized_shape=16)


def test_batch_norm_and_pools_by_batch(rng):
    x = rand(rng, 9, 4, 6, 6)
    mean, var = rand(rng, 4), np.abs(rand(rng, 4)) + 0.5
    tx = opr.tensor(x, device=ROWS)
    check("batch_norm", opr.batch_norm(tx, mean, var), x, mean, var)
    check("max_pool2d", opr.max_pool2d(tx, kernel_size=2), x, kernel_size=2)
    check("avg_pool2d", opr.avg_pool2d(tx, kernel_size=3, stride=2, padding=1), x, kernel_size=3, stride=2,
          padding=1)
    check("adaptive_avg_pool2d", opr.adaptive_avg_pool2d(tx, output_size=2), x, output_size=2)


@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_reductions_along_an_axis_not_split(rng, op):
    x = rand(rng, 13, 6, 5)
    tx = opr.tensor(x, device=ROWS)
    out = getattr(opr, op)(tx, axis=(1, 2))
    check(op, out, x, axis=(1, 2))
    assert out.axis == 0
    check(op, getattr(opr, op)(tx, axis=0), x, axis=0)  # along the split axis: whole


def test_elementwise_with_broadcast_and_scalars(rng):
    x, y, row = rand(rng, 13, 7), rand(rng, 13, 7), rand(rng, 7)
    tx, ty = opr.tensor(x, device=ROWS), opr.tensor(y, device=ROWS)
    check("add", tx + ty, x, y)
    check("mul", opr.mul(tx, row), x, row)  # a replicated row, broadcast along the split axis
    check("relu", opr.relu(tx), x)
    check("gelu", opr.gelu(tx), x)
    out = 2.0 * tx - 1.0
    assert out.dtype == np.float32 and rel_err(out.numpy(), 2.0 * x.astype(np.float64) - 1.0) <= 1e-6


@pytest.mark.parametrize("axis", [0, 1])
def test_attention_by_batch_and_by_heads(rng, axis):
    q, k, v = rand(rng, 3, 5, 7, 8), rand(rng, 3, 5, 9, 8), rand(rng, 3, 5, 9, 8)
    pq, pk, pv = (ROWS.shard(t, axis=axis) for t in (q, k, v))
    out = opr.scaled_dot_product_attention(pq, pk, pv)
    check("scaled_dot_product_attention", out, q, k, v)
    assert out.axis == axis and strategy("scaled_dot_product_attention", pq, pk, pv) == "shards"


# -- placement ---------------------------------------------------------------------------------------
def test_with_device_mesh_places_host_data(rng):
    x = rand(rng, 13, 4)
    with opr.device(ROWS):
        t = opr.tensor(x)
        out = opr.softmax(x)
    assert isinstance(t, MeshTensor) and t.counts == (2, 2, 2, 2, 2, 1, 1, 1)
    check("softmax", out, x)


def test_shapes_are_checked_on_the_whole_call(rng):
    with pytest.raises(ShapeError):
        opr.matmul(opr.tensor(rand(rng, 13, 4), device=ROWS), rand(rng, 5, 3))
