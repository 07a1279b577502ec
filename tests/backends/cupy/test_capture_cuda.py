"""``opr.capture`` on CUDA: the forward recorded as a CUDA graph gives eager's results, bit for bit
(the same kernels), for new inputs too, without changing earlier results."""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import CaptureError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no CUDA device: {exc}")
    return "cuda:0"


def _block(x, w1, b1, w2, ln_w, ln_b):
    """A small transformer-like chain: norm, linear + gelu_tanh, attention on views, residuals."""
    B, S, d = x.shape
    h = opr.layer_norm(x, (d,), ln_w, ln_b)
    qkv = opr.linear(h, w1, b1, activation="gelu_tanh").reshape(B, S, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    y = opr.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    y = y.permute(0, 2, 1, 3).reshape(B, S, d)
    return opr.add(x, opr.linear(y, w2)), opr.sum(y, axis=-1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_captured_forward_matches_eager_and_keeps_earlier_results(cuda, rng, dtype):
    d = 64
    shapes = ((2, 33, d), (3 * d, d), (3 * d,), (d, d), (d,), (d,))
    host = [rng.standard_normal(s).astype(np.float32) * (0.1 if i in (1, 3) else 1.0) for i, s in enumerate(shapes)]
    args = [opr.tensor(a, device=cuda, dtype=dtype) for a in host]
    fast = opr.capture(_block)
    eager = [t.numpy() for t in _block(*args)]
    first = fast(*args)
    assert fast.captured == 1
    for got, want in zip(first, eager):
        np.testing.assert_array_equal(got.numpy(), want)  # the same kernels: the same bits
    kept = [t.numpy() for t in first]
    x2 = opr.tensor(rng.standard_normal(shapes[0]).astype(np.float32), device=cuda, dtype=dtype)
    second = fast(x2, *args[1:])
    for got, want in zip(second, _block(x2, *args[1:])):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for t, k in zip(first, kept):  # a replay writes into new arrays, never into a returned result
        np.testing.assert_array_equal(t.numpy(), k)
    strided = opr.tensor(rng.standard_normal((2, 66, d)).astype(np.float32), device=cuda, dtype=dtype)[:, ::2]
    third = fast(strided, *args[1:])  # another signature (strides): recorded again
    assert fast.captured == 2
    np.testing.assert_array_equal(third[0].numpy(), _block(strided, *args[1:])[0].numpy())


def test_the_gpt2_block_example_captured(cuda):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
    import transformer_block as tb

    b = tb.build(cuda, "float16", batch=2, seq=128, d_model=128, heads=4)
    x = opr.tensor(b.x, device=cuda, dtype="float16")
    fast = opr.capture(b.ours)
    want = b.ours(x).numpy()
    for _ in range(3):
        np.testing.assert_array_equal(fast(x).numpy(), want)
    assert fast.captured == 1


def test_reading_a_result_inside_a_captured_function_is_a_capture_error(cuda, rng):
    def bad(x):
        y = opr.relu(x)
        if float(opr.sum(y).numpy()) > 0:  # a host read: the recording cannot wait for the GPU
            return y
        return opr.neg(y)

    x = opr.tensor(rng.standard_normal((8, 8)).astype(np.float32), device=cuda)
    with pytest.raises(CaptureError, match="numpy"):
        opr.capture(bad)(x)
    np.testing.assert_array_equal(opr.relu(x).numpy(), np.maximum(x.numpy(), 0))  # the device still works


def test_bench_graphs_time_every_contender_with_graphs_on_cuda(cuda):
    """``opruntime bench --graphs`` on a CUDA device: opruntime's call, its chosen kernel, the copy
    and torch (its own CUDA graphs) are each recorded and replayed; JAX, which has none, is left out;
    the answer checked after the timing is still right."""
    from opruntime.ops.base import Case
    from opruntime.tools import bench

    case = Case(((4096, 768), (768,), (768,)), {"normalized_shape": 768}, op="layer_norm", dtype="float16")
    r = bench.run_case(case, opr.Device(cuda), repeats=5, peers=["torch", "copy", "jax"], graphs=True)
    assert not r.error and r.graphs
    assert {"opruntime", "direct", "peer:copy"} <= set(r.spread_s) and "jax" not in r.peers
    assert r.time_s > 0 and all(t > 0 for t in r.peers.values())
    if "torch" in r.peers:  # torch installed: timed through its own graphs
        assert r.peer_ratios["torch"] > 0
