"""linear: ``x @ weight.T + bias (+ residual)``, then an activation, as ``torch.nn.functional.linear``.

* ``x`` is (..., in_features), at least 1-D; ``weight`` is (out_features, in_features);
  ``bias`` is (out_features,) or None. The result is (..., out_features); a 1-D ``x`` gives
  (out_features,).
* ``residual`` (keyword-only) is None or an array of the result's shape, added before the
  activation: a transformer's ``x + proj(h)`` or a ResNet block's ``relu(conv(h) + x)`` in the
  GEMM's epilogue (cuBLASLt's ``D = act(A B + C + bias)``), not a separate add over the output.
* ``activation`` is None or one of ``"relu"``, ``"gelu"``, ``"gelu_tanh"``, ``"silu"``
  (:data:`~opruntime.ops.base.EPILOGUES`), applied to ``x @ weight.T + bias (+ residual)`` as the
  kernel's epilogue: no second pass over the output.

Kernels see ``x`` as rows: (M, K) with M the product of its leading dims (1 for a 1-D ``x``; a
view when the leading dims allow one), ``weight`` (N, K), then ``bias`` (N,) and ``residual``
(M, N) when present (a bias left out is not passed: ``linear(x, w, residual=r)`` gives a kernel
``x, w, r``), and ``attrs``: ``activation`` (None or a name), ``bias`` and ``residual`` (bools).
The output is (M, N).
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
from .base import ACTIVATIONS, Case, Normalized, Operator, activation_attr, jax_activation, torch_activation

#: the hidden attribute :meth:`Linear.adapt` adds when a residual is passed without a bias (the
#: kernels then get ``x, w, residual``); part of the plan-cache key
RESIDUAL_ONLY = "_residual_only"


def _ln(x: tuple[int, ...], n: int, bias: bool = True, activation: str | None = None,
        views: tuple[str | None, ...] = (), dtype: str = "float32", residual: bool = False) -> Case:
    k = x[-1]
    shapes = (x, (n, k), (n,)) if bias else (x, (n, k))
    if residual:  # a Case passes its operands in order: a residual case has a bias
        shapes = (*shapes, (*x[:-1], n))
    return Case(shapes, {"activation": activation}, dtype, views)


def _numpy_peer(np: Any, x: Any, weight: Any, bias: Any = None, residual: Any = None,
                activation: str | None = None) -> Any:
    """NumPy's (or CuPy's) matmul, bias add, residual add and activation, each a pass of its own."""
    y = x @ weight.T
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    if activation is None:
        return y
    if activation == "relu":
        return np.maximum(y, 0)
    if activation == "silu":
        return y / (1 + np.exp(-y))
    if activation == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))
    return NotImplemented  # exact gelu needs erf, which NumPy lacks


def _torch_peer(torch: Any, x: Any, weight: Any, bias: Any = None, residual: Any = None,
                activation: str | None = None) -> Any:
    """``F.linear``, then ``+ residual`` and the activation, as a torch user writes them."""
    y = torch.nn.functional.linear(x, weight, bias)
    return torch_activation(torch, activation, y if residual is None else y + residual)


def _jax_peer(jax: Any, x: Any, weight: Any, bias: Any = None, residual: Any = None,
              activation: str | None = None) -> Any:
    y = jax.numpy.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST)
    y = y if bias is None else y + bias
    return jax_activation(jax, activation, y if residual is None else y + residual)


def _onnx_peer(activation: str | None = None) -> Any:
    """ONNX's Gemm with transB (2-D x only; no activation: that would be a second node; with a
    residual the operands are four, which a Gemm node does not take: the bench skips those)."""
    return None if activation is not None else ("Gemm", {"transB": 1})


class Linear(Operator):
    name = "linear"
    operands = ("x", "weight", "bias", "residual")
    required = 2
    bound = "compute"
    #: 1-D / 2-D / 3-D x, odd sizes, size-1 dims, bias on and off, every activation, strided x,
    #: weight and bias (a transposed weight is the (in, out) layout a matmul would take)
    cases = [
        _ln((7, 13), 5, False),
        _ln((7, 13), 5, True, "relu"),
        _ln((13,), 5, True, "gelu"),
        _ln((2, 3, 13), 6, True, "gelu_tanh"),
        _ln((1, 1), 1, True, "silu"),
        _ln((4, 1, 16), 1, False, "gelu"),
        _ln((67, 131), 61, True, "gelu"),
        _ln((37, 21), 19, True, "relu", ("T", None)),
        _ln((37, 21), 19, True, "silu", ("slice", "T", "slice")),
        _ln((2, 5, 24), 16, False, "gelu_tanh", ("slice", "slice")),
        _ln((33, 64), 40, True, None, (None, "T")),
        _ln((2, 9, 24), 17, True, None, residual=True),
        _ln((67, 131), 61, True, "relu", residual=True),
        _ln((37, 21), 19, True, "gelu_tanh", (None, "T", None, "T"), residual=True),
        _ln((13,), 5, True, "silu", ("slice", None, "slice", "slice"), residual=True),
        _ln((1, 1), 1, True, "gelu", residual=True),
    ]
    quick = (1, 3, 7, 12)
    empty = [_ln((0, 5), 3), _ln((4, 0), 3, True, "gelu"), _ln((2, 0, 5), 4, False, "relu"), _ln((3, 5), 0),
             _ln((4, 0), 3, True, "relu", residual=True), _ln((0, 5), 3, True, None, residual=True)]
    bench = {
        "cpu": [_ln((1024, 1024), 1024, True, "gelu")],
        "overhead": [_ln((4, 4), 4, True, "relu")],
        "gpu": [_ln((4096, 4096), 4096, True, "gelu", dtype="float16"),
                _ln((4096, 4096), 4096, True, "gelu_tanh", dtype="float16"),
                _ln((4096, 4096), 4096, True, None, dtype="float16"),
                _ln((4096, 4096), 4096, True, "gelu")],
    }
    peers = {"numpy": _numpy_peer, "torch": _torch_peer, "jax": _jax_peer, "onnx": _onnx_peer}

    def call(self, inputs: tuple[Any, ...], device: Any, attrs: tuple[tuple[str, Any, Any], ...]) -> Tensor:
        inputs, attrs = self.adapt(inputs, attrs)
        return super().call(inputs, device, attrs)

    def adapt(self, inputs: tuple[Any, ...], attrs: tuple[tuple[str, Any, Any], ...]) -> tuple[tuple[Any, ...], tuple]:
        """A residual without a bias: the bias's None left out, :data:`RESIDUAL_ONLY` says so."""
        if len(inputs) == 4 and inputs[2] is None:
            return (inputs[0], inputs[1], inputs[3]), (*attrs, (RESIDUAL_ONLY, True, bool))
        return inputs, attrs

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        sx, sw = tuple(shapes[0]), tuple(shapes[1])
        residual_only = bool(attrs.pop(RESIDUAL_ONLY, False))
        rest = [tuple(s) for s in shapes[2:]]
        sr = rest.pop() if len(rest) == 2 or (rest and residual_only) else None
        sb = rest[0] if rest else None
        activation = activation_attr("linear", attrs.pop("activation", None))
        if attrs:
            raise UnknownAttributeError(f"linear() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                        f"it takes {', '.join(self.attributes)}")
        if not sx:
            raise ShapeError("linear: x must be at least 1-D (..., in_features), got a 0-D array")
        if len(sw) != 2:
            raise ShapeError(f"linear: weight must be 2-D (out_features, in_features), got shape {sw}")
        n, k = sw
        if sx[-1] != k:
            raise ShapeError(f"linear: x {sx} has in_features={sx[-1]} (its last dim) but weight {sw} has "
                             f"in_features={k} (its second dim); weight must be (out_features, in_features), "
                             f"as torch.nn.functional.linear takes it (transpose a (in, out) matrix first)")
        if sb is not None and sb != (n,):
            raise ShapeError(f"linear: bias must have shape ({n},) to match weight {sw} (out_features={n}), got {sb}")
        m = math.prod(sx[:-1])
        out = (m, n)
        result = (*sx[:-1], n)
        if sr is not None and sr != result:
            raise ShapeError(f"linear: residual must have the result's shape {result} (x {sx} with its last dim "
                             f"replaced by out_features={n}), got {sr}; broadcast it first (opr.add after the "
                             f"linear adds a broadcast operand)")
        trivial = "empty" if m * n == 0 else ("zeros" if k == 0 else None)
        shapes_n = ((m, k), sw) + ((sb,) if sb is not None else ()) + (((m, n),) if sr is not None else ())
        return Normalized(shapes_n, Attrs(activation=activation, bias=sb is not None, residual=sr is not None),
                          out, result, trivial)

    def reference(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                  residual: np.ndarray | None = None, activation: str | None = None, **hidden: Any) -> np.ndarray:
        if hidden.get(RESIDUAL_ONLY):
            bias, residual = None, bias
        y = np.matmul(np.asarray(x, np.float64), np.asarray(weight, np.float64).T)
        if bias is not None:
            y = y + np.asarray(bias, np.float64)
        if residual is not None:
            y = y + np.asarray(residual, np.float64).reshape(y.shape)
        if activation is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                y = ACTIVATIONS[activation](y)
        return np.asarray(y, np.float64)

    def flops(self, problem: Problem) -> float:
        m, k = problem.shapes[0]
        return 2.0 * m * problem.shapes[1][0] * k

    def trivial_result(self, problem: Problem, result_shape: tuple[int, ...], trivial: str, datas: Sequence[Any],
                       provider: Any) -> Any:
        """Over zero input features the result is ``activation(bias + residual)`` (a new array),
        zeros without either."""
        attrs = problem.attrs
        if trivial == "empty" or not (attrs["bias"] or attrs["residual"]):
            return super().trivial_result(problem, result_shape, trivial, datas, provider)
        y = np.zeros(result_shape)
        rest = [provider.to_host(d).astype(np.float64) for d in datas[2:]]
        if attrs["bias"]:
            y = y + rest[0]
        if attrs["residual"]:
            y = y + rest[-1].reshape(result_shape)
        if attrs["activation"] is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                y = ACTIVATIONS[attrs["activation"]](y)
        return provider.from_host(np.asarray(y, dtype=np.dtype(datas[0].dtype)))


LINEAR = Linear()


@LINEAR.function
def linear(x: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None, activation: str | None = None, *,
           residual: ArrayLike | None = None, device: DeviceLike = None) -> Tensor:
    """``x @ weight.T + bias (+ residual)``, then ``activation``, as ``torch.nn.functional.linear``
    (then the add and the activation's function) would compute them, in one kernel where the
    device has one.

    Args:
        x: (..., in_features): a Tensor, a native device array or host data.
        weight: (out_features, in_features).
        bias: (out_features,) or None.
        activation: None, ``"relu"``, ``"gelu"`` (exact, erf), ``"gelu_tanh"`` (the tanh
            approximation) or ``"silu"``: applied to the biased product (and residual) as a fused
            epilogue.
        residual: None or an array of the result's shape (..., out_features), added before the
            activation, in the epilogue: ``linear(h, w, b, residual=x)`` is a transformer's
            ``x + linear(h, w, b)`` without a second pass over the result.
        device: run here.

    Example:
        >>> y = opr.linear(h, w_proj, b_proj, residual=x)   # x + h @ w_proj.T + b_proj

    Returns:
        A Tensor (..., out_features) (``(out_features,)`` for a 1-D ``x``), in the promoted dtype.

    Raises:
        ShapeError: a 0-D x, a weight that is not 2-D, in_features that differ, a bias or a
            residual of the wrong shape.
        AttributeValueError: an unknown activation.
        DtypeError: integer or bool operands.
        DeviceMismatchError: operands on different devices.
    """
