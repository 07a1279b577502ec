"""Property tests (hypothesis) for every operator on every device present: shapes with 0- and
1-sized dims and large primes, broadcast batch dims and 1-D operands, non-contiguous operands
(NumPy views placed by the frontend and views made on the device), every dtype the device
computes, and every attribute combination; each result within the dtype's tolerance of the
float64 reference.

Examples per test: ``OPRUNTIME_HYPOTHESIS_EXAMPLES`` (default 60 on the cpu, 15 where each new
shape compiles: OpenCL, JAX, CUDA). Each run draws fresh examples; a failure prints the
``@reproduce_failure`` blob.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from conftest import dtypes_on
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import opruntime as opr
from opruntime.ops import OPS
from opruntime.testing import TOLERANCE, np_dtype, rel_err
from opruntime.testing.problems import Unsupported, device_view

SMALL = st.sampled_from([0, 1, 1, 2, 3])
MEDIUM = st.integers(4, 33)
PRIME = st.sampled_from([61, 127, 257])
DIM = st.one_of(SMALL, MEDIUM, MEDIUM, PRIME)
MAX_ELEMENTS = 300_000
MAX_FLOPS = 40e6
VIEWS = st.sampled_from([None, None, ("host", "T"), ("host", "slice"), ("device", "T"), ("device", "slice")])


def examples(device: opr.Device) -> int:
    env = os.environ.get("OPRUNTIME_HYPOTHESIS_EXAMPLES")
    return int(env) if env else (60 if device.kind == "cpu" else 15)


def run_property(device: opr.Device, strategy: st.SearchStrategy, check) -> None:
    @settings(max_examples=examples(device), deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(case=strategy, data=st.data())
    def prop(case, data):
        check(case, data)

    prop()


def dtype_for(device: opr.Device, op: str) -> st.SearchStrategy:
    have = sorted(dtypes_on(device, op))
    return st.one_of(st.just("float32"), st.sampled_from(have)) if "float32" in have else st.sampled_from(have)


def operand(device: opr.Device, host: np.ndarray, view) -> object:
    """``host``'s values as the call's operand: plain host data, a NumPy view, or a device view."""
    if view is None or host.ndim == 0 or (view[1] == "T" and host.ndim < 2):
        return host
    where, kind = view
    if where == "device":
        try:
            return opr.Tensor._wrap(device_view(device, host, kind)[0], device)
        except Unsupported:
            return host
    if kind == "T":
        perm = (*range(host.ndim - 2), host.ndim - 1, host.ndim - 2)
        return np.ascontiguousarray(host.transpose(perm)).transpose(perm)
    wide = np.repeat(host, 2, axis=-1)
    wide[..., 1::2] = np.nan  # a kernel that reads the skipped elements gives NaN
    return wide[..., ::2]


def check_result(device, op, hosts, out, dtype, **attrs) -> None:
    shape = OPS[op].normalize([h.shape for h in hosts], dict(attrs)).result_shape
    assert out.device == device, f"ran on {out.device}"
    assert out.dtype == np_dtype(dtype), f"result dtype {out.dtype}, expected {dtype}"
    got = out.numpy()
    assert got.shape == shape, f"shape {got.shape} != {shape}"
    if got.size:
        ref = OPS[op].reference(*[h.astype(np.float64) for h in hosts], **attrs)
        err = rel_err(got, ref)
        assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


def call(device, op, operands, **attrs):
    """Call ``op``; host operands go to ``device`` (with ``device=`` unless a Tensor already says where)."""
    on_device = any(isinstance(x, opr.Tensor) for x in operands)
    fn = getattr(opr, op)
    return fn(*operands, **attrs) if on_device else fn(*operands, device=device, **attrs)


def values(data, shape, dtype, scale=1.0) -> np.ndarray:
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np_dtype(dtype))


# -- matmul --------------------------------------------------------------------------------------------
@st.composite
def matmul_shapes(draw):
    m, k, n = draw(DIM), draw(DIM), draw(DIM)
    nb = draw(st.integers(0, 2))
    full = [draw(st.sampled_from([0, 1, 2, 3]) if draw(st.integers(0, 7)) == 0 else st.sampled_from([1, 2, 3]))
            for _ in range(nb)]
    # each operand: a suffix of the full batch, some dims replaced by 1 (broadcast)
    batch_a = [d if draw(st.booleans()) else 1 for d in full[nb - draw(st.integers(0, nb)):]]
    batch_b = [d if draw(st.booleans()) else 1 for d in full[nb - draw(st.integers(0, nb)):]]
    a = (k,) if draw(st.integers(0, 5)) == 0 else (*batch_a, m, k)
    b = (k,) if draw(st.integers(0, 5)) == 0 else (*batch_b, k, n)
    batch = math.prod(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))) if len(a) > 1 and len(b) > 1 else 1
    assume(math.prod(a) + math.prod(b) + batch * m * n <= MAX_ELEMENTS and 2 * batch * m * n * k <= MAX_FLOPS)
    return a, b


def test_matmul_property(device):
    def check(shapes, data):
        dtype = data.draw(dtype_for(device, "matmul"), label="dtype")
        hosts = [values(data, s, dtype) for s in shapes]
        ops = [operand(device, h, data.draw(VIEWS, label=f"view{i}")) for i, h in enumerate(hosts)]
        check_result(device, "matmul", hosts, call(device, "matmul", ops), dtype)

    run_property(device, matmul_shapes(), check)


# -- softmax / log_softmax ------------------------------------------------------------------------------------
@st.composite
def softmax_cases(draw):
    if draw(st.integers(0, 4)) == 0:  # long rows past any work-group size
        shape = (draw(st.sampled_from([1, 3])), draw(st.sampled_from([1031, 4099])))
    else:
        shape = tuple(draw(st.lists(DIM, min_size=1, max_size=4)))
    assume(math.prod(shape) <= MAX_ELEMENTS)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return shape, axis


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_property(device, op):
    def check(case, data):
        shape, axis = case
        dtype = data.draw(dtype_for(device, op), label="dtype")
        host = values(data, shape, dtype, scale=data.draw(st.sampled_from([0.1, 3.0, 30.0]), label="scale"))
        x = operand(device, host, data.draw(VIEWS, label="view"))
        check_result(device, op, [host], call(device, op, [x], axis=axis), dtype, axis=axis)

    run_property(device, softmax_cases(), check)


# -- conv2d ------------------------------------------------------------------------------------------------
@st.composite
def conv_cases(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cg, og = draw(st.sampled_from([1, 2, 3, 4, 0] if draw(st.integers(0, 9)) == 0 else [1, 2, 3, 4])), draw(st.integers(1, 3))
    depthwise = draw(st.integers(0, 3)) == 0
    if depthwise:
        groups, cg = draw(st.integers(1, 6)), 1
    c, o = groups * cg, groups * og
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    mode = draw(st.sampled_from(["int", "pair", "same", "valid"]))
    stride = (1, 1) if mode == "same" else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    ph, pw = (draw(st.integers(0, 2)), draw(st.integers(0, 2))) if mode in ("int", "pair") else (0, 0)
    if mode == "int":
        pw = ph
    padding = {"int": ph, "pair": (ph, pw), "same": "same", "valid": "valid"}[mode]
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1  # the dilated kernel
    h = max(1, eh - 2 * ph + draw(st.integers(0, 9)))
    w = max(1, ew - 2 * pw + draw(st.integers(0, 9)))
    n = draw(st.sampled_from([0, 1, 1, 2, 3]))
    x = (c, h, w) if draw(st.integers(0, 5)) == 0 else (n, c, h, w)
    attrs = {"stride": stride[0] if stride[0] == stride[1] and draw(st.booleans()) else stride,
             "padding": padding, "dilation": (dh, dw), "groups": groups}
    bias = draw(st.booleans())
    flops = 2 * max(n, 1) * o * cg * kh * kw * h * w
    assume(flops <= MAX_FLOPS)
    return x, (o, cg, kh, kw), bias, attrs


def test_conv2d_property(device):
    def check(case, data):
        xs, ws, bias, attrs = case
        dtype = data.draw(dtype_for(device, "conv2d"), label="dtype")
        hosts = [values(data, xs, dtype), values(data, ws, dtype)] + ([values(data, (ws[0],), dtype)] if bias else [])
        ops = [operand(device, hosts[0], data.draw(VIEWS, label="view"))] + hosts[1:]
        check_result(device, "conv2d", hosts, call(device, "conv2d", ops, **attrs), dtype, **attrs)

    run_property(device, conv_cases(), check)
