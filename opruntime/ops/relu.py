"""relu: ``max(x, 0)`` elementwise, as ``torch.nn.functional.relu``.

Any shape (0-D included); the result has the input's shape and dtype. NaN stays NaN (as torch
and NumPy's ``maximum``); ``-0.0`` gives ``0.0`` or ``-0.0`` alike (both compare equal to zero).
Kernels see the input as it is (any strides) and return a new array of its shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UnknownAttributeError
from ..kernels import Attrs, Problem
from ..tensor import Tensor
from .base import Case, Normalized, Operator


def _r(shape: tuple[int, ...], views: tuple[str | None, ...] = (), dtype: str = "float32") -> Case:
    return Case((shape,), {}, dtype, views)


class Relu(Operator):
    name = "relu"
    operands = ("x",)
    bound = "memory"
    #: 0-D, size-1 and odd sizes, lengths past any vector width, and strided views
    cases = [_r(()), _r((1,)), _r((7,)), _r((3, 5)), _r((2, 3, 1, 5)), _r((1031,)), _r((33, 65)),
             _r((24, 40), ("T",)), _r((6, 40), ("slice",))]
    quick = (2, 4, 8)
    empty = [_r((0,)), _r((3, 0, 2))]
    bench = {
        "cpu": [_r((4096, 1024))],
        "overhead": [_r((16,))],
        "gpu": [_r((8192, 8192)), _r((8192, 8192), dtype="float16")],
    }
    peers = {
        "numpy": lambda np, x: np.maximum(x, 0),
        "torch": lambda torch, x: torch.nn.functional.relu(x),
        "jax": lambda jax, x: jax.nn.relu(x),
        "onnx": lambda: ("Relu", {}),
    }

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        if attrs:
            raise UnknownAttributeError(f"relu() got unexpected keyword argument(s) {', '.join(attrs)}; it takes none")
        (shape,) = shapes
        return Normalized((tuple(shape),), Attrs(), tuple(shape), tuple(shape),
                          "empty" if math.prod(shape) == 0 else None)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(np.asarray(x, np.float64), 0.0)

    def flops(self, problem: Problem) -> float:
        return float(math.prod(problem.out_shape))


RELU = Relu()


@RELU.function
def relu(x: Any, *, device: Any = None) -> Tensor:
    """``max(x, 0)`` elementwise, as ``torch.nn.functional.relu``.

    Args:
        x: any shape: a Tensor, a native device array or host data.
        device: run here.

    Returns:
        A Tensor of ``x``'s shape and dtype.

    Raises:
        DtypeError: integer input or a dtype no kernel on the device computes.
    """
