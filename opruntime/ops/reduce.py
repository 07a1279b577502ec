"""Reductions: ``sum``, ``mean`` and ``amax`` over ``axis`` (an int, a tuple of ints or None for
every axis; negative counts from the end), with ``keepdims``, as NumPy and ``torch.sum`` /
``torch.mean`` / ``torch.amax``. One class serves the three.

Semantics at the edges:

* a 0-D input reduces to itself (``axis`` None or ``()``); ``axis=()`` reduces nothing (NumPy's
  rule: a copy; torch would reduce every axis);
* ``sum`` over nothing is 0 and ``mean`` over nothing is NaN (NumPy, torch): the frontend answers
  both; ``amax`` over nothing is a :class:`~opruntime.errors.ShapeError` (torch raises too);
* NaN propagates through ``amax`` (as torch; NumPy's ``maximum.reduce`` too);
* float16 and bfloat16 accumulate in float32; the result has the input's dtype.

What kernels see (``Problem``): the input as it is (its shape and strides: no reshape by the
frontend, so a strided view reaches the kernel unchanged and a call takes the plan's hot path);
``attrs["axis"]``, the reduced axes as a sorted tuple of distinct non-negative ints (every axis
for None; ``()`` for none), ``attrs["keepdims"]`` a bool; ``out_shape`` the result's shape
(reduced axes dropped, or kept as 1 with ``keepdims``). The result is C-contiguous, so a kernel
computes the reduction without ``keepdims`` and returns it reshaped to ``out_shape``.

Kernels that want a canonical form collapse the layout themselves into ``(outer, n, inner)``
with one element stride each (``opruntime.kernels.reduction_layout`` / ``reduction_plan``, which
the CUDA and OpenCL families share): size-1 dims dropped,
adjacent dims of the same kind (reduced or kept) merged where their strides allow; reduced axes
that stay apart, or kept dims that do not merge, need a transposed contiguous copy first.
Problems of size 0 never reach kernels.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import AttributeValueError, ShapeError, UnknownAttributeError
from ..kernels import Attrs, Problem
from ..tensor import Tensor
from ..typing import ArrayLike, Axes, DeviceLike
from .base import Case, Normalized, Operator


def _r(shape: tuple[int, ...], axis: Any = None, keepdims: bool = False, views: tuple[str | None, ...] = (),
       dtype: str = "float32") -> Case:
    attrs: dict[str, Any] = {"axis": axis}
    if keepdims:
        attrs["keepdims"] = True
    return Case((shape,), attrs, dtype, views)


#: every axis form (int, negative, tuple, None, (), keepdims), odd sizes, size-1 dims, rows past a
#: block and long ones (a split over blocks), columns, and strided views
CASES = [
    _r(()), _r((1,), 0), _r((7,)), _r((3, 5), 1), _r((3, 5), 0, True), _r((3, 5), -1),
    _r((2, 3, 5), (0, 2)), _r((2, 3, 5), (1, 2), True), _r((4, 1, 6), 1), _r((33, 1025), 1),
    _r((3, 20001), -1), _r((20001,), None), _r((1031, 3), 0), _r((5000, 7), 0), _r((6, 4, 3, 2), (-1, 0)),
    _r((5, 7, 9), None, True), _r((3, 4, 5), ()), _r((24, 40), 1, views=("T",)), _r((24, 40), None, views=("T",)),
    _r((6, 40), 0, views=("slice",)), _r((6, 40), -1, views=("slice",)),
]
QUICK = (9, 6, 13, 17, 20)


def _bench(shape: tuple[int, ...], axis: Any, dtype: str = "float32") -> Case:
    return _r(shape, axis, dtype=dtype)


BENCH = {
    "cpu": [_bench((4096, 1024), -1), _bench((4096, 1024), 0)],
    "overhead": [_bench((16,), None)],
    "gpu": [_bench((8192, 8192), -1), _bench((8192, 8192), 0), _bench((8192, 8192), -1, "float16"),
            _bench((8192, 8192), 0, "float16"), _bench((8192, 8192), None)],
}


def axes_of(op: str, shape: tuple[int, ...], axis: Any) -> tuple[int, ...]:
    """``axis`` (an int, a tuple or list of ints, or None) as a sorted tuple of distinct
    non-negative axes of ``shape``.

    Raises:
        AttributeValueError: a non-int axis, one out of range, or one given twice.
    """
    nd = len(shape)
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)):
        items: Sequence[Any] = (axis,)
    elif isinstance(axis, (tuple, list)):
        items = axis
    else:
        raise AttributeValueError(f"{op}: axis must be an int, a tuple of ints or None; got {axis!r}")
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise AttributeValueError(f"{op}: axis must be an int, a tuple of ints or None; got {axis!r} "
                                      f"(the entry {a!r} is no int)")
        if not -nd <= a < nd:
            fix = "use axis=None (or ()) for a 0-D input" if nd == 0 else f"use -{nd}..{nd - 1}"
            raise AttributeValueError(f"{op}: axis {int(a)} is out of range for a {nd}-D input {shape}; {fix}")
        out.append(int(a) % nd)
    if len(set(out)) != len(out):
        raise AttributeValueError(f"{op}: axis {axis!r} names an axis twice (as {sorted(out)}); "
                                  "give each axis once")
    return tuple(sorted(out))


class Reduce(Operator):
    """sum, mean or amax (``kind``): one class, three operators."""

    operands = ("x",)
    bound = "memory"
    cases = CASES
    quick = QUICK

    def __init__(self, name: str, kind: str, numpy_fn: Callable[..., Any], empty: list[Case],
                 peers: dict[str, Any]) -> None:
        self.name, self.kind, self.numpy_fn = name, kind, numpy_fn
        self.empty, self.peers, self.bench = empty, peers, BENCH
        super().__init__()

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        (shape,) = shapes
        shape = tuple(shape)
        axis = attrs.pop("axis", None)
        keepdims = attrs.pop("keepdims", False)
        if attrs:
            raise UnknownAttributeError(f"{self.name}() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                        f"it takes {', '.join(self.attributes)}")
        if not isinstance(keepdims, (bool, np.bool_)):
            raise AttributeValueError(f"{self.name}: keepdims must be True or False; got {keepdims!r}")
        axes = axes_of(self.name, shape, axis)
        keep = bool(keepdims)
        result = tuple(1 if i in axes else n for i, n in enumerate(shape)) if keep else \
            tuple(n for i, n in enumerate(shape) if i not in axes)
        count = math.prod(shape[i] for i in axes)
        if count == 0 and self.kind == "max":
            zero = [i for i in axes if shape[i] == 0]
            raise ShapeError(f"{self.name}: axis {zero[0]} of the input {shape} has size 0, and the maximum over "
                             "nothing is undefined; reduce over axes of non-zero size, or check the input's shape "
                             "first (torch.amax raises too)")
        trivial = None
        if math.prod(result) == 0:
            trivial = "empty"
        elif count == 0:
            trivial = "zeros" if self.kind == "sum" else "nan"
        return Normalized((shape,), Attrs(axis=axes, keepdims=keep), result, result, trivial)

    def reference(self, x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
        x = np.asarray(x, np.float64)
        axes = axes_of(self.name, x.shape, axis)
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # the mean of nothing: NaN, as meant
            return np.asarray(self.numpy_fn(x, axis=axes, keepdims=bool(keepdims)), np.float64)

    def flops(self, problem: Problem) -> float:
        return float(math.prod(problem.shapes[0]))

    def trivial_result(self, problem: Problem, result_shape: tuple[int, ...], trivial: str, datas: Sequence[Any],
                       provider: Any) -> Any:
        """A mean over nothing is NaN (a new NaN-filled array); the rest as every operator."""
        if trivial != "nan":
            return super().trivial_result(problem, result_shape, trivial, datas, provider)
        dt = np.dtype(datas[0].dtype)
        return provider.from_host(np.full(result_shape, np.nan, dt))


def _tuple(axis: Any) -> Any:
    return tuple(axis) if isinstance(axis, list) else axis


def _torch_peer(fn: str) -> Callable[..., Any]:
    def peer(torch: Any, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        if axis == ():  # torch reduces every axis for dim=()
            return NotImplemented
        dims = tuple(range(x.ndim)) if axis is None else _tuple(axis)
        return getattr(torch, fn)(x, dim=dims, keepdim=keepdims)

    return peer


def _onnx_peer(op_type: str, axes_attribute: bool) -> Callable[..., Any]:
    """One ONNX node at the peers' opset (17): ReduceMean and ReduceMax take ``axes`` as an
    attribute there; ReduceSum takes them as a second input, which a one-operand peer cannot
    give, so it answers only ``axis=None`` (no axes: every axis)."""

    def peer(axis: Any = None, keepdims: bool = False) -> Any:
        attrs: dict[str, Any] = {"keepdims": int(bool(keepdims))}
        if axis is None:
            return op_type, attrs
        if not axes_attribute or axis == ():
            return None
        axes = [axis] if isinstance(axis, int) else list(axis)
        return op_type, {**attrs, "axes": axes}

    return peer


def _peers(np_fn: str, torch_fn: str, jnp_fn: str, onnx_op: str, axes_attribute: bool) -> dict[str, Any]:
    return {
        "numpy": lambda np, x, axis=None, keepdims=False: getattr(np, np_fn)(x, axis=_tuple(axis), keepdims=keepdims),
        "torch": _torch_peer(torch_fn),
        "jax": lambda jax, x, axis=None, keepdims=False: getattr(jax.numpy, jnp_fn)(x, axis=_tuple(axis),
                                                                                      keepdims=keepdims),
        "onnx": _onnx_peer(onnx_op, axes_attribute),
    }


#: size-0 problems: a size-0 reduced axis (sum: zeros, mean: NaN) and a size-0 kept axis
_EMPTY_KEPT = [_r((0, 4), 1), _r((3, 0, 2), 0, True)]
_EMPTY_REDUCED = [_r((3, 0), 1), _r((0, 3), None), _r((2, 0, 3), (1, 2), True)]

SUM = Reduce("sum", "sum", np.sum, _EMPTY_KEPT + _EMPTY_REDUCED, _peers("sum", "sum", "sum", "ReduceSum", False))
MEAN = Reduce("mean", "mean", np.mean, _EMPTY_KEPT + _EMPTY_REDUCED,
              _peers("mean", "mean", "mean", "ReduceMean", True))
AMAX = Reduce("amax", "max", np.max, _EMPTY_KEPT, _peers("max", "amax", "max", "ReduceMax", True))


@SUM.function
def sum(x: ArrayLike, axis: Axes = None, keepdims: bool = False, *, device: DeviceLike = None) -> Tensor:  # noqa: A001
    """The sum of ``x``'s elements over ``axis`` (an int, a tuple of ints, or None: every axis),
    as ``numpy.sum`` / ``torch.sum``. float16 / bfloat16 accumulate in float32.

    Args:
        x: any shape: a Tensor, a native device array or host data.
        axis: the axes to reduce; negative counts from the end; ``()`` reduces none.
        keepdims: keep the reduced axes as size 1.
        device: run here.

    Returns:
        A Tensor of ``x``'s dtype; a sum over nothing (a size-0 axis) is 0.

    Raises:
        AttributeValueError: an axis out of range, given twice or not an int.
        DtypeError: integer input or a dtype no kernel on the device computes.
    """


@MEAN.function
def mean(x: ArrayLike, axis: Axes = None, keepdims: bool = False, *, device: DeviceLike = None) -> Tensor:
    """The mean of ``x``'s elements over ``axis``, as ``numpy.mean`` / ``torch.mean``: the sum
    (float32 accumulation for 16-bit types) divided by the count. A mean over nothing is NaN.
    Arguments and errors as :func:`sum`."""


@AMAX.function
def amax(x: ArrayLike, axis: Axes = None, keepdims: bool = False, *, device: DeviceLike = None) -> Tensor:
    """The maximum of ``x``'s elements over ``axis``, as ``torch.amax`` / ``numpy.max``; NaN
    propagates (a row holding NaN gives NaN). Arguments as :func:`sum`.

    Raises:
        ShapeError: a reduced axis of size 0 (the maximum over nothing is undefined).
        AttributeValueError: an axis out of range, given twice or not an int.
    """
