"""matmul: NumPy's ``matmul`` semantics.

* 1-D ``a`` (K,) is treated as (1, K) and 1-D ``b`` (K,) as (K, 1); the added dim is removed
  from the result. 0-D operands are an error (as in NumPy).
* Batch dims (all but the last two) broadcast.
* Kernels see both operands with the same rank >= 2 (size-1 batch dims prepended as needed), so
  ``a`` is (..., M, K), ``b`` is (..., K, N) and the output (..., M, N) with the broadcast batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..kernels import Attrs, Problem
from .base import Normalized, Operator


class MatMul(Operator):
    name = "matmul"
    operands = ("a", "b")

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        if attrs:
            raise TypeError(f"matmul() got unexpected keyword argument(s) {', '.join(attrs)}")
        sa, sb = shapes
        if not sa or not sb:
            raise ShapeError(f"matmul: operands must be at least 1-D (a {sa}, b {sb}); use multiplication for scalars")
        a = (1, *sa) if len(sa) == 1 else sa
        b = (*sb, 1) if len(sb) == 1 else sb
        if a[-1] != b[-2]:
            raise ShapeError(f"matmul: inner dimensions differ: a {sa} has K={a[-1]} but b {sb} has K={b[-2]}; "
                             f"a's last dim must equal b's {'only' if len(sb) == 1 else 'second-to-last'} dim")
        try:
            batch = np.broadcast_shapes(a[:-2], b[:-2])
        except ValueError:
            raise ShapeError(f"matmul: batch dims {a[:-2]} of a {sa} and {b[:-2]} of b {sb} do not broadcast") from None
        nd = len(batch) + 2
        a = (1,) * (nd - len(a)) + a
        b = (1,) * (nd - len(b)) + b
        out = (*batch, a[-2], b[-1])
        result = (*batch, *([a[-2]] if len(sa) > 1 else []), *([b[-1]] if len(sb) > 1 else []))
        trivial = "empty" if math.prod(out) == 0 else ("zeros" if a[-1] == 0 else None)
        return Normalized((a, b), Attrs(), out, result, trivial)

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))

    def flops(self, problem: Problem) -> float:
        return 2.0 * math.prod(problem.out_shape) * problem.shapes[0][-1]


MATMUL = MatMul()


def matmul(a: Any, b: Any, *, device: Any = None) -> Any:
    """Matrix product with NumPy's ``matmul`` semantics (1-D rules, batched, broadcast batch dims).

    Args:
        a: (..., M, K) or (K,): a Tensor, a native device array or host data.
        b: (..., K, N) or (K,).
        device: run here (host data is placed here; Tensors must already be here).

    Returns:
        A Tensor of shape (broadcast batch..., M, N) minus the dims of 1-D operands, in the
        promoted dtype (``opruntime.ops.base.result_dtype``).

    Raises:
        ShapeError: 0-D operands, different inner dims, batch dims that do not broadcast.
        DtypeError: integer or bool arrays, or a dtype no kernel on the device computes.
        DeviceMismatchError: operands on two devices.
    """
    return MATMUL.call((a, b), device, ())
