"""layer_norm, rms_norm and batch_norm (inference), as ``torch.nn.functional``.

* ``layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5)``: each row of the trailing
  dims ``normalized_shape`` (an int or a tuple; they must be ``x``'s last dims) made to mean 0 and
  variance 1 (the biased variance), then ``* weight + bias`` (both of ``normalized_shape``).
* ``rms_norm(x, normalized_shape, weight=None, eps=None)``: ``x / sqrt(mean(x**2) + eps) * weight``
  over the same trailing dims; ``eps=None`` is the computation dtype's machine epsilon, as torch
  (:data:`DEFAULT_EPS`: float16 9.77e-4, bfloat16 7.81e-3, float32 1.19e-7, float64 2.22e-16).
* ``batch_norm(x, running_mean, running_var, weight=None, bias=None, eps=1e-5)``: ``x`` is
  (N, C, ...) and the four vectors are (C,); per channel ``(x - mean) / sqrt(var + eps) * weight +
  bias`` (inference only: the running statistics are used, never updated).

``eps`` is a finite number > 0. ``weight=None`` with a ``bias`` is allowed (as torch).

Kernels see every operand in the shape it was given (no reshape: a strided view stays a view,
which some array types cannot reshape), the result in ``x``'s shape, and ``attrs``: ``eps`` (a
float; ``None`` for rms_norm's default, which the kernel resolves with :data:`DEFAULT_EPS` of
``problem.dtype``), ``weight`` and ``bias`` (bools: which optional operands follow ``x`` (and the
running statistics), in the operand order), and for layer_norm / rms_norm ``dims``: how many
trailing dims of ``x`` are normalized (rows: the product of the others, cols: of these). batch_norm's
channels are ``x``'s dim 1 and its spatial size the product of the dims after it (1 for 2-D ``x``).
The float64 reference of rms_norm with ``eps=None`` uses float64's epsilon: it sees float64 arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AttributeValueError, InputTypeError, ShapeError, UnknownAttributeError
from ..kernels import Attrs, Problem
from ..tensor import Tensor
from ..typing import ArrayLike, DeviceLike, ShapeLike
from .base import Case, Normalized, Operator

#: rms_norm's ``eps=None``: the machine epsilon of the computation dtype (``torch.finfo(dtype).eps``).
DEFAULT_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}

#: the hidden attribute the public functions add when ``weight`` is None but ``bias`` is given
BIAS_ONLY = "_bias_only"


def default_eps(dtype: str) -> float:
    """rms_norm's epsilon for ``eps=None`` in ``dtype`` (a dtype name)."""
    return DEFAULT_EPS[dtype]


# -- attribute checks --------------------------------------------------------------------------------
def _normalized_shape(op: str, value: Any) -> tuple[int, ...]:
    """An int or a non-empty sequence of ints >= 0, as a tuple."""
    def is_int(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if is_int(value):
        dims: Any = (value,)
    elif isinstance(value, (tuple, list)) or type(value).__name__ == "Size":  # torch.Size is a tuple
        dims = tuple(value)
    else:
        dims = None
    if dims is None or not dims or not all(is_int(d) and d >= 0 for d in dims):
        raise AttributeValueError(
            f"{op}: normalized_shape must be an int or a non-empty tuple of ints >= 0 (the trailing dims of x "
            f"to normalize over), got {value!r}; e.g. normalized_shape=x.shape[-1]")
    return tuple(int(d) for d in dims)


def _eps(op: str, value: Any, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        none = " or None (the dtype's epsilon)" if allow_none else ""
        raise AttributeValueError(f"{op}: eps must be a finite number > 0{none}, got {value!r}; e.g. eps=1e-5")
    return float(value)


def _unknown(op: Operator, attrs: dict[str, Any]) -> None:
    if attrs:
        raise UnknownAttributeError(f"{op.name}() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                    f"it takes {', '.join(op.attributes)}")


def _vector_shapes(op: str, names: Sequence[str], shapes: Sequence[tuple[int, ...]], want: tuple[int, ...],
                   what: str) -> None:
    for name, shape in zip(names, shapes):
        if tuple(shape) != want:
            raise ShapeError(f"{op}: {name} must have shape {want} ({what}), got {tuple(shape)}")


class _Optional(Operator):
    """An operator whose last two operands are ``weight`` and ``bias``, either may be None.

    The public function leaves out trailing operands given as None; a ``weight=None`` followed by
    a ``bias`` is left out here and named by the hidden attribute :data:`BIAS_ONLY` (part of the
    plan-cache key), so kernels see the operands present and ``attrs["weight"]`` /
    ``attrs["bias"]`` say which they are."""

    def call(self, inputs: tuple[Any, ...], device: Any, attrs: tuple[tuple[str, Any, Any], ...]) -> Tensor:
        inputs, attrs = self.adapt(inputs, attrs)
        return super().call(inputs, device, attrs)

    def adapt(self, inputs: tuple[Any, ...], attrs: tuple[tuple[str, Any, Any], ...]) -> tuple[tuple[Any, ...], tuple]:
        n = len(inputs)
        for i in range(self.required or 0):
            if inputs[i] is None:
                raise InputTypeError(f"{self.name}: {self.operands[i]} is None; it is required "
                                     f"({', '.join(self.operands[:self.required])} must be arrays)")
        if n == len(self.operands) and inputs[n - 2] is None and "bias" in self.operands:
            inputs = inputs[:n - 2] + inputs[n - 1:]
            attrs = (*attrs, (BIAS_ONLY, True, bool))
        return inputs, attrs

    def _present(self, n_given: int, bias_only: bool) -> tuple[str, ...]:
        """The names of the operands present, given how many were passed."""
        names = self.operands[:n_given]
        if bias_only:
            names = (*self.operands[:n_given - 1], "bias")
        return names


# -- layer_norm and rms_norm ---------------------------------------------------------------------------
def _ln(x: tuple[int, ...], ns: Any, affine: str = "", views: tuple[str | None, ...] = (), dtype: str = "float32",
        scale: float = 1.0, **attrs: Any) -> Case:
    k = len(ns) if isinstance(ns, tuple) else 1
    vec = x[len(x) - k:]
    shapes = (x, *([vec] * len(affine)))
    return Case(shapes, {"normalized_shape": ns, **attrs}, dtype, views, scale)


#: rows x cols, leading / trailing dims, odd lengths, rows past a warp (1024) and a block's
#: register budget, size-1 dims, strided views, weight and bias present or not, every eps form
LN_CASES = [
    _ln((7,), 7), _ln((3, 5), 5, "wb"), _ln((4, 1), 1, "wb"), _ln((2, 3, 5), (3, 5), "wb", eps=1e-3),
    _ln((33, 1025), 1025, "w", scale=3.0), _ln((3, 4099), 4099, "wb"), _ln((24, 40), 40, "wb", ("T",)),
    _ln((6, 40), 40, "wb", ("slice", "slice")), _ln((1, 768), (768,), "wb", eps=1e-6), _ln((70, 130), 130, "wb"),
]
RMS_CASES = [
    _ln((7,), 7, scale=4.0), _ln((3, 5), 5, "w", eps=1e-5), _ln((4, 1), 1, "w", eps=1e-3), _ln((2, 3, 5), (3, 5), "w", eps=1e-6),
    _ln((33, 1025), 1025, "w", eps=1e-5, scale=3.0), _ln((3, 4099), 4099, "w", eps=1e-6),
    _ln((24, 40), 40, "w", ("T",), eps=1e-5), _ln((6, 40), 40, "w", ("slice", "slice"), eps=1e-5),
    _ln((1, 768), 768, "w", eps=1e-6), _ln((70, 130), 130, "w", scale=2.0),
]
GPU_ROWS = [(8192, 768), (4096, 4096), (65536, 128)]


def _bench(affine: str) -> dict[str, list[Case]]:
    return {
        "cpu": [_ln((4096, 1024), 1024, affine)],
        "overhead": [_ln((4, 16), 16, affine)],
        "gpu": [_ln(s, s[1], affine, dtype=d) for d in ("float16", "float32") for s in GPU_ROWS],
    }


def _axes(x: Any, ns: Any) -> tuple[int, ...]:
    k = 1 if isinstance(ns, (int, np.integer)) else len(ns)
    return tuple(range(x.ndim - k, x.ndim))


def _ns(ns: Any) -> tuple[int, ...]:
    return (int(ns),) if isinstance(ns, (int, np.integer)) else tuple(ns)


def _numpy_layer_norm(np: Any, x: Any, weight: Any = None, bias: Any = None, normalized_shape: Any = None,
                      eps: float = 1e-5) -> Any:
    axes = _axes(x, normalized_shape)
    mean = x.mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _jax_layer_norm(jax: Any, x: Any, weight: Any = None, bias: Any = None, normalized_shape: Any = None,
                    eps: float = 1e-5) -> Any:
    return _numpy_layer_norm(jax.numpy, x, weight, bias, normalized_shape, eps)


def _numpy_rms_norm(np: Any, x: Any, weight: Any = None, normalized_shape: Any = None, eps: float | None = None) -> Any:
    eps = float(np.finfo(x.dtype).eps) if eps is None else eps
    y = x / np.sqrt((x * x).mean(axis=_axes(x, normalized_shape), keepdims=True) + eps)
    return y if weight is None else y * weight


def _jax_rms_norm(jax: Any, x: Any, weight: Any = None, normalized_shape: Any = None, eps: float | None = None) -> Any:
    return _numpy_rms_norm(jax.numpy, x, weight, normalized_shape, eps)


class LayerNorm(_Optional):
    """layer_norm, or rms_norm with ``rms``: one class, two operators."""

    bound = "memory"

    def __init__(self, name: str, rms: bool) -> None:
        self.name, self.rms = name, rms
        self.operands = ("x", "weight") if rms else ("x", "weight", "bias")
        self.required = 1
        self.cases = RMS_CASES if rms else LN_CASES
        self.quick = (1, 5, 7)
        self.empty = [_ln((0, 5), 5, "w" if rms else "wb"), _ln((3, 0), 0, "w"), _ln((2, 0, 4), 4)]
        self.bench = _bench("w" if rms else "wb")
        if rms:
            self.peers = {
                "numpy": _numpy_rms_norm,
                "torch": lambda torch, x, weight=None, normalized_shape=None, eps=None:
                    torch.nn.functional.rms_norm(x, _ns(normalized_shape), weight, eps),
                "jax": _jax_rms_norm,
            }  # ONNX's RMSNormalization needs opset 23; the bench's one-node models use 17
        else:
            self.peers = {
                "numpy": _numpy_layer_norm,
                "torch": lambda torch, x, weight=None, bias=None, normalized_shape=None, eps=1e-5:
                    torch.nn.functional.layer_norm(x, _ns(normalized_shape), weight, bias, eps),
                "jax": _jax_layer_norm,
                "onnx": lambda normalized_shape=None, eps=1e-5:
                    ("LayerNormalization", {"axis": -len(_ns(normalized_shape)), "epsilon": eps}),
            }
        super().__init__()

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        op = self.name
        if "normalized_shape" not in attrs:
            raise AttributeValueError(f"{op}: normalized_shape is required (the trailing dims of x to normalize over)")
        ns = _normalized_shape(op, attrs.pop("normalized_shape"))
        eps = _eps(op, attrs.pop("eps", None if self.rms else 1e-5), allow_none=self.rms)
        bias_only = bool(attrs.pop(BIAS_ONLY, False))
        _unknown(self, attrs)
        sx = tuple(shapes[0])
        k = len(ns)
        if len(sx) < k or sx[len(sx) - k:] != ns:
            raise ShapeError(f"{op}: normalized_shape {ns} must be the trailing dims of x {sx}; "
                             f"e.g. normalized_shape={sx[-1:] if sx else '(n,)'} normalizes over the last dim")
        names = self._present(len(shapes), bias_only)
        _vector_shapes(op, names[1:], shapes[1:], ns, "normalized_shape")
        attrs_n = Attrs(eps=eps, weight="weight" in names, bias="bias" in names, dims=k)
        return Normalized(tuple(tuple(sh) for sh in shapes), attrs_n, sx, sx,
                          "empty" if math.prod(sx) == 0 else None)

    def reference(self, x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
                  normalized_shape: Any = None, eps: float | None = None, **hidden: Any) -> np.ndarray:
        x = np.asarray(x, np.float64)
        axes = _axes(x, normalized_shape)
        if hidden.get(BIAS_ONLY):
            weight, bias = None, weight
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if self.rms:
                eps = DEFAULT_EPS["float64"] if eps is None else eps
                y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
            else:
                eps = 1e-5 if eps is None else eps
                mean = np.mean(x, axis=axes, keepdims=True)
                d = x - mean
                y = d / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + eps)
            if weight is not None:
                y = y * np.asarray(weight, np.float64)
            if bias is not None:
                y = y + np.asarray(bias, np.float64)
        return y

    def flops(self, problem: Problem) -> float:
        return (5.0 if self.rms else 7.0) * math.prod(problem.out_shape)


# -- batch_norm ---------------------------------------------------------------------------------------
def _bn(x: tuple[int, ...], affine: str = "wb", views: tuple[str | None, ...] = (), dtype: str = "float32",
        **attrs: Any) -> Case:
    c = (x[1],)
    return Case((x, c, c, *([c] * len(affine))), attrs, dtype, views)


class BatchNorm(_Optional):
    name = "batch_norm"
    operands = ("x", "running_mean", "running_var", "weight", "bias")
    required = 3
    bound = "memory"
    #: NC, NCL, NCHW and 5-D; odd sizes, size-1 dims, strided views of x and of the vectors
    cases = [_bn((5, 3), ""), _bn((2, 3, 7)), _bn((2, 4, 5, 7), "w", eps=1e-3), _bn((1, 1, 1, 1)),
             _bn((3, 6, 9, 11), "wb", ("T",)), _bn((2, 5, 6, 8), "wb", ("slice", "slice", None, "slice")),
             _bn((2, 3, 2, 3, 4), "wb", eps=0.1), _bn((4, 16, 33, 33))]
    quick = (1, 4, 5)
    empty = [_bn((0, 3, 4, 4)), _bn((2, 0, 4, 4)), _bn((2, 3, 0, 4), "")]
    bench = {
        "cpu": [_bn((8, 64, 56, 56))],
        "overhead": [_bn((1, 4, 2, 2))],
        "gpu": [_bn((32, 256, 56, 56), dtype=d) for d in ("float16", "float32")],
    }
    peers = {
        "numpy": lambda np, x, m, v, weight=None, bias=None, eps=1e-5: _numpy_batch_norm(np, x, m, v, weight, bias, eps),
        "torch": lambda torch, x, m, v, weight=None, bias=None, eps=1e-5:
            torch.nn.functional.batch_norm(x, m, v, weight, bias, training=False, eps=eps),
        "jax": lambda jax, x, m, v, weight=None, bias=None, eps=1e-5:
            _numpy_batch_norm(jax.numpy, x, m, v, weight, bias, eps),
        # ONNX's BatchNormalization takes (X, scale, B, mean, var): the bench's one-node models
        # feed the operands in this operator's order, so it has no ONNX peer
    }

    def sample(self, arrays: list[np.ndarray], case: Case | None = None) -> list[np.ndarray]:
        """A running variance is positive: ``|v| + 0.1``."""
        out = list(arrays)
        if len(out) > 2:
            out[2] = (np.abs(out[2].astype(np.float64)) + 0.1).astype(out[2].dtype)
        return out

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        op = self.name
        eps = _eps(op, attrs.pop("eps", 1e-5))
        bias_only = bool(attrs.pop(BIAS_ONLY, False))
        _unknown(self, attrs)
        sx = tuple(shapes[0])
        if len(sx) < 2:
            raise ShapeError(f"{op}: x must be at least 2-D (N, C, ...), got shape {sx}; "
                             f"add the batch dim, e.g. x[None]")
        c = sx[1]
        names = self._present(len(shapes), bias_only)
        _vector_shapes(op, names[1:], shapes[1:], (c,), f"C={c}, the channels of x {sx}")
        attrs_n = Attrs(eps=eps, weight="weight" in names, bias="bias" in names)
        return Normalized(tuple(tuple(sh) for sh in shapes), attrs_n, sx, sx,
                          "empty" if math.prod(sx) == 0 else None)

    def reference(self, x: np.ndarray, running_mean: np.ndarray, running_var: np.ndarray,
                  weight: np.ndarray | None = None, bias: np.ndarray | None = None, eps: float = 1e-5,
                  **hidden: Any) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if hidden.get(BIAS_ONLY):
            weight, bias = None, weight
        with np.errstate(invalid="ignore", divide="ignore"):
            return _numpy_batch_norm(np, x, *(None if v is None else np.asarray(v, np.float64)
                                              for v in (running_mean, running_var, weight, bias)), eps)

    def flops(self, problem: Problem) -> float:
        return 2.0 * math.prod(problem.out_shape)


def _numpy_batch_norm(np: Any, x: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float) -> Any:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    y = y if weight is None else y * weight.reshape(shape)
    return y if bias is None else y + bias.reshape(shape)


LAYER_NORM = LayerNorm("layer_norm", rms=False)
RMS_NORM = LayerNorm("rms_norm", rms=True)
BATCH_NORM = BatchNorm()


@LAYER_NORM.function
def layer_norm(x: ArrayLike, normalized_shape: ShapeLike, weight: ArrayLike | None = None,
               bias: ArrayLike | None = None, eps: float = 1e-5, *, device: DeviceLike = None) -> Tensor:
    """Layer normalization over the trailing dims ``normalized_shape``, as
    ``torch.nn.functional.layer_norm``: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Args:
        x: any shape whose last dims are ``normalized_shape``.
        normalized_shape: an int or a tuple of ints.
        weight: None or an array of shape ``normalized_shape``.
        bias: None or an array of shape ``normalized_shape``.
        eps: a finite number > 0.
        device: run here.

    Returns:
        A Tensor of ``x``'s shape and dtype.

    Raises:
        ShapeError: ``normalized_shape`` not the trailing dims of ``x``, or a weight / bias of
            another shape.
        AttributeValueError: a bad ``normalized_shape`` or ``eps``.
        DtypeError: integer input.
    """


@RMS_NORM.function
def rms_norm(x: ArrayLike, normalized_shape: ShapeLike, weight: ArrayLike | None = None, eps: float | None = None,
             *, device: DeviceLike = None) -> Tensor:
    """RMS normalization over the trailing dims ``normalized_shape``, as
    ``torch.nn.functional.rms_norm``: ``x / sqrt(mean(x**2) + eps) * weight``.

    ``eps=None`` is the computation dtype's machine epsilon (``torch.finfo(dtype).eps``).
    Errors as :func:`layer_norm`.
    """


@BATCH_NORM.function
def batch_norm(x: ArrayLike, running_mean: ArrayLike, running_var: ArrayLike, weight: ArrayLike | None = None,
               bias: ArrayLike | None = None, eps: float = 1e-5, *, device: DeviceLike = None) -> Tensor:
    """Batch normalization for inference, as ``torch.nn.functional.batch_norm(training=False)``:
    per channel ``(x - running_mean) / sqrt(running_var + eps) * weight + bias``.

    Args:
        x: (N, C, ...), at least 2-D.
        running_mean: (C,).
        running_var: (C,).
        weight: None or (C,).
        bias: None or (C,).
        eps: a finite number > 0.
        device: run here.

    Returns:
        A Tensor of ``x``'s shape and dtype.

    Raises:
        ShapeError: ``x`` under 2-D or a vector not of shape (C,).
        AttributeValueError: a bad ``eps``.
        InputTypeError: a running statistic given as None.
        DtypeError: integer input.
    """
