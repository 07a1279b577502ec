"""max_pool2d, avg_pool2d and adaptive_avg_pool2d, with ``torch.nn.functional`` semantics (NCHW).

* ``x`` is (N, C, H, W), or (C, H, W) unbatched. For max / avg pooling C, H and W must be
  non-zero (N may be 0); for the adaptive pool H and W must be non-zero (as torch).
* ``kernel_size``: an int or a pair >= 1; ``stride``: the same, or None (the default: the
  kernel size); ``padding``: an int or a pair >= 0, at most ``kernel_size // 2`` (torch checks
  the kernel size, whatever the dilation); ``dilation`` (max only): an int or a pair >= 1.
* ``ceil_mode``: output sizes rounded up instead of down, except that the last window must start
  inside the input or its left padding (torch's rule). The output must be at least 1x1.
* max: padded taps count as -inf; NaN propagates (a window holding a NaN gives NaN), as torch.
* avg: ``count_include_pad`` divides by the window clipped to the padded input (torch's divisor:
  with ``ceil_mode`` a window that runs past the right padding counts only up to it), otherwise
  by the number of input elements it covers.
* ``adaptive_avg_pool2d(x, output_size)``: ``output_size`` an int >= 0 or a pair whose entries
  are ints >= 0 or None (None keeps that input dim). Output cell ``i`` of a dim of length ``L``
  pooled to ``O`` averages ``[floor(i * L / O), ceil((i + 1) * L / O))``.

Kernels see ``x`` 4-D and ``attrs``:

* max_pool2d: ``kernel_size`` (kh, kw), ``stride`` (sh, sw), ``padding`` (ph, pw),
  ``dilation`` (dh, dw), ``ceil_mode`` (already applied to the output shape);
* avg_pool2d: the same with ``dilation`` (1, 1) and ``count_include_pad`` (bool);
* adaptive_avg_pool2d: ``output_size`` (oh, ow), the output's last two dims.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AttributeValueError, ShapeError, UnknownAttributeError
from ..kernels import Attrs, Problem
from ..tensor import Tensor
from ..typing import ArrayLike, DeviceLike, IntPair
from .base import Case, Normalized, Operator, pair


def pooled_size(size: int, k: int, pad: int, stride: int, dilation: int, ceil_mode: bool) -> int:
    """Output length of one spatial dim, as torch's ``pooling_output_shape``: floor (or ceil)
    of the strided windows, and in ceil mode the last window starting inside the input or its
    left padding."""
    span = size + 2 * pad - dilation * (k - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def avg_divisors(size: int, out: int, k: int, pad: int, stride: int, count_include_pad: bool) -> np.ndarray:
    """The per-output divisor of one dim of avg_pool2d (the 2-D divisor is the outer product):
    the window clipped to the padded input, or to the input without ``count_include_pad``."""
    start = np.arange(out) * stride - pad
    end = np.minimum(start + k, size + pad)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def adaptive_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the adaptive windows of one dim: ``floor(i*L/O)``, ``ceil((i+1)*L/O)``."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _first_tap(start: int, dilation: int) -> int:
    """The first tap ``start + t * dilation`` (t >= 0) that is not before the input's start."""
    return start if start >= 0 else start + -(start // dilation) * dilation


def _flag(op: str, name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise AttributeValueError(f"{op}: {name} must be a bool (True or False), got {value!r}")


def _input_4d(op: str, shape: tuple[int, ...], adaptive: bool) -> tuple[int, int, int, int]:
    if len(shape) not in (3, 4):
        raise ShapeError(f"{op}: x must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {shape}")
    x4 = (1, *shape) if len(shape) == 3 else tuple(shape)
    if adaptive:
        if 0 in shape[-2:]:
            raise ShapeError(f"{op}: x {shape} has an empty spatial dim; H and W must be at least 1 "
                             f"(only the batch and channel dims may be 0)")
    elif 0 in shape[-3:]:
        raise ShapeError(f"{op}: x {shape} has an empty dim; C, H and W must be at least 1 "
                         f"(only the batch dim N of a 4-D input may be 0)")
    return x4  # type: ignore[return-value]


# -- max_pool2d and avg_pool2d ---------------------------------------------------------------------
def _pc(shape: tuple[int, ...], views: tuple[str | None, ...] = (), dtype: str = "float32", **attrs: Any) -> Case:
    return Case((shape,), attrs, dtype, views)


#: every attribute alone and together, ceil_mode both ways, unbatched, size-1 dims and views
MAX_CASES = [
    _pc((2, 3, 9, 11), kernel_size=3),
    _pc((2, 3, 9, 11), kernel_size=3, stride=2, padding=1),
    _pc((1, 4, 10, 7), kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2)),
    _pc((2, 3, 9, 9), kernel_size=2, stride=2, ceil_mode=True),
    _pc((1, 2, 10, 11), kernel_size=3, stride=2, padding=1, dilation=3, ceil_mode=True),
    _pc((3, 7, 7), kernel_size=2, stride=1),
    _pc((1, 1, 1, 1), kernel_size=1),
    _pc((2, 5, 1, 9), kernel_size=(1, 3), stride=(1, 2), padding=(0, 1)),
    _pc((1, 3, 13, 17), kernel_size=5, stride=3, padding=2, ceil_mode=True),
    _pc((2, 3, 8, 10), ("T",), kernel_size=3, stride=2, padding=1),
    _pc((2, 3, 6, 10), ("slice",), kernel_size=2),
    _pc((1, 2, 33, 40), kernel_size=3, stride=2, padding=1),
]
AVG_CASES = [
    _pc((2, 3, 9, 11), kernel_size=3),
    _pc((2, 3, 9, 11), kernel_size=3, stride=2, padding=1),
    _pc((2, 3, 9, 11), kernel_size=3, stride=2, padding=1, count_include_pad=False),
    _pc((1, 4, 10, 7), kernel_size=(3, 2), stride=(2, 1), padding=(1, 1)),
    _pc((2, 3, 6, 6), kernel_size=3, stride=2, padding=1, ceil_mode=True),
    _pc((2, 3, 6, 6), kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    _pc((1, 2, 5, 5), kernel_size=2, stride=3, padding=1, ceil_mode=True),
    _pc((3, 7, 7), kernel_size=2, stride=1),
    _pc((1, 1, 1, 1), kernel_size=1),
    _pc((2, 5, 1, 9), kernel_size=(1, 3), stride=(1, 2), padding=(0, 1), count_include_pad=False),
    _pc((1, 3, 13, 17), kernel_size=5, stride=3, padding=2, ceil_mode=True),
    _pc((2, 3, 8, 10), ("T",), kernel_size=3, stride=2, padding=1, count_include_pad=False),
    _pc((2, 3, 6, 10), ("slice",), kernel_size=2),
]


def _torch_pool(mode: str) -> Any:
    def peer(torch: Any, x: Any, **attrs: Any) -> Any:
        return getattr(torch.nn.functional, f"{mode}_pool2d")(x, **attrs)

    return peer


def _numpy_pool(mode: str) -> Any:
    """The pool as a strided window view (numpy, or cupy on CUDA devices) reduced over its taps."""
    def peer(lib: Any, x: Any, **attrs: Any) -> Any:
        norm = POOLS[mode].normalize([tuple(x.shape)], dict(attrs))
        x4 = x.reshape(norm.shapes[0])
        a = norm.attrs
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel_size"], a["stride"], a["padding"], a["dilation"]
        n, c, h, w = x4.shape
        oh, ow = norm.out_shape[2:]
        # pad far enough for every window (ceil mode's last one may run past the padding)
        bh = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - h - ph)
        bw = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - w - pw)
        fill = -np.inf if mode == "max" else 0
        xp = lib.pad(x4, ((0, 0), (0, 0), (ph, bh), (pw, bw)), constant_values=fill)
        s = xp.strides
        win = lib.lib.stride_tricks.as_strided(
            xp, (n, c, oh, ow, kh, kw), (s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw))
        if mode == "max":
            out = win.max(axis=(4, 5))
        else:
            div = lib.asarray(np.outer(avg_divisors(h, oh, kh, ph, sh, a["count_include_pad"]),
                                       avg_divisors(w, ow, kw, pw, sw, a["count_include_pad"])), dtype=x.dtype)
            out = win.sum(axis=(4, 5)) / div
        return out.reshape(norm.result_shape)

    return peer


def _jax_pool(mode: str) -> Any:
    def peer(jax: Any, x: Any, **attrs: Any) -> Any:
        norm = POOLS[mode].normalize([tuple(x.shape)], dict(attrs))
        a = norm.attrs
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel_size"], a["stride"], a["padding"], a["dilation"]
        _, _, h, w = norm.shapes[0]
        oh, ow = norm.out_shape[2:]
        pads = ((0, 0), (0, 0), (ph, max(ph, (oh - 1) * sh + dh * (kh - 1) + 1 - h - ph)),
                (pw, max(pw, (ow - 1) * sw + dw * (kw - 1) + 1 - w - pw)))
        x4 = x.reshape(norm.shapes[0])
        dims, strides, dil = (1, 1, kh, kw), (1, 1, sh, sw), (1, 1, dh, dw)
        if mode == "max":
            out = jax.lax.reduce_window(x4, -np.inf, jax.lax.max, dims, strides, pads, window_dilation=dil)
        else:
            div = np.outer(avg_divisors(h, oh, kh, ph, sh, a["count_include_pad"]),
                           avg_divisors(w, ow, kw, pw, sw, a["count_include_pad"]))
            out = jax.lax.reduce_window(x4, 0.0, jax.lax.add, dims, strides, pads) / div.astype(x.dtype)
        return out.reshape(norm.result_shape)

    return peer


def _onnx_pool(mode: str) -> Any:
    def peer(kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
             count_include_pad: bool = True) -> Any:
        k = pair(mode, "kernel_size", kernel_size, 1)
        s = k if stride is None or stride == () else pair(mode, "stride", stride, 1)
        p = pair(mode, "padding", padding, 0)
        attrs: dict[str, Any] = {"kernel_shape": list(k), "strides": list(s), "pads": [p[0], p[1], p[0], p[1]],
                                 "ceil_mode": int(ceil_mode)}
        if mode == "max":
            attrs["dilations"] = list(pair(mode, "dilation", dilation, 1))
            return "MaxPool", attrs
        attrs["count_include_pad"] = int(count_include_pad)
        return "AveragePool", attrs

    return peer


class Pool2d(Operator):
    """max_pool2d, or avg_pool2d: one class, two operators (``mode`` "max" or "avg")."""

    operands = ("x",)
    bound = "memory"
    quick = (1, 4, 9)

    def __init__(self, mode: str) -> None:
        self.mode, self.name = mode, f"{mode}_pool2d"
        self.cases = MAX_CASES if mode == "max" else AVG_CASES
        self.empty = [_pc((0, 3, 5, 5), kernel_size=2), _pc((0, 2, 7, 6), kernel_size=3, stride=2, padding=1)]
        resnet = dict(kernel_size=3, stride=2, padding=1)
        self.bench = {
            "cpu": [_pc((4, 64, 112, 112), **resnet)],
            "overhead": [_pc((1, 1, 4, 4), kernel_size=2)],
            "gpu": [_pc((32, 64, 112, 112), **resnet), _pc((32, 64, 112, 112), dtype="float16", **resnet)],
        }
        self.peers = {"numpy": _numpy_pool(mode), "torch": _torch_pool(mode), "jax": _jax_pool(mode),
                      "onnx": _onnx_pool(mode)}
        super().__init__()

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        op = self.name
        (shape,) = shapes
        if "kernel_size" not in attrs:
            raise AttributeValueError(f"{op}: kernel_size is required (an int or a pair of ints >= 1)")
        k = pair(op, "kernel_size", attrs.pop("kernel_size"), 1)
        stride = attrs.pop("stride", None)
        s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
            else pair(op, "stride", stride, 1)
        p = pair(op, "padding", attrs.pop("padding", 0), 0)
        d = pair(op, "dilation", attrs.pop("dilation", 1), 1) if self.mode == "max" else (1, 1)
        ceil_mode = _flag(op, "ceil_mode", attrs.pop("ceil_mode", False))
        include = _flag(op, "count_include_pad", attrs.pop("count_include_pad", True)) if self.mode == "avg" else None
        if attrs:
            raise UnknownAttributeError(f"{op}() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                        f"it takes {', '.join(self.attributes)}")
        n, c, h, w = _input_4d(op, tuple(shape), adaptive=False)
        for axis, kk, pp in (("H", k[0], p[0]), ("W", k[1], p[1])):
            if pp > kk // 2:  # torch checks kernel_size // 2, whatever the dilation
                raise AttributeValueError(
                    f"{op}: padding {pp} along {axis} is more than half the kernel size {kk}; "
                    f"use padding <= {kk // 2} (kernel_size // 2) or a larger kernel_size")
        oh = pooled_size(h, k[0], p[0], s[0], d[0], ceil_mode)
        ow = pooled_size(w, k[1], p[1], s[1], d[1], ceil_mode)
        if oh < 1 or ow < 1:
            raise ShapeError(f"{op}: the output would be empty ({oh}x{ow}): the input {h}x{w} padded by {p} is "
                             f"smaller than the window {d[0] * (k[0] - 1) + 1}x{d[1] * (k[1] - 1) + 1}; use a "
                             f"smaller kernel_size or dilation, or more padding")
        out = (n, c, oh, ow)
        result = out if len(shape) == 4 else out[1:]
        extra = {"dilation": d} if self.mode == "max" else {"dilation": d, "count_include_pad": include}
        a = Attrs(kernel_size=k, stride=s, padding=p, ceil_mode=ceil_mode, **extra)
        return Normalized(((n, c, h, w),), a, out, result, "empty" if math.prod(out) == 0 else None)

    def reference(self, x: np.ndarray, kernel_size: Any = None, stride: Any = None, padding: Any = 0,
                  dilation: Any = 1, ceil_mode: bool = False, count_include_pad: bool = True) -> np.ndarray:
        attrs: dict[str, Any] = dict(kernel_size=kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode)
        attrs.update(dilation=dilation) if self.mode == "max" else attrs.update(count_include_pad=count_include_pad)
        norm = self.normalize([np.shape(x)], attrs)
        a = norm.attrs
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel_size"], a["stride"], a["padding"], a["dilation"]
        x4 = np.asarray(x, np.float64).reshape(norm.shapes[0])
        n, c, h, w = x4.shape
        oh, ow = norm.out_shape[2:]
        out = np.empty(norm.out_shape)
        for i in range(oh):  # one window at a time, its taps inside the input as one strided slice
            for j in range(ow):
                h0, w0 = i * sh - ph, j * sw - pw
                if self.mode == "max":
                    r0, c0 = _first_tap(h0, dh), _first_tap(w0, dw)
                    r1, c1 = min(h0 + dh * (kh - 1) + 1, h), min(w0 + dw * (kw - 1) + 1, w)
                    win = x4[:, :, r0:max(r0, r1):dh, c0:max(c0, c1):dw]
                    out[:, :, i, j] = win.max(axis=(2, 3)) if win.size else -np.inf  # NaN propagates
                else:
                    r1, c1 = min(h0 + kh, h + ph), min(w0 + kw, w + pw)
                    pool = (r1 - h0) * (c1 - w0)
                    r0, c0, r1, c1 = max(h0, 0), max(w0, 0), min(r1, h), min(c1, w)
                    div = pool if a["count_include_pad"] else (r1 - r0) * (c1 - c0)
                    out[:, :, i, j] = x4[:, :, r0:r1, c0:c1].sum(axis=(2, 3)) / div if r1 > r0 and c1 > c0 else 0.0
        return out.reshape(norm.result_shape)

    def flops(self, problem: Problem) -> float:
        kh, kw = problem.attrs["kernel_size"]
        return float(math.prod(problem.out_shape) * kh * kw)


# -- adaptive_avg_pool2d -------------------------------------------------------------------------------
def _ac(shape: tuple[int, ...], output_size: Any, views: tuple[str | None, ...] = (), dtype: str = "float32") -> Case:
    return Case((shape,), {"output_size": output_size}, dtype, views)


def _numpy_adaptive(lib: Any, x: Any, output_size: Any) -> Any:
    norm = ADAPTIVE_AVG_POOL2D.normalize([tuple(x.shape)], {"output_size": output_size})
    n, c, h, w = norm.shapes[0]
    oh, ow = norm.out_shape[2:]
    x4 = x.reshape(norm.shapes[0])
    if h % oh or w % ow:
        return NotImplemented  # only the reshape-mean form
    return x4.reshape(n, c, oh, h // oh, ow, w // ow).mean(axis=(3, 5)).reshape(norm.result_shape)


def _jax_adaptive(jax: Any, x: Any, output_size: Any) -> Any:
    norm = ADAPTIVE_AVG_POOL2D.normalize([tuple(x.shape)], {"output_size": output_size})
    n, c, h, w = norm.shapes[0]
    oh, ow = norm.out_shape[2:]
    x4 = x.reshape(norm.shapes[0])
    if h % oh == 0 and w % ow == 0:
        return x4.reshape(n, c, oh, h // oh, ow, w // ow).mean(axis=(3, 5)).reshape(norm.result_shape)
    import jax.numpy as jnp

    (hs, he), (ws, we) = adaptive_bounds(h, oh), adaptive_bounds(w, ow)
    rows = jnp.stack([x4[:, :, a:b].mean(axis=2) for a, b in zip(hs, he)], axis=2)
    return jnp.stack([rows[..., a:b].mean(axis=3) for a, b in zip(ws, we)], axis=3).reshape(norm.result_shape)


def _onnx_adaptive(output_size: Any) -> Any:
    if output_size in (1, (1, 1), [1, 1]):
        return "GlobalAveragePool", {}
    return None  # ONNX has no adaptive pool


class AdaptiveAvgPool2d(Operator):
    name = "adaptive_avg_pool2d"
    operands = ("x",)
    bound = "memory"
    #: global (1x1), divisible, overlapping windows, larger than the input, None, unbatched, views
    cases = [
        _ac((2, 3, 9, 11), (3, 4)),
        _ac((2, 3, 7, 7), 1),
        _ac((2, 3, 10, 8), (5, 4)),
        _ac((3, 5, 6), (None, 2)),
        _ac((1, 2, 5, 5), 7),
        _ac((1, 1, 1, 1), 1),
        _ac((2, 3, 6, 9), (6, 1)),
        _ac((2, 3, 8, 8), 1),
        _ac((1, 2, 67, 75), 1),
        _ac((2, 4, 8, 9), (3, 3), ("T",)),
        _ac((2, 3, 5, 6), 1, ("slice",)),
        _ac((2, 2, 9, 8), (2, 3), ("slice",)),
    ]
    quick = (0, 1, 9)
    empty = [_ac((0, 3, 5, 5), 2), _ac((2, 0, 5, 5), 1), _ac((2, 3, 5, 5), (0, 2))]
    bench = {
        "cpu": [_ac((4, 2048, 7, 7), 1), _ac((4, 64, 112, 112), 7)],
        "overhead": [_ac((1, 8, 4, 4), 1)],
        "gpu": [_ac((32, 2048, 7, 7), 1), _ac((32, 2048, 7, 7), 1, dtype="float16")],
    }
    peers = {
        "numpy": _numpy_adaptive,
        "torch": lambda torch, x, output_size: torch.nn.functional.adaptive_avg_pool2d(x, output_size),
        "jax": _jax_adaptive,
        "onnx": _onnx_adaptive,
    }

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        op = self.name
        (shape,) = shapes
        if "output_size" not in attrs:
            raise AttributeValueError(f"{op}: output_size is required (an int or a pair of ints or None)")
        size = attrs.pop("output_size")
        if attrs:
            raise UnknownAttributeError(f"{op}() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                        f"it takes {', '.join(self.attributes)}")
        n, c, h, w = _input_4d(op, tuple(shape), adaptive=True)
        entries = (size, size) if _is_int(size) else size
        try:
            a, b = entries
            ok = all(v is None or (_is_int(v) and v >= 0) for v in (a, b))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise AttributeValueError(f"{op}: output_size must be an int >= 0 or a pair of ints >= 0 or None "
                                      f"(None keeps that input dim); got {size!r}")
        oh, ow = (h if a is None else int(a)), (w if b is None else int(b))
        out = (n, c, oh, ow)
        result = out if len(shape) == 4 else out[1:]
        return Normalized(((n, c, h, w),), Attrs(output_size=(oh, ow)), out, result,
                          "empty" if math.prod(out) == 0 else None)

    def reference(self, x: np.ndarray, output_size: Any = None) -> np.ndarray:
        norm = self.normalize([np.shape(x)], {"output_size": output_size})
        x4 = np.asarray(x, np.float64).reshape(norm.shapes[0])
        _, _, h, w = x4.shape
        oh, ow = norm.out_shape[2:]
        (hs, he), (ws, we) = adaptive_bounds(h, oh), adaptive_bounds(w, ow)
        out = np.empty(norm.out_shape)
        for i in range(oh):
            for j in range(ow):
                out[:, :, i, j] = x4[:, :, hs[i]:he[i], ws[j]:we[j]].mean(axis=(2, 3))
        return out.reshape(norm.result_shape)

    def flops(self, problem: Problem) -> float:
        return float(math.prod(problem.shapes[0]))


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


MAX_POOL2D = Pool2d("max")
AVG_POOL2D = Pool2d("avg")
POOLS = {"max": MAX_POOL2D, "avg": AVG_POOL2D}
ADAPTIVE_AVG_POOL2D = AdaptiveAvgPool2d()


@MAX_POOL2D.function
def max_pool2d(x: ArrayLike, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               dilation: IntPair = 1, ceil_mode: bool = False, *, device: DeviceLike = None) -> Tensor:
    """2-D max pooling over NCHW (or CHW) input, as ``torch.nn.functional.max_pool2d``.

    Args:
        x: (N, C, H, W) or (C, H, W): a Tensor, a native device array or host data.
        kernel_size: int or (kh, kw), >= 1.
        stride: int or (sh, sw), >= 1; None: the kernel size.
        padding: int or (ph, pw), >= 0 and at most kernel_size // 2 (padded taps are -inf).
        dilation: int or (dh, dw), >= 1.
        ceil_mode: round output sizes up (torch's rule).
        device: run here.

    Returns:
        A Tensor (N, C, Ho, Wo) (or (C, Ho, Wo)); a window holding a NaN gives NaN.

    Raises:
        ShapeError: x not 3-D or 4-D, or an output size under 1.
        AttributeValueError: a bad kernel size, stride, padding, dilation or output size.
        DtypeError: integer or bool input.
        DeviceMismatchError: ``device=`` other than a Tensor's device.
    """


@AVG_POOL2D.function
def avg_pool2d(x: ArrayLike, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, *, device: DeviceLike = None) -> Tensor:
    """2-D average pooling over NCHW (or CHW) input, as ``torch.nn.functional.avg_pool2d``.

    Args:
        x: (N, C, H, W) or (C, H, W): a Tensor, a native device array or host data.
        kernel_size: int or (kh, kw), >= 1.
        stride: int or (sh, sw), >= 1; None: the kernel size.
        padding: int or (ph, pw), >= 0 and at most half the kernel (zeros).
        ceil_mode: round output sizes up (torch's rule).
        count_include_pad: divide by the window clipped to the padded input (torch's divisor) or,
            when False, by the input elements it covers.
        device: run here.

    Returns:
        A Tensor (N, C, Ho, Wo) (or (C, Ho, Wo)).

    Raises:
        ShapeError: x not 3-D or 4-D, or an output size under 1.
        AttributeValueError: a bad kernel size, stride, padding, dilation or output size.
        DtypeError: integer or bool input.
        DeviceMismatchError: ``device=`` other than a Tensor's device.
    """


@ADAPTIVE_AVG_POOL2D.function
def adaptive_avg_pool2d(x: ArrayLike, output_size: int | None | tuple[int | None, int | None], *,
                        device: DeviceLike = None) -> Tensor:
    """Average pooling to a given output size, as ``torch.nn.functional.adaptive_avg_pool2d``.

    Args:
        x: (N, C, H, W) or (C, H, W), H and W >= 1.
        output_size: int or (oh, ow), each >= 0 or None (keep that input dim).
        device: run here.

    Returns:
        A Tensor (N, C, oh, ow) (or (C, oh, ow)); cell i of a dim L pooled to O averages
            ``[floor(i*L/O), ceil((i+1)*L/O))``.

    Raises:
        ShapeError: x not 3-D or 4-D, or an output size under 1.
        AttributeValueError: a bad kernel size, stride, padding, dilation or output size.
        DtypeError: integer or bool input.
        DeviceMismatchError: ``device=`` other than a Tensor's device.
    """
