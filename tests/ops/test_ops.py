"""The operator suite: every operator on every device present, against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err, skip_unless_dtype

import opruntime as opr
from opruntime.kernels import c_strides
from opruntime.ops import OPS

DTYPES = ["float32", "float64", "float16"]


def check(out: opr.Tensor, ref: np.ndarray, dtype: str, device: opr.Device) -> None:
    assert isinstance(out, opr.Tensor)
    assert out.device == device
    assert out.dtype == np.dtype(dtype), f"result dtype {out.dtype}, expected {dtype}"
    err = rel_err(out.numpy(), ref)
    assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


def on_device(x: np.ndarray, device: opr.Device, view: str | None = None) -> opr.Tensor:
    """``x`` on ``device``; ``view="T"`` gives a transposed device view (made on the device)."""
    if view is None:
        return opr.tensor(x, device=device)
    data = device.provider.from_host(np.ascontiguousarray(x.T if view == "T" else x))
    try:
        data = data.T if view == "T" else data[:, ::2]
    except Exception as exc:  # the native array type has no such view
        pytest.skip(f"{device.name} arrays cannot make a {view} view: {exc}")
    return opr.Tensor._wrap(data, device)


# -- matmul --------------------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((7, 13), (13, 5)),
    ((1, 1), (1, 1)),
    ((1, 9), (9, 1)),
    ((13,), (13, 4)),
    ((5, 13), (13,)),
    ((13,), (13,)),
    ((3, 7, 13), (13, 5)),
    ((2, 1, 7, 13), (1, 3, 13, 5)),
    ((67, 129), (129, 65)),
    ((0, 5), (5, 3)),
    ((4, 0), (0, 3)),
    ((2, 0, 3), (3, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=[f"{a}x{b}" for a, b in MATMUL_SHAPES])
def test_matmul(device, rng, dtype, sa, sb):
    skip_unless_dtype(device, "matmul", dtype)
    a, b = random(rng, sa, dtype), random(rng, sb, dtype)
    out = opr.matmul(a, b, device=device)
    check(out, OPS["matmul"].reference(a, b), dtype, device)


@pytest.mark.parametrize("views", [("T", None), (None, "T"), ("T", "T"), ("slice", None)])
def test_matmul_noncontiguous(device, rng, views):
    a_host, b_host = random(rng, (37, 21), "float32"), random(rng, (21, 19), "float32")
    if views[0] == "slice":
        a_host = random(rng, (37, 42), "float32")
        a = on_device(a_host, device, "slice")
        a_host = a_host[:, ::2]
    else:
        a = on_device(a_host, device, views[0])
    b = on_device(b_host, device, views[1])
    check(opr.matmul(a, b), OPS["matmul"].reference(a_host, b_host), "float32", device)


def test_matmul_mixed_dtypes_promote(device, rng):
    skip_unless_dtype(device, "matmul", "float64")
    a, b = random(rng, (5, 6), "float32"), random(rng, (6, 3), "float64")
    check(opr.matmul(a, b, device=device), OPS["matmul"].reference(a, b), "float64", device)


def test_matmul_tensor_inputs_stay_on_device(device, rng):
    a, b = random(rng, (8, 9), "float32"), random(rng, (9, 10), "float32")
    ta, tb = opr.tensor(a, device=device), opr.tensor(b, device=device)
    out = opr.matmul(ta, tb)
    check(out, OPS["matmul"].reference(a, b), "float32", device)
    check(opr.matmul(ta, b), OPS["matmul"].reference(a, b), "float32", device)  # host data joins the Tensor's device


# -- softmax / log_softmax -----------------------------------------------------------------------
SOFTMAX_CASES = [((1,), -1), ((5,), 0), ((3, 7), -1), ((3, 7), 0), ((4, 1), 1), ((2, 3, 5), 0), ((2, 3, 5), 1),
                 ((2, 3, 5), 2), ((0, 4), 1), ((33, 1025), -1), ((1, 3000), 1), ((6, 4, 3, 2), -3)]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES, ids=[f"{s}-axis{a}" for s, a in SOFTMAX_CASES])
def test_softmax(device, rng, op, dtype, shape, axis):
    skip_unless_dtype(device, op, dtype)
    x = random(rng, shape, dtype) * 4
    out = getattr(opr, op)(x, axis=axis, device=device)
    check(out, OPS[op].reference(x, axis=axis), dtype, device)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_edges(device, op):
    x = np.array([[-np.inf, -np.inf, -np.inf], [1e30, 1e30, -1e30], [0.5, -np.inf, 2.0], [3e38, 1.0, -3e37]],
                 np.float32)
    out = getattr(opr, op)(x, device=device)
    check(out, OPS[op].reference(x), "float32", device)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_noncontiguous(device, rng, op):
    host = random(rng, (24, 40), "float32")
    for view, ref_x in (("T", host), ("slice", host[:, ::2])):
        for axis in (0, 1):
            x = on_device(host, device, view)
            check(getattr(opr, op)(x, axis=axis), OPS[op].reference(ref_x, axis=axis), "float32", device)


# -- conv2d ----------------------------------------------------------------------------------------
CONV_CASES = [
    # (x shape, w shape, attrs)
    ((2, 3, 9, 11), (4, 3, 3, 3), {}),
    ((2, 3, 9, 11), (4, 3, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 4, 10, 7), (6, 4, 3, 2), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}),
    ((2, 4, 8, 8), (4, 2, 3, 3), {"groups": 2, "padding": "same"}),
    ((2, 4, 8, 9), (5, 4, 2, 4), {"padding": "same", "dilation": 2}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"groups": 6, "padding": 1}),  # depthwise
    ((1, 3, 7, 7), (6, 1, 3, 3), {"groups": 3, "stride": 2}),  # depthwise, channel multiplier 2
    ((2, 8, 5, 6), (4, 8, 1, 1), {}),  # pointwise
    ((2, 8, 9, 6), (4, 2, 1, 1), {"groups": 4, "stride": 2}),  # grouped pointwise, strided
    ((3, 5, 5), (2, 3, 3, 3), {"padding": "valid"}),  # unbatched
    ((1, 1, 1, 1), (1, 1, 1, 1), {}),
    ((0, 3, 5, 5), (2, 3, 3, 3), {}),
    ((1, 3, 13, 17), (7, 3, 5, 5), {"stride": 3, "padding": 2, "dilation": 1}),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES, ids=[f"{x}*{w}-{a}" for x, w, a in CONV_CASES])
def test_conv2d(device, rng, dtype, bias, xs, ws, attrs):
    skip_unless_dtype(device, "conv2d", dtype)
    x, w = random(rng, xs, dtype), random(rng, ws, dtype)
    b = random(rng, (ws[0],), dtype) if bias else None
    out = opr.conv2d(x, w, b, device=device, **attrs)
    check(out, OPS["conv2d"].reference(x, w, b, **attrs), dtype, device)


def test_conv2d_noncontiguous(device, rng):
    xh = random(rng, (2, 3, 9, 9), "float32")
    wh = random(rng, (4, 3, 3, 3), "float32")
    data = device.provider.from_host(np.ascontiguousarray(xh.transpose(0, 1, 3, 2)))
    try:
        x = opr.Tensor._wrap(data.transpose(0, 1, 3, 2), device)
    except Exception as exc:
        pytest.skip(f"{device.name} arrays cannot transpose: {exc}")
    check(opr.conv2d(x, wh, padding=1), OPS["conv2d"].reference(xh, wh, padding=1), "float32", device)


@pytest.mark.parametrize("op, shapes, attrs", [
    ("matmul", [(5,), (5,)], {}),
    ("matmul", [(3, 5), (5,)], {}),
    ("matmul", [(5,), (5, 4)], {}),
    ("conv2d", [(3, 6, 7), (2, 3, 3, 3)], {}),
])
def test_problem_strides_are_those_of_the_reshaped_view(op, shapes, attrs):
    """A strided operand the frontend reshapes (1-D matmul operands, unbatched conv input) is
    described to kernels with the strides of the view they get, never as C-contiguous."""
    dev = opr.Device("cpu")
    rng = np.random.default_rng(0)
    datas = [rng.standard_normal((*s[:-1], 2 * s[-1])).astype(np.float32)[..., ::2] for s in shapes]
    problem, norm, _ = OPS[op].problem(datas, dev, attrs)
    for d, shape, st in zip(datas, norm.shapes, problem.strides):
        view = d.reshape(shape)
        assert st == tuple(x // d.itemsize for x in view.strides)
        assert st != c_strides(shape)  # the step of 2 is kept
    out = getattr(opr, op)(*datas, **attrs).numpy()
    assert rel_err(out, OPS[op].reference(*datas, **attrs)) < TOLERANCE["float32"]


# -- trivial results (finding 4) -------------------------------------------------------------------------
@pytest.mark.parametrize("xs", [(1, 0, 3, 3), (2, 0, 1, 1), (0, 4, 4)], ids=str)
def test_finding_4_conv2d_over_zero_channels_is_a_new_array_of_the_bias(device, xs):
    """Finding 4: conv2d over 0 input channels with a bias returned the caller's bias array
    itself (broadcast), so writing into the result wrote into the bias; it is a new array."""
    o = 2
    w = np.ones((o, 0, 1, 1), np.float32)
    b = np.array([1.5, -2.0], np.float32)
    tb = opr.tensor(b, device=device)
    for bias in (b, tb):
        out = opr.conv2d(np.ones(xs, np.float32), w, bias, device=device)
        want = np.broadcast_to(b.reshape(-1, 1, 1), (o, *xs[-2:]))
        if len(xs) == 4:
            want = np.broadcast_to(want, (xs[0], *want.shape))
        np.testing.assert_array_equal(out.numpy(), want)
        assert out.data is not tb.data and out.device == device
        if device.name == "cpu":
            assert not np.shares_memory(out.data, b) and not np.shares_memory(out.data, tb.data)
        before = out.numpy().copy()
        b[...] = 9  # the caller's bias changes: the result does not
        np.testing.assert_array_equal(out.numpy(), before)
        b[...] = (1.5, -2.0)
    without = opr.conv2d(np.ones(xs, np.float32), w, device=device)
    assert not without.numpy().any() and without.numpy().shape == np.broadcast_shapes(want.shape)
