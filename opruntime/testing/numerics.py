"""Tolerances, the error measure and random operands shared by every opruntime test.

Results are compared with the float64 reference of the *rounded* operands by relative error
``||out - ref|| / ||ref||`` (NaN-aware: NaN / inf positions must match exactly; a NaN where the
reference is finite never passes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels import np_dtype

__all__ = ["TOLERANCE", "np_dtype", "random_array", "rel_err", "compare", "same_bits", "with_specials"]

#: The largest relative error accepted per computation dtype (DESIGN.md, "Testing").
TOLERANCE: dict[str, float] = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    """Random normal values in ``dtype`` (never all zeros, so a kernel that writes nothing fails)."""
    return np.asarray(rng.standard_normal(shape) * scale).astype(np_dtype(dtype))


def rel_err(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 over the finite reference entries.

    Raises:
        AssertionError: shapes differ, or NaN / inf entries of the reference are not matched exactly.
    """
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    special = ~np.isfinite(ref)
    if special.any():
        assert np.array_equal(np.isnan(out[special]), np.isnan(ref[special])), "NaN positions differ from the reference"
        inf = special & ~np.isnan(ref)
        assert np.array_equal(out[inf], ref[inf]), "inf positions differ from the reference"
    o, r = out[~special], ref[~special]
    if not np.isfinite(o).all():
        return float("inf")
    scale = max(np.abs(r).max(initial=0.0), np.abs(o).max(initial=0.0))
    if scale > 1.0:  # norms of values near the float64 limit would overflow
        o, r = o / scale, r / scale
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / denom) if denom else float(np.linalg.norm(o - r))


def compare(out: Any, ref: np.ndarray, dtype: str) -> str | None:
    """None when ``out`` is within ``dtype``'s tolerance of ``ref``, else what is wrong."""
    try:
        err = rel_err(out, ref)
    except AssertionError as exc:
        return str(exc)
    tol = TOLERANCE[dtype]
    if not err <= tol:
        return f"relative error {err:.2e} > {tol:.0e} ({dtype})"
    return None


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact equality including NaN payload positions and signed zeros."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.tobytes(order="C") == b.tobytes(order="C")


def with_specials(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN, +inf, -inf and -0.0 written into its first entries (as many as fit)."""
    x = x.copy()
    flat = x.reshape(-1)
    for i, v in enumerate((np.nan, np.inf, -np.inf, -0.0)[: flat.size]):
        flat[i] = v
    return x
