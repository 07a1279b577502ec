"""The numerics every test and the conformance suite judge results by (``opruntime.testing.numerics``):
the NaN-aware relative error, the per-dtype tolerances, exact bit equality and the specials."""

from __future__ import annotations

import numpy as np
import pytest

from opruntime.testing.numerics import (
    SENSITIVITY_FACTOR,
    TOLERANCE,
    compare,
    random_array,
    rel_err,
    same_bits,
    sensitivity,
    with_specials,
)


def test_rel_err_is_relative_and_exact_for_equal_arrays():
    ref = np.array([1.0, -2.0, 3.0])
    assert rel_err(ref, ref) == 0.0
    assert rel_err(ref * (1 + 1e-6), ref) == pytest.approx(1e-6)
    assert rel_err(np.zeros(3), np.zeros(3)) == 0.0


def test_rel_err_demands_nan_and_inf_where_the_reference_has_them():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert rel_err(ref.copy(), ref) == 0.0
    with pytest.raises(AssertionError, match="NaN positions differ"):
        rel_err(np.array([0.0, np.inf, -np.inf, 1.0]), ref)
    with pytest.raises(AssertionError, match="inf positions differ"):
        rel_err(np.array([np.nan, -np.inf, -np.inf, 1.0]), ref)
    assert rel_err(np.array([np.nan, np.inf, -np.inf, np.nan]), ref) == float("inf")  # NaN where finite: never passes
    with pytest.raises(AssertionError, match="shape"):
        rel_err(np.ones(3), np.ones(4))


def test_rel_err_of_values_near_the_float64_limit_does_not_overflow():
    ref = np.array([1e308, -1e308])
    assert rel_err(ref * (1 + 1e-9), ref) == pytest.approx(1e-9, rel=1e-3)


def test_compare_uses_the_dtype_tolerance():
    ref = np.ones(10)
    assert compare(ref * (1 + TOLERANCE["float32"] / 2), ref, "float32") is None
    assert "relative error" in compare(ref * (1 + TOLERANCE["float32"] * 2), ref, "float32")
    assert "NaN positions" in compare(np.zeros(2), np.array([np.nan, 1.0]), "float32")
    assert TOLERANCE["float32"] == 1e-5 and 1e-3 <= TOLERANCE["float16"] <= 1e-2 <= TOLERANCE["bfloat16"]


def _sensitivity(reference, operands, dtype, **kw):
    return sensitivity(reference, operands, reference(list(operands)), dtype, **kw)


def _gelu(ops):
    from math import erfc, sqrt

    x = ops[0]
    return x * 0.5 * np.vectorize(erfc)(-x / sqrt(2.0))


def test_sensitivity_of_a_well_conditioned_problem_is_one_unit_of_the_working_precision():
    x = random_array(np.random.default_rng(1), (64,), "float32")
    s = _sensitivity(lambda ops: 2.0 * ops[0].astype(np.float64), [x], "float32")
    assert 2.0**-26 < s <= 2.0**-23
    assert SENSITIVITY_FACTOR * s < TOLERANCE["float32"]  # so a well-conditioned problem keeps the dtype's tolerance
    h = random_array(np.random.default_rng(2), (64,), "float16")
    assert _sensitivity(lambda ops: ops[0].astype(np.float64), [h], "float16") <= 2.0**-11  # the result's own rounding


def test_compare_accepts_the_rounding_an_ill_conditioned_problem_forces_and_nothing_more():
    # gelu at -8: its relative condition is about x**2 = 64, so one float32 unit of x moves it by 64 units
    x = np.full(4, -8.0, np.float32)
    ref = _gelu([x.astype(np.float64)])
    s = _sensitivity(lambda ops: _gelu([ops[0].astype(np.float64)]), [x], "float32")
    assert 32 * 2.0**-24 < s < 128 * 2.0**-23
    off = ref * (1 + 4e-5)  # beyond the dtype's tolerance, within the problem's sensitivity
    assert "relative error" in compare(off, ref, "float32")
    assert compare(off, ref, "float32", lambda: s) is None
    assert "sensitivity" in compare(np.zeros(4), ref, "float32", lambda: s)  # the tail flushed to 0 still fails
    assert "sensitivity" in compare(ref * (1 + 2 * SENSITIVITY_FACTOR * s), ref, "float32", lambda: s)


def test_sensitivity_sees_cancellation_and_a_subnormal_result():
    # a float32 bias that cancels its product: x * w + b moves by units of x * w, not of the result
    x, w, b = np.float32([3.0]), np.float32([0.3]), np.float32([-0.9])
    lin = lambda ops: ops[0].astype(np.float64) * ops[1] + ops[2]  # noqa: E731
    assert _sensitivity(lin, [x, w, b], "float32") > 1e3 * 2.0**-24
    # a float16 mean whose exact value is a float16 subnormal: its rounding alone is a large relative error
    h = np.array([1e-4, -0.99e-4], np.float16)  # float16 normals; their mean is 3.6e-7, 6 subnormal spacings
    mean = lambda ops: np.array([ops[0].astype(np.float64).mean()])  # noqa: E731
    assert 0 < mean([h])[0] < 6.1e-5
    assert _sensitivity(mean, [h], "float16") > TOLERANCE["float16"]


def test_sensitivity_leaves_masks_and_specials_alone():
    seen = []
    x = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    mask = np.array([True, False, True, False])
    _sensitivity(lambda ops: seen.append(ops) or ops[0].astype(np.float64), [x, mask], "float32", draws=3)
    for ops in seen:
        assert ops[1].dtype == bool and np.array_equal(ops[1], mask)
        assert np.array_equal(ops[0][:3], x[:3], equal_nan=True) and ops[0].dtype == np.float32


def test_same_bits_sees_signed_zeros_and_dtypes():
    assert same_bits(np.array([0.0, np.nan]), np.array([0.0, np.nan]))
    assert not same_bits(np.array([0.0]), np.array([-0.0]))
    assert not same_bits(np.zeros(2, np.float32), np.zeros(2, np.float64))


def test_random_arrays_and_specials():
    rng = np.random.default_rng(0)
    x = random_array(rng, (3, 4), "float16", scale=4.0)
    assert x.dtype == np.float16 and x.shape == (3, 4) and x.any()
    s = with_specials(x)
    assert np.isnan(s.flat[0]) and s.flat[1] == np.inf and s.flat[2] == -np.inf and np.signbit(s.flat[3])
    assert same_bits(s.reshape(-1)[4:], x.reshape(-1)[4:]) and not np.isnan(x).any()  # x itself untouched
    assert with_specials(np.ones(2)).tolist()[1] == np.inf  # as many as fit
