"""``opr.mesh`` on CUDA devices: CuPy pieces per GPU, NCCL's all-reduce, peer copies.

The lent machine has one GPU, so the code path runs as an NCCL world of one (``["cuda:0"]``):
the communicator is made, the all-reduce of a matmul sharded along K runs through NCCL, and the
gather of the ``"whole"`` strategy moves through the engine. With two or more GPUs the same
tests run on all of them (``cuda:0`` ... ``cuda:N-1``).
"""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.mesh import MeshTensor
from opruntime.ops.base import wide
from opruntime.testing.numerics import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def names():
    cupy = pytest.importorskip("cupy")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        pytest.skip(f"no CUDA device: {exc}")
    if not n:
        pytest.skip("no CUDA device")
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception as exc:
        pytest.skip(f"CuPy has no NCCL here: {exc}")
    return [f"cuda:{i}" for i in range(n)]


def _check(op: str, out: MeshTensor, *host: np.ndarray, dtype: str, **attrs) -> None:
    ref = opr.OPS[op].reference(*wide(list(host)), **attrs)
    assert isinstance(out, MeshTensor) and out.shape == ref.shape
    assert rel_err(out.numpy(), ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_matmul_along_k_through_nccl(names, rng, dtype):
    rows = opr.mesh(names, policy="always")
    cols = opr.mesh(names, axis=-1, policy="always")
    a = rng.standard_normal((33, 70)).astype(dtype)
    b = rng.standard_normal((70, 17)).astype(dtype)
    ta, tb = opr.tensor(a, device=cols), rows.shard(b, axis=0)
    assert opr.explain("matmul", ta, tb).strategy.kind == "sum"
    out = opr.matmul(ta, tb)
    assert out.axis is None and all(p.device.name == n for p, n in zip(out.pieces, names))
    _check("matmul", out, a, b, dtype=dtype)
    assert rows.engine.comms and len(rows.engine.comms) == len(names)  # one communicator per member


def test_sharded_model_operators(names, rng):
    m = opr.mesh(names, policy="always")
    x = rng.standard_normal((13, 3, 10, 10)).astype(np.float32)
    w, bias = rng.standard_normal((8, 3, 3, 3)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    tx = opr.tensor(x, device=m)
    _check("conv2d", opr.conv2d(tx, w, bias, padding=1, activation="relu"), x, w, bias, padding=1,
           activation="relu", dtype="float32")
    rows = rng.standard_normal((1000, 257)).astype(np.float32)
    _check("softmax", opr.softmax(opr.tensor(rows, device=m)), rows, dtype="float32")
    q, k, v = (rng.standard_normal((2, 4, 64, 32)).astype(np.float16) for _ in range(3))
    heads = [m.shard(t, axis=1) for t in (q, k, v)]
    _check("scaled_dot_product_attention", opr.scaled_dot_product_attention(*heads), q, k, v, dtype="float16")


def test_whole_strategy_and_the_engine_copy(names, rng):
    m = opr.mesh(names, policy="always")
    x = rng.standard_normal((9, 5)).astype(np.float32)
    out = opr.softmax(opr.tensor(x, device=m), axis=0)  # along the split axis: gathered on cuda:0
    assert out.pieces[0].device.name == names[0] and out.counts[0] == 9
    _check("softmax", out, x, axis=0, dtype="float32")
    src, last = out.pieces[0].data, m.members[-1].provider  # the engine's device-to-device copy
    moved = m.engine.move(src, last)
    assert moved is not src and moved.device.id == last.index
    assert np.array_equal(moved.get(), src.get())


def test_a_small_matmul_stays_on_one_gpu(names, rng):
    if len(names) < 2:
        pytest.skip("the choice needs two GPUs (a one-GPU mesh shards trivially)")
    m = opr.mesh(names)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    assert opr.explain("matmul", opr.tensor(a, device=m), a).strategy.kind == "whole"
