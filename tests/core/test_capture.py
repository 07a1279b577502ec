"""``opr.capture`` on the frontend: signatures, the eager fallback of devices without graphs, the
errors. The CUDA graphs themselves: ``tests/backends/cupy/test_capture_cuda.py``."""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import CaptureError
from opruntime.ops.base import wide
from opruntime.testing.numerics import TOLERANCE, rel_err


def _chain(x, w, b):
    h = opr.layer_norm(x, (x.shape[-1],))
    return opr.add(opr.linear(h, w, b, activation="gelu_tanh"), 1.0)


def _reference(x, w, b):
    ln = opr.OPS["layer_norm"].reference(*wide([x]), normalized_shape=(x.shape[-1],))
    lin = opr.OPS["linear"].reference(ln, *wide([w, b]), activation="gelu_tanh")
    return lin + 1.0


def test_capture_on_a_device_without_graphs_runs_eagerly_with_the_same_results(rng):
    fast = opr.capture(_chain)
    for shape in ((5, 7), (3, 7)):  # two signatures
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, (4, 7), (4,)))
        tx, tw, tb = (opr.tensor(a, device="cpu") for a in (x, w, b))
        for _ in range(3):
            out = fast(tx, tw, tb)
            assert isinstance(out, opr.Tensor) and out.device.name == "cpu"
            assert rel_err(out.numpy().astype(np.float64), _reference(x, w, b)) <= TOLERANCE["float32"]
    assert fast.captured == 0  # the cpu device has no graphs
    assert "2 signature(s)" in repr(fast) and "_chain" in repr(fast)
    assert fast.__name__ == "_chain" and fast.__doc__ == _chain.__doc__


def test_capture_as_a_decorator_keeps_the_returned_structure(rng):
    @opr.capture(warmup=1)
    def pair(x):
        return opr.relu(x), opr.neg(x)

    x = rng.standard_normal((4, 3)).astype(np.float32)
    r, n = pair(opr.tensor(x, device="cpu"))
    np.testing.assert_array_equal(r.numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(n.numpy(), -x)


def test_capture_refuses_a_function_that_returns_no_tensor(rng):
    fast = opr.capture(lambda x: opr.relu(x).numpy())
    with pytest.raises(CaptureError, match="must return a Tensor"):
        fast(opr.tensor(rng.standard_normal(3).astype(np.float32), device="cpu"))


def test_capture_runs_eagerly_for_unhashable_arguments(rng):
    fast = opr.capture(lambda x, shape: opr.reshape(x, shape))
    x = opr.tensor(rng.standard_normal((2, 3)).astype(np.float32), device="cpu")
    assert fast(x, [3, 2]).shape == (3, 2)  # a list: no signature, no recording
    assert fast.captured == 0


class _Graph:
    """A stand-in device graph: records what it was given, replays by calling the function."""

    def __init__(self, fn, inputs):
        self.fn, self.recorded, self.runs = fn, [np.array(i) for i in inputs], 0

    def run(self, inputs):
        self.runs += 1
        return [np.array(o) for o in self.fn(list(inputs))]


def test_a_device_with_graphs_records_once_per_signature_and_replays(monkeypatch, rng):
    """The frontend's side of the contract: ``capture(fn, inputs)`` once per signature after the
    warm-up, then ``run(inputs)`` per call; a settings change is a new signature."""
    prov = opr.Device("cpu").provider
    made = []

    def capture(fn, inputs):
        made.append(_Graph(fn, inputs))
        return made[-1]

    monkeypatch.setattr(prov, "capture", capture, raising=False)
    fast = opr.capture(_chain)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((5, 7), (4, 7), (4,)))
    args = [opr.tensor(a, device="cpu") for a in (x, w, b)]
    for _ in range(3):
        out = fast(*args)
        assert rel_err(out.numpy().astype(np.float64), _reference(x, w, b)) <= TOLERANCE["float32"]
    assert len(made) == 1 and made[0].runs == 3 and fast.captured == 1
    np.testing.assert_array_equal(made[0].recorded[0], x)
    x2 = rng.standard_normal((5, 7)).astype(np.float32)
    out = fast(opr.tensor(x2, device="cpu"), *args[1:])  # same signature, new values
    assert rel_err(out.numpy().astype(np.float64), _reference(x2, w, b)) <= TOLERANCE["float32"]
    assert len(made) == 1
    with opr.override(strict=True):  # other settings: recorded again
        fast(*args)
    assert len(made) == 2


def test_a_recording_that_fails_is_a_capture_error_naming_the_way_out(monkeypatch, rng):
    prov = opr.Device("cpu").provider

    def capture(fn, inputs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(prov, "capture", capture, raising=False)
    fast = opr.capture(_chain)
    args = [opr.tensor(rng.standard_normal(s).astype(np.float32), device="cpu") for s in ((5, 7), (4, 7), (4,))]
    with pytest.raises(CaptureError, match=r"\.numpy\(\)"):
        fast(*args)
