"""softmax and log_softmax along one axis (any axis; negative counts from the end).

Kernels get ``attrs["axis"]`` as a non-negative int; the output has the input's shape. Rows of
all ``-inf`` give NaN, as the float64 reference (and torch) do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AttributeValueError, ShapeError
from ..kernels import Attrs, Problem
from .base import Normalized, Operator


class Softmax(Operator):
    operands = ("x",)

    def __init__(self, name: str, log: bool) -> None:
        self.name, self.log = name, log

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        (shape,) = shapes
        axis = attrs.pop("axis", -1)
        if attrs:
            raise TypeError(f"{self.name}() got unexpected keyword argument(s) {', '.join(attrs)}")
        if not shape:
            raise ShapeError(f"{self.name}: the input must be at least 1-D, got a 0-D array")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise AttributeValueError(f"{self.name}: axis must be an int, got {axis!r}")
        if not -len(shape) <= axis < len(shape):
            raise AttributeValueError(f"{self.name}: axis {axis} is out of range for a {len(shape)}-D input {shape}; "
                                      f"use -{len(shape)}..{len(shape) - 1}")
        axis = int(axis) % len(shape)
        return Normalized((shape,), Attrs(axis=axis), shape, shape, "empty" if math.prod(shape) == 0 else None)

    def reference(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        x = np.asarray(x, np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            shifted = x - x.max(axis=axis, keepdims=True)
            lse = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
            return shifted - lse if self.log else np.exp(shifted - lse)

    def flops(self, problem: Problem) -> float:
        return 5.0 * math.prod(problem.out_shape)


SOFTMAX = Softmax("softmax", log=False)
LOG_SOFTMAX = Softmax("log_softmax", log=True)


def softmax(x: Any, axis: int = -1, *, device: Any = None) -> Any:
    """``exp(x) / sum(exp(x))`` along ``axis``, computed stably (max subtracted).

    Raises:
        ShapeError: a 0-D input.  AttributeValueError: an axis out of range.
        DtypeError: integer input or a dtype the device cannot compute.
    """
    return SOFTMAX.call((x,), device, (("axis", axis),))


def log_softmax(x: Any, axis: int = -1, *, device: Any = None) -> Any:
    """``x - logsumexp(x)`` along ``axis``, computed stably. Errors as :func:`softmax`."""
    return LOG_SOFTMAX.call((x,), device, (("axis", axis),))
