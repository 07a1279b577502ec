"""Numerics at the edges, on every device: NaN and Inf propagate as NumPy's float64 computation
of the same values does; softmax of rows of -inf, of huge values, of length 1; matmul with K = 0;
integer inputs rejected (arrays) or promoted (Python lists), as ``opruntime/ops/base.py`` says.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import dtypes_on, skip_unless_dtype

import opruntime as opr
from opruntime.errors import DtypeError
from opruntime.ops import OPS
from opruntime.testing import TOLERANCE, np_dtype, rel_err

DTYPES = ["float16", "bfloat16", "float32", "float64"]
HUGE = {"float16": 6e4, "bfloat16": 3e38, "float32": 3e38, "float64": 1e308}


def check(out: opr.Tensor, ref: np.ndarray, dtype: str, device: opr.Device) -> None:
    """Within tolerance of the reference rounded to the result dtype (where a value the dtype
    cannot hold, e.g. log_softmax -1.2e5 in float16, is -inf); NaN / inf positions match exactly."""
    assert out.device == device and out.dtype == np_dtype(dtype), (out.device, out.dtype)
    with np.errstate(over="ignore"):
        ref = ref.astype(np_dtype(dtype)).astype(np.float64)
    err = rel_err(out.numpy(), ref)
    assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


def host(values, dtype: str) -> np.ndarray:
    return np.asarray(values, np.float64).astype(np_dtype(dtype))


def reference(op: str, *arrays: np.ndarray, **attrs) -> np.ndarray:
    return OPS[op].reference(*[a.astype(np.float64) for a in arrays], **attrs)


# -- softmax / log_softmax --------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_special_rows(device, op, dtype):
    skip_unless_dtype(device, op, dtype)
    inf, nan, big = np.inf, np.nan, HUGE[dtype]
    x = host([
        [-inf, -inf, -inf, -inf],  # every entry -inf: NaN (0/0), as the reference and torch
        [0.5, -inf, 2.0, -inf],  # some -inf: probability 0 (log: -inf) there
        [big, big, -big, 0.0],  # huge values: no overflow, the max is subtracted first
        [-big, -big, -big, -big],  # huge negative, all equal: uniform
        [1.0, nan, 2.0, 3.0],  # NaN anywhere: the row is NaN
        [1.0, inf, 2.0, 3.0],  # +inf: inf - inf = NaN at the max, as NumPy computes it
        [big, -big, big / 2, 1.0],
        [0.0, 0.0, 0.0, 0.0],
    ], dtype)
    for axis in (1, 0):  # along rows, and along columns (a strided reduction)
        out = getattr(opr, op)(x, axis=axis, device=device)
        check(out, reference(op, x, axis=axis), dtype, device)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,axis", [((1,), 0), ((5, 1), 1), ((1, 5), 0), ((3, 1, 4), 1), ((1,), -1)])
def test_softmax_length_one(device, op, shape, axis):
    x = host(np.random.default_rng().standard_normal(shape) * 100, "float32")
    out = getattr(opr, op)(x, axis=axis, device=device)
    want = np.zeros(shape) if op == "log_softmax" else np.ones(shape)
    assert np.array_equal(out.numpy(), want), out.numpy()
    special = host([[-np.inf], [np.inf], [np.nan], [3e38]], "float32")  # length-1 rows of specials
    check(getattr(opr, op)(special, axis=1, device=device), reference(op, special, axis=1), "float32", device)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_long_row_of_huge_values(device, op):
    x = np.full((2, 5000), 3e38, np.float32)
    x[1, ::7] = -3e38
    check(getattr(opr, op)(x, device=device), reference(op, x, axis=-1), "float32", device)


# -- matmul ---------------------------------------------------------------------------------------------
NUMPY_WARNS = pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")  # as NumPy does


@NUMPY_WARNS
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_nan_and_inf_propagate(device, dtype):
    skip_unless_dtype(device, "matmul", dtype)
    rng = np.random.default_rng()
    a = host(rng.standard_normal((9, 11)), dtype)
    b = host(rng.uniform(0.5, 2.0, (11, 7)) * rng.choice([-1, 1], (11, 7)), dtype)  # never zero
    a[1, 3] = np.nan  # row 1 all NaN
    a[4, 0] = np.inf  # row 4: +/-inf by the signs of b[0]
    a[6, 2], a[6, 5] = np.inf, -np.inf  # row 6: inf - inf = NaN where the signs agree
    b[8, 2] = np.nan  # column 2 all NaN
    check(opr.matmul(a, b, device=device), reference("matmul", a, b), dtype, device)


@NUMPY_WARNS
def test_matmul_inf_times_zero_is_nan(device):
    a = host([[np.inf, 1.0], [2.0, 3.0]], "float32")
    b = host([[0.0, 1.0], [1.0, 1.0]], "float32")
    ref = reference("matmul", a, b)
    assert np.isnan(ref[0, 0]) and ref[0, 1] == np.inf
    check(opr.matmul(a, b, device=device), ref, "float32", device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", [((4, 0), (0, 3)), ((0,), (0,)), ((2, 5, 0), (0, 6)), ((3, 1, 2, 0), (4, 0, 5))])
def test_matmul_k_zero_is_zeros(device, dtype, sa, sb):
    skip_unless_dtype(device, "matmul", dtype)
    a, b = np.zeros(sa, np_dtype(dtype)), np.zeros(sb, np_dtype(dtype))
    out = opr.matmul(a, b, device=device)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == want.shape and out.dtype == np_dtype(dtype)
    assert np.array_equal(np.asarray(out.numpy(), np.float64), want)  # exactly +0.0, no garbage


# -- conv2d ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_nan_and_inf_in_the_input_propagate(device, dtype):
    skip_unless_dtype(device, "conv2d", dtype)
    rng = np.random.default_rng()
    x = host(rng.standard_normal((1, 2, 9, 9)), dtype)
    w = host(rng.uniform(0.5, 2.0, (3, 2, 3, 3)), dtype)  # positive: one inf gives +inf, never inf - inf
    x[0, 0, 1, 1] = np.nan
    x[0, 1, 6, 6] = np.inf
    for attrs in ({}, {"padding": 1}, {"stride": 2, "padding": 1}, {"dilation": 2}):
        out = opr.conv2d(x, w, device=device, **attrs)
        ref = reference("conv2d", x, w, **attrs)
        assert np.isnan(ref).any() and np.isinf(ref).any() and np.isfinite(ref).any()
        check(out, ref, dtype, device)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0 * inf, as NumPy says
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("attrs", [{"padding": 1}, {"padding": 2, "stride": 2}, {"padding": "same", "dilation": 2},
                                   {"padding": (0, 2)}, {"padding": 1, "groups": 2}], ids=lambda a: str(a))
@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
def test_finding_6_conv2d_specials_at_padded_taps(device, dtype, attrs, special):
    """Finding 6: a kernel that skipped the padded taps (instead of multiplying them by the zero
    padding) gave finite values where the float64 reference has NaN (``0 * inf``): an inf or NaN
    weight over padding gives NaN exactly where the reference does, on every device."""
    skip_unless_dtype(device, "conv2d", dtype)
    rng = np.random.default_rng()
    x = host(rng.uniform(0.5, 2.0, (1, 2, 6, 7)), dtype)  # positive and finite: the NaNs come from the padding
    w = host(rng.uniform(0.5, 2.0, (2, 2 // attrs.get("groups", 1), 3, 3)), dtype)
    w[0, 0, 0, 0] = special  # the top-left tap: over the padding for the first output row and column
    w[1, -1, 2, 1] = special  # a bottom tap of the other output channel
    ref = reference("conv2d", x, w, **attrs)
    assert np.isnan(ref).any()
    if not np.isnan(special):
        assert np.isinf(ref).any()  # and inf where the tap meets the data
    check(opr.conv2d(x, w, device=device, **attrs), ref, dtype, device)


# -- the dtype rule -----------------------------------------------------------------------------------------
INT_ARRAYS = [np.arange(6, dtype=np.int32).reshape(2, 3), np.ones((2, 3), np.int64), np.ones((2, 3), np.uint8),
              np.ones((2, 3), bool), np.ones((2, 3), np.complex64)]


@pytest.mark.parametrize("x", INT_ARRAYS, ids=lambda x: str(x.dtype))
@pytest.mark.parametrize("op", ["matmul", "softmax", "log_softmax", "conv2d"])
def test_non_float_arrays_are_rejected(device, op, x):
    args = {"matmul": (x, x.T), "conv2d": (x.reshape(1, 1, 2, 3), x[:1, :1].reshape(1, 1, 1, 1))}.get(op, (x,))
    with pytest.raises(DtypeError, match=f"{op}: dtype {x.dtype.name} is not supported"):
        getattr(opr, op)(*args, device=device)


def test_non_float_tensors_are_rejected(device):
    t = opr.tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    with pytest.raises(DtypeError, match="int32"):
        opr.softmax(t)


def test_mixed_int_array_and_float_array_rejected(device):
    with pytest.raises(DtypeError):
        opr.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.int32), device=device)


def test_python_int_lists_become_float32(device):
    out = opr.matmul([[1, 2], [3, 4]], [[5], [6]], device=device)
    assert out.dtype == np.float32 and np.array_equal(out.numpy(), [[17], [39]])
    sm = opr.softmax([1, 2, 3], device=device)
    assert sm.dtype == np.float32
    check(sm, reference("softmax", np.array([1.0, 2, 3]), axis=-1), "float32", device)
    conv = opr.conv2d([[[[1, 2], [3, 4]]]], [[[[1]]]], device=device)
    assert conv.dtype == np.float32 and np.array_equal(conv.numpy(), [[[[1, 2], [3, 4]]]])


def test_python_int_list_with_a_float32_array_stays_float32(device):
    out = opr.matmul(np.eye(2, dtype=np.float32), [[1, 2], [3, 4]], device=device)
    assert out.dtype == np.float32 and np.array_equal(out.numpy(), [[1, 2], [3, 4]])


def test_python_float_lists_are_float64_as_numpy(device):
    if "float64" not in dtypes_on(device, "softmax"):
        with pytest.raises(DtypeError, match="float64"):
            opr.softmax([1.0, 2.0], device=device)
        return
    out = opr.softmax([1.0, 2.0], device=device)
    assert out.dtype == np.float64
