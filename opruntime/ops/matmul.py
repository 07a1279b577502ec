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

from ..errors import ShapeError, UnknownAttributeError
from ..kernels import Attrs, Problem
from ..tensor import Tensor
from ..typing import ArrayLike, DeviceLike
from .base import Case, Normalized, Operator


def _mm(a: tuple[int, ...], b: tuple[int, ...], views: tuple[str | None, ...] = (), dtype: str = "float32") -> Case:
    return Case((a, b), {}, dtype, views)


class MatMul(Operator):
    name = "matmul"
    operands = ("a", "b")
    bound = "compute"
    #: odd sizes, size-1 dims, 1-D operands, broadcast batch dims, primes past any tile size, and
    #: non-contiguous operands
    cases = [
        _mm((7, 13), (13, 5)), _mm((1, 1), (1, 1)), _mm((13,), (13, 4)), _mm((5, 13), (13,)), _mm((13,), (13,)),
        _mm((3, 7, 13), (13, 5)), _mm((2, 1, 7, 13), (1, 3, 13, 5)), _mm((67, 131), (131, 61)),
        _mm((37, 21), (21, 19), ("T", None)), _mm((37, 21), (21, 19), ("slice", "T")),
    ]
    quick = (0, 6, 9)
    empty = [_mm((0, 5), (5, 3)), _mm((4, 0), (0, 3)), _mm((2, 0, 3), (3, 4))]
    bench = {
        "cpu": [_mm((1024, 1024), (1024, 1024)), _mm((256, 256), (256, 256)), _mm((32, 128, 128), (32, 128, 128))],
        "overhead": [_mm((4, 4), (4, 4))],
        "gpu": [*(_mm((n, n), (n, n)) for n in (1024, 2048, 4096)),
                *(_mm((4096, 4096), (4096, 4096), dtype=dt) for dt in ("float16", "bfloat16"))],
    }
    peers = {
        "numpy": lambda np, a, b: np.matmul(a, b),
        "torch": lambda torch, a, b: torch.matmul(a, b),
        "jax": lambda jax, a, b: jax.numpy.matmul(a, b, precision=jax.lax.Precision.HIGHEST),
        "onnx": lambda: ("MatMul", {}),
    }

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        if attrs:
            raise UnknownAttributeError(f"matmul() got unexpected keyword argument(s) {', '.join(attrs)}; it takes {', '.join(self.attributes)}")
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


@MATMUL.function
def matmul(a: ArrayLike, b: ArrayLike, *, device: DeviceLike = None) -> Tensor:
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
