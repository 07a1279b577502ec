"""The numerics every test and the conformance suite judge results by (``opruntime.testing.numerics``):
the NaN-aware relative error, the per-dtype tolerances, exact bit equality and the specials."""

from __future__ import annotations

import numpy as np
import pytest

from opruntime.testing.numerics import TOLERANCE, compare, random_array, rel_err, same_bits, with_specials


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
