"""layer_norm, rms_norm and batch_norm: the errors, eps=None per dtype, torch's answers, views at
odd offsets, and every kernel on the operators' whole case tables (the conformance suite's CI slice
takes three cases each)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err, skip_unless_dtype

import opruntime as opr
from opruntime.errors import AttributeValueError, InputTypeError, ShapeError, UnknownAttributeError
from opruntime.ops import OPS
from opruntime.ops.norm import DEFAULT_EPS
from opruntime.plugins import registry
from opruntime.testing import CASES, check_kernel, failures, summary

NORMS = ["layer_norm", "rms_norm", "batch_norm"]


def check(out: opr.Tensor, ref: np.ndarray, dtype: str, device: opr.Device) -> None:
    assert isinstance(out, opr.Tensor) and out.device == device
    assert out.dtype == np.dtype(dtype) or dtype == "bfloat16"
    err = rel_err(np.asarray(out.numpy(), np.float64), ref)
    assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


# -- errors ----------------------------------------------------------------------------------------------
X = np.ones((3, 4, 5), np.float32)


@pytest.mark.parametrize("call,error,match", [
    (lambda: opr.layer_norm(X, 4), ShapeError, r"layer_norm: normalized_shape \(4,\) must be the trailing dims of x \(3, 4, 5\)"),
    (lambda: opr.layer_norm(X, (3, 5)), ShapeError, "must be the trailing dims"),
    (lambda: opr.layer_norm(X, (2, 3, 4, 5)), ShapeError, "must be the trailing dims"),
    (lambda: opr.layer_norm(X, ()), AttributeValueError, "normalized_shape must be an int or a non-empty tuple"),
    (lambda: opr.layer_norm(X, 5.0), AttributeValueError, "normalized_shape must be an int"),
    (lambda: opr.layer_norm(X, (True,)), AttributeValueError, "normalized_shape must be an int"),
    (lambda: opr.layer_norm(X, (-5,)), AttributeValueError, "normalized_shape must be an int"),
    (lambda: opr.layer_norm(X, 5, np.ones(4, np.float32)), ShapeError,
     r"layer_norm: weight must have shape \(5,\) \(normalized_shape\), got \(4,\)"),
    (lambda: opr.layer_norm(X, 5, None, np.ones((1, 5), np.float32)), ShapeError, r"bias must have shape \(5,\)"),
    (lambda: opr.layer_norm(X, (4, 5), np.ones(20, np.float32)), ShapeError, r"weight must have shape \(4, 5\)"),
    (lambda: opr.layer_norm(X, 5, eps=0.0), AttributeValueError, "layer_norm: eps must be a finite number > 0"),
    (lambda: opr.layer_norm(X, 5, eps=-1e-5), AttributeValueError, "eps must be a finite number > 0"),
    (lambda: opr.layer_norm(X, 5, eps=float("nan")), AttributeValueError, "eps must be a finite number > 0"),
    (lambda: opr.layer_norm(X, 5, eps=None), AttributeValueError, "eps must be a finite number > 0"),
    (lambda: opr.layer_norm(X, 5, eps="1e-5"), AttributeValueError, "eps must be a finite number > 0"),
    (lambda: opr.layer_norm(X, 5, eps=True), AttributeValueError, "eps must be a finite number > 0"),
    (lambda: opr.rms_norm(X, 5, eps=0), AttributeValueError, "rms_norm: eps must be a finite number > 0 or None"),
    (lambda: opr.rms_norm(X, 4), ShapeError, "rms_norm: normalized_shape"),
    (lambda: opr.rms_norm(X, 5, np.ones(3, np.float32)), ShapeError, r"rms_norm: weight must have shape \(5,\)"),
    (lambda: opr.batch_norm(np.ones(4, np.float32), np.ones(4, np.float32), np.ones(4, np.float32)), ShapeError,
     r"batch_norm: x must be at least 2-D \(N, C, ...\)"),
    (lambda: opr.batch_norm(X, np.ones(3, np.float32), np.ones(4, np.float32)), ShapeError,
     r"batch_norm: running_mean must have shape \(4,\) \(C=4, the channels of x \(3, 4, 5\)\), got \(3,\)"),
    (lambda: opr.batch_norm(X, np.ones(4, np.float32), np.ones(4, np.float32), None, np.ones(5, np.float32)),
     ShapeError, r"batch_norm: bias must have shape \(4,\)"),
    (lambda: opr.batch_norm(X, None, np.ones(4, np.float32)), InputTypeError, "batch_norm: running_mean is None"),
    (lambda: opr.batch_norm(X, np.ones(4, np.float32), None), InputTypeError, "batch_norm: running_var is None"),
    (lambda: opr.batch_norm(X, np.ones(4, np.float32), np.ones(4, np.float32), eps=0), AttributeValueError,
     "batch_norm: eps must be a finite number > 0"),
    (lambda: opr.layer_norm(X.astype(np.int32), 5), opr.errors.DtypeError, "layer_norm: dtype int32"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_errors_name_the_op_the_operand_and_the_fix(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_unknown_and_missing_attributes():
    with pytest.raises(UnknownAttributeError, match=r"layer_norm\(\) got unexpected keyword argument\(s\) axis"):
        OPS["layer_norm"](X, normalized_shape=5, axis=1)
    with pytest.raises(AttributeValueError, match="layer_norm: normalized_shape is required"):
        OPS["layer_norm"](X)
    with pytest.raises(UnknownAttributeError, match="batch_norm"):
        OPS["batch_norm"](X, X[0, :, 0], X[0, :, 0], momentum=0.1)


# -- eps=None is the dtype's epsilon (rms_norm) --------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_rms_norm_eps_none_is_the_dtype_epsilon(device, rng, dtype):
    """On values of mean square ~1e-4 an epsilon of 9.8e-4 (float16) or 7.8e-3 (bfloat16) changes
    the result by far more than the tolerance: the result must match the dtype's own."""
    skip_unless_dtype(device, "rms_norm", dtype)
    x = random(rng, (6, 96), dtype, scale=1e-2)
    w = random(rng, (96,), dtype)
    host = [a.astype(np.float64) for a in (x, w)]
    want = OPS["rms_norm"].reference(*host, normalized_shape=96, eps=DEFAULT_EPS[dtype])
    out = opr.rms_norm(x, 96, w, device=device)
    check(out, want, dtype, device)
    if dtype in ("float16", "bfloat16"):  # the float64 epsilon's answer is far off: the test can tell
        other = OPS["rms_norm"].reference(*host, normalized_shape=96, eps=DEFAULT_EPS["float64"])
        assert rel_err(other, want) > 10 * TOLERANCE[dtype]


def test_default_eps_is_torch_finfo():
    torch = pytest.importorskip("torch")
    for name, eps in DEFAULT_EPS.items():
        assert eps == torch.finfo(getattr(torch, name)).eps


# -- torch agreement ------------------------------------------------------------------------------------------
TORCH_CASES = [  # (x shape, normalized_shape, weight, bias)
    ((4, 7), 7, True, True), ((2, 3, 8), (3, 8), True, False), ((5, 16), [16], False, True), ((9, 33), (33,), False, False),
]


@pytest.mark.parametrize("xs,ns,has_w,has_b", TORCH_CASES, ids=[str(c) for c in TORCH_CASES])
def test_layer_and_rms_norm_agree_with_torch(device, rng, xs, ns, has_w, has_b):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    nsh = (ns,) if isinstance(ns, int) else tuple(ns)
    x = random(rng, xs, "float32", scale=3.0) + 1.5
    w = random(rng, nsh, "float32") if has_w else None
    b = random(rng, nsh, "float32") if has_b else None
    t = [None if a is None else torch.from_numpy(a) for a in (x, w, b)]
    out = opr.layer_norm(x, ns, w, b, eps=1e-4, device=device)
    check(out, F.layer_norm(t[0].double(), nsh, *(None if a is None else a.double() for a in t[1:]), 1e-4).numpy(),
          "float32", device)
    out = opr.rms_norm(x, ns, w, device=device)
    ref = F.rms_norm(t[0], nsh, t[1]).double().numpy()  # torch's eps=None in float32
    check(out, ref, "float32", device)


def test_batch_norm_agrees_with_torch(device, rng):
    torch = pytest.importorskip("torch")
    for xs, has_w, has_b in (((4, 6), True, True), ((2, 3, 7), False, True), ((2, 5, 4, 3), True, False),
                             ((1, 2, 3, 2, 2), False, False)):
        c = xs[1]
        x = random(rng, xs, "float32")
        mean, var = random(rng, (c,), "float32"), np.abs(random(rng, (c,), "float32")) + 0.5
        w = random(rng, (c,), "float32") if has_w else None
        b = random(rng, (c,), "float32") if has_b else None
        t = [None if a is None else torch.from_numpy(a).double() for a in (x, mean, var, w, b)]
        out = opr.batch_norm(x, mean, var, w, b, eps=1e-3, device=device)
        ref = torch.nn.functional.batch_norm(t[0], t[1], t[2], t[3], t[4], training=False, eps=1e-3).numpy()
        check(out, ref, "float32", device)


def test_weight_none_with_a_bias_is_its_own_plan(device, rng):
    """``weight=None, bias=b`` and ``weight=w`` have the same operand shapes: the plans differ."""
    x, v = random(rng, (5, 12), "float32"), random(rng, (12,), "float32") + 2.0
    host = x.astype(np.float64), v.astype(np.float64)
    for _ in range(2):  # the second round takes the cached plans
        check(opr.layer_norm(x, 12, v, device=device), OPS["layer_norm"].reference(*host, normalized_shape=12),
              "float32", device)
        check(opr.layer_norm(x, 12, None, v, device=device),
              OPS["layer_norm"].reference(host[0], None, host[1], normalized_shape=12), "float32", device)
    m, var = random(rng, (3,), "float32"), np.full(3, 0.5, np.float32)
    xb = random(rng, (2, 3, 4), "float32")
    out = opr.batch_norm(xb, m, var, None, m, device=device)
    ref = (xb - m[:, None]) / np.sqrt(var[:, None] + 1e-5) + m[:, None]
    check(out, ref.astype(np.float64), "float32", device)


# -- special values and sizes ----------------------------------------------------------------------------------
def test_constant_rows_and_nan_rows(device):
    x = np.array([[2.0] * 6, [1.0, 2.0, np.nan, 4.0, 5.0, 6.0], [0.0] * 6], np.float32)
    b = np.arange(6, dtype=np.float32)
    out = opr.layer_norm(x, 6, None, b, device=device).numpy()
    np.testing.assert_array_equal(out[0], b)  # zero variance: (x - mean) is exactly 0
    assert np.isnan(out[1]).all()  # NaN spreads over its row only
    np.testing.assert_array_equal(out[2], b)
    r = opr.rms_norm(x, 6, device=device).numpy()
    assert np.isnan(r[1]).all() and np.isfinite(r[[0, 2]]).all() and (r[2] == 0).all()


@pytest.mark.parametrize("op,shapes,attrs", [
    ("layer_norm", [(3, 0)], {"normalized_shape": 0}), ("layer_norm", [(0, 4), (4,), (4,)], {"normalized_shape": 4}),
    ("rms_norm", [(2, 0, 3), (0, 3)], {"normalized_shape": (0, 3)}), ("batch_norm", [(2, 0, 3), (0,), (0,)], {}),
], ids=str)
def test_size_zero_as_torch(device, op, shapes, attrs):
    args = [np.ones(s, np.float32) for s in shapes]
    out = OPS[op](*args, device=device, **attrs)
    assert out.shape == shapes[0] and out.device == device


# -- views at odd offsets, strided multi-dim inputs -------------------------------------------------------------
def test_views_at_odd_offsets(device, rng):
    """A row view starting 4 bytes past a 16-byte boundary (128-bit kernels take their scalar
    build), a weight view likewise, and a 3-D transposed view normalized over two dims."""
    prov = device.provider
    base, wbase = random(rng, (9, 40), "float32"), random(rng, (33,), "float32")
    try:
        x = prov.from_host(base)[:, 1:33]
        w = prov.from_host(wbase)[1:]
    except Exception as exc:  # noqa: BLE001 - the array type has no such view
        pytest.skip(f"{device.name} arrays cannot make the view: {exc}")
    xt, wt = opr.Tensor._wrap(x, device), opr.Tensor._wrap(w, device)
    host_x, host_w = base[:, 1:33].astype(np.float64), wbase[1:].astype(np.float64)
    check(opr.layer_norm(xt, 32, wt, wt), OPS["layer_norm"].reference(host_x, host_w, host_w, normalized_shape=32),
          "float32", device)
    check(opr.rms_norm(xt, 32, wt), OPS["rms_norm"].reference(host_x, host_w, normalized_shape=32), "float32", device)
    h3 = random(rng, (3, 5, 8), "float32")
    try:
        x3 = prov.from_host(np.ascontiguousarray(h3.transpose(0, 2, 1))).transpose((0, 2, 1))
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"{device.name} arrays cannot make the view: {exc}")
    out = opr.layer_norm(opr.Tensor._wrap(x3, device), (5, 8))
    check(out, OPS["layer_norm"].reference(h3.astype(np.float64), normalized_shape=(5, 8)), "float32", device)


# -- every kernel on the whole case table -------------------------------------------------------------------------
@pytest.mark.parametrize("op", NORMS)
def test_every_kernel_on_every_case(device, op):
    """Every case of the operator's table (the CI conformance slice takes three): on accelerators
    in every dtype, on CPU-side devices in float32 (their other dtypes run in the slice)."""
    kernels = registry().kernels_for(op, device.kind)
    if not kernels:
        pytest.skip(f"no {op} kernel for {device.kind}")
    rng = np.random.default_rng()
    accel = device.provider.accelerator
    findings = []
    for k in kernels:
        findings += check_kernel(k, device, CASES[op], dtypes=None if accel else ["float32"], configs="first", rng=rng)
    bad = failures(findings)
    assert not bad, summary(bad)


@pytest.mark.parametrize("op", NORMS)
def test_every_config_on_two_cases(device, op):
    kernels = registry().kernels_for(op, device.kind)
    if not kernels:
        pytest.skip(f"no {op} kernel for {device.kind}")
    dtype = "float16" if device.provider.accelerator else "float32"
    findings = []
    for k in kernels:
        cases = [CASES[op][i] for i in OPS[op].quick[:2]]
        findings += check_kernel(k, device, cases, dtypes=[dtype], configs="all")
    bad = failures(findings)
    assert not bad, summary(bad)
