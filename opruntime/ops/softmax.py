"""softmax and log_softmax along one axis (any axis; negative counts from the end).

Kernels get ``attrs["axis"]`` as a non-negative int; the output has the input's shape. Rows of
all ``-inf`` give NaN, as the float64 reference (and torch) do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AttributeValueError, ShapeError, UnknownAttributeError
from ..kernels import Attrs, Problem
from ..tensor import Tensor
from ..typing import ArrayLike, DeviceLike
from .base import Case, Normalized, Operator


def _sm(shape: tuple[int, ...], axis: int = -1, views: tuple[str | None, ...] = ()) -> Case:
    return Case((shape,), {"axis": axis}, views=views, scale=4.0)


#: odd lengths, size-1 dims, every axis, rows past a work-group, and strided views
CASES = [_sm((1,)), _sm((5,), 0), _sm((3, 7)), _sm((3, 7), 0), _sm((4, 1), 1), _sm((2, 3, 5), 1), _sm((33, 1025)),
         _sm((1, 3000), 1), _sm((6, 4, 3, 2), 0), _sm((24, 40), 1, ("T",)), _sm((24, 40), 0, ("slice",))]
GPU_SHAPES = [(4096, 4096), (8192, 8192), (32768, 1024), (1024, 32768), (65536, 128)]


class Softmax(Operator):
    """softmax, or log_softmax with ``log``: one class, two operators."""

    operands = ("x",)
    bound = "memory"
    cases = CASES
    quick = (2, 5, 10)

    def __init__(self, name: str, log: bool, bench: dict[str, list[Case]]) -> None:
        self.name, self.log, self.bench = name, log, bench
        self.empty = [_sm((0, 4), 1), _sm((3, 0), 1)] if not log else [_sm((0, 4), 0)]
        g = "log_softmax" if log else "softmax"
        self.peers = {
            "numpy": _numpy_peer(log),
            "torch": lambda torch, x, axis=-1: getattr(torch, g)(x, axis),
            "jax": lambda jax, x, axis=-1: getattr(jax.nn, g)(x, axis=axis),
            "onnx": lambda axis=-1: ("LogSoftmax" if log else "Softmax", {"axis": axis}),
        }
        if not log:
            self.peers["triton"] = triton_softmax
        super().__init__()

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        (shape,) = shapes
        axis = attrs.pop("axis", -1)
        if attrs:
            raise UnknownAttributeError(f"{self.name}() got unexpected keyword argument(s) {', '.join(attrs)}; it takes {', '.join(self.attributes)}")
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


def _numpy_peer(log: bool) -> Any:
    def softmax(np: Any, x: Any, axis: int = -1) -> Any:  # the plain five-operation version
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        out = e / e.sum(axis=axis, keepdims=True)
        return np.log(out) if log else out

    return softmax


_triton: list[Any] = []


def triton_softmax(torch: Any, x: Any, axis: int = -1) -> Any:
    """The usual one-row-per-program Triton softmax (a peer on CUDA devices, 2-D, last axis)."""
    if x.ndim != 2 or axis not in (-1, 1) or x.dtype != torch.float32 or x.shape[1] > 65536:
        return NotImplemented
    if not _triton:
        import triton
        import triton.language as tl

        @triton.jit
        def rows(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):  # noqa: N803 (Triton's constexpr style)
            row = tl.program_id(0)
            cols = tl.arange(0, BLOCK)
            v = tl.load(in_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
            v = v - tl.max(v, axis=0)
            e = tl.exp(v)
            tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)

        _triton.append((rows, triton.next_power_of_2))
    rows, pow2 = _triton[0]
    out = torch.empty_like(x)
    block = pow2(x.shape[1])
    rows[(x.shape[0],)](out, x, x.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else (8 if block <= 8192 else 16))
    return out


SOFTMAX = Softmax("softmax", log=False, bench={
    "cpu": [_sm((1024, 1024)), _sm((4096, 1024)), _sm((256, 32768)), _sm((4096, 1024), 0)],  # issue 16's shapes
    "overhead": [_sm((16,))],
    "gpu": [*(_sm(s) for s in GPU_SHAPES), _sm((16,))],
})
LOG_SOFTMAX = Softmax("log_softmax", log=True, bench={"cpu": [_sm((4096, 1024))], "overhead": [_sm((16,))]})


@SOFTMAX.function
def softmax(x: ArrayLike, axis: int = -1, *, device: DeviceLike = None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis``, computed stably (max subtracted).

    Raises:
        ShapeError: a 0-D input.
        AttributeValueError: an axis out of range.
        DtypeError: integer input or a dtype the device cannot compute.
    """


@LOG_SOFTMAX.function
def log_softmax(x: ArrayLike, axis: int = -1, *, device: DeviceLike = None) -> Tensor:
    """``x - logsumexp(x)`` along ``axis``, computed stably. Errors as :func:`softmax`."""
