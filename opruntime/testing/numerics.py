"""Tolerances, the error measure and random operands shared by every opruntime test.

Results are compared with the float64 reference of the *rounded* operands by relative error
``||out - ref|| / ||ref||`` (NaN-aware: NaN / inf positions must match exactly; a NaN where the
reference is finite never passes), within the dtype's tolerance, or within a multiple of the
problem's own :func:`sensitivity` where the problem is ill-conditioned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..kernels import np_dtype

__all__ = ["TOLERANCE", "SENSITIVITY_FACTOR", "np_dtype", "random_array", "rel_err", "sensitivity", "compare",
           "same_bits", "with_specials"]

#: The largest relative error accepted per computation dtype (DESIGN.md, "Testing").
TOLERANCE: dict[str, float] = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
#: The precision a kernel computes each dtype in (half types accumulate in float32).
WORKING: dict[str, str] = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}
#: A result is also accepted within this many times its problem's :func:`sensitivity`.
SENSITIVITY_FACTOR = 16.0


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


def sensitivity(reference: Callable[[list[np.ndarray]], np.ndarray], operands: Sequence[np.ndarray], exact: Any,
                dtype: str, draws: int = 2) -> float:
    """The relative error a correct kernel computing ``dtype`` may have on this very problem.

    The larger of two measures, both of the exact (float64) result ``exact = reference(operands)``:

    - how far it moves when every floating operand moves by one unit in the last place of the
      working precision (``WORKING``), each in a random direction (the larger of ``draws`` such
      moves). Rounding an intermediate to the working precision moves the result as much: a bias
      that cancels its product, gelu far in its tail (its relative condition is about ``x**2``),
      a sum whose terms cancel;
    - the rounding of the exact result to ``dtype`` itself: a float16 subnormal is coarse.

    For a well-conditioned problem this is a few units of the working precision, far below
    ``TOLERANCE``. Non-finite operands and boolean masks are left as they are.
    """
    rng = np.random.default_rng(0)
    ref = np.asarray(exact, np.float64)
    work = np_dtype(WORKING[dtype])
    worst = 0.0
    for _ in range(draws):
        moved = []
        for a in operands:
            if a is None or not (a.dtype.kind == "f" or a.dtype.name == "bfloat16"):
                moved.append(a)
                continue
            w = np.asarray(a, work)
            step = np.where(rng.random(w.shape) < 0.5, -np.inf, np.inf).astype(work)
            moved.append(np.where(np.isfinite(w), np.nextafter(w, step), w).astype(a.dtype))
        worst = max(worst, _finite_rel(reference(moved), ref))
    rounded = ref.astype(np_dtype(dtype)).astype(np.float64)
    return max(worst, _finite_rel(rounded, ref))


def _finite_rel(out: Any, ref: np.ndarray) -> float:
    """rel_err over the entries where both are finite (an overflow in the moved problem is no measure)."""
    out = np.asarray(out, np.float64)
    keep = np.isfinite(out) & np.isfinite(ref)
    return rel_err(out[keep], ref[keep]) if keep.any() else 0.0


def compare(out: Any, ref: np.ndarray, dtype: str, sensitivity_of: Callable[[], float] | None = None) -> str | None:
    """None when ``out`` is within ``dtype``'s tolerance of ``ref``, else what is wrong.

    Args:
        sensitivity_of: gives the problem's :func:`sensitivity` (called only when the tolerance is
            exceeded): a result within ``SENSITIVITY_FACTOR`` times it also passes.
    """
    try:
        err = rel_err(out, ref)
    except AssertionError as exc:
        return str(exc)
    tol = TOLERANCE[dtype]
    if err <= tol:
        return None
    if sensitivity_of is None:
        return f"relative error {err:.2e} > {tol:.0e} ({dtype})"
    cond = sensitivity_of()
    if err <= SENSITIVITY_FACTOR * cond:
        return None
    return f"relative error {err:.2e} > {tol:.0e} ({dtype}) and > {SENSITIVITY_FACTOR:g} x the problem's sensitivity {cond:.1e}"


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
