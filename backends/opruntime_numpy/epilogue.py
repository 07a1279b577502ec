"""The activation epilogues on the CPU, by the frontend's activation name
(``opruntime.ops.base.ACTIVATIONS``; None is no epilogue): ``activate(name, y)`` applies one to
the float array ``y`` in place, with ufuncs writing into ``y`` (gelu, silu and sigmoid need one
temporary of ``y``'s size). NaN stays NaN.

SciPy (for gelu's ``erfc``) is imported where gelu is applied, not at module import: importing
``scipy.special`` costs about 0.15 s, and the numpy backend is loaded by every first call on ``cpu``."""

from __future__ import annotations

import numpy as np


def activate(name: str | None, y: np.ndarray) -> np.ndarray:
    """Apply activation ``name`` to ``y`` in place and return ``y``."""
    if name is None:
        return y
    if name == "relu":
        np.maximum(y, y.dtype.type(0), out=y)  # maximum keeps NaN
    elif name == "gelu":  # 0.5 x erfc(-x / sqrt 2): 1 + erf would cancel for negative x
        from scipy.special import erfc  # lazily: see the module's docstring

        t = erfc(y * y.dtype.type(-0.70710678118654752440))
        y *= t
        y *= y.dtype.type(0.5)
    elif name == "gelu_tanh":  # x / (1 + exp(-2u)) = 0.5 x (1 + tanh u), without the cancellation
        t = y * y
        t *= y.dtype.type(0.044715)
        t += 1
        t *= y
        t *= y.dtype.type(-1.5957691216057307118)  # -2 sqrt(2 / pi)
        with np.errstate(over="ignore"):
            np.exp(t, out=t)
        t += 1
        y /= t
    elif name in ("silu", "sigmoid"):
        t = np.negative(y)
        with np.errstate(over="ignore"):
            np.exp(t, out=t)
        t += 1
        if name == "silu":
            y /= t
        else:
            np.reciprocal(t, out=y)
    elif name == "tanh":
        np.tanh(y, out=y)
    else:
        raise ValueError(f"unknown activation {name!r}")
    return y
