"""conv2d: NCHW input x OIHW weight, with ``torch.nn.functional.conv2d`` semantics.

* ``x`` is (N, C, H, W), or (C, H, W) unbatched; ``w`` is (O, C // groups, kH, kW);
  ``bias`` is (O,) or None.
* ``stride``, ``dilation``: an int or a pair, >= 1. ``padding``: an int or pair >= 0,
  ``"valid"`` (0) or ``"same"`` (output size = input size; stride must be 1; an odd total pad
  puts the extra row / column at the bottom / right, as torch does).
* ``groups`` >= 1 divides both C and O.
* ``activation``: None or one of ``"relu"``, ``"gelu"``, ``"gelu_tanh"``, ``"silu"``
  (:data:`~opruntime.ops.base.EPILOGUES`), applied after the bias as the kernel's epilogue.

Kernels see ``x`` 4-D, ``w``, and ``bias`` when present, and ``attrs``: ``stride`` (sh, sw),
``padding`` (top, bottom, left, right), ``dilation`` (dh, dw), ``groups``, ``bias`` (bool),
``activation`` (None or a name).
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
from .base import ACTIVATIONS, Case, Normalized, Operator, activation_attr, pair


def out_size(size: int, k: int, pad: int, stride: int, dilation: int) -> int:
    """Output length of one spatial dim."""
    return (size + pad - dilation * (k - 1) - 1) // stride + 1


def _cv(x: tuple[int, ...], w: tuple[int, ...], bias: bool = False, views: tuple[str | None, ...] = (),
        dtype: str = "float32", **attrs: Any) -> Case:
    return Case((x, w, (w[0],)) if bias else (x, w), attrs, dtype, views)


def _layer(n: int, c: int, hw: int, k: int, r: int, stride: int, pad: int, dtype: str = "float32") -> Case:
    return _cv((n, c, hw, hw), (k, c, r, r), dtype=dtype, stride=stride, padding=pad)


#: ResNet layers (N, C, H=W, K, R=S, stride, pad): the GPU bench suite
RESNET = [(32, 64, 56, 64, 3, 1, 1), (32, 256, 56, 64, 1, 1, 0), (32, 128, 28, 128, 3, 1, 1),
          (32, 256, 14, 256, 3, 1, 1), (32, 3, 224, 64, 7, 2, 3)]


def _torch_conv(torch: Any, x: Any, w: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                groups: int = 1, activation: str | None = None) -> Any:
    f = torch.nn.functional
    y = f.conv2d(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if activation is None:
        return y
    return f.gelu(y, approximate="tanh") if activation == "gelu_tanh" else getattr(f, activation)(y)


def _jax_conv(jax: Any, x: Any, w: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
              groups: int = 1, activation: str | None = None) -> Any:
    norm = CONV2D.normalize([x.shape, w.shape] + ([bias.shape] if bias is not None else []),
                            dict(stride=stride, padding=padding, dilation=dilation, groups=groups))
    pt, pb, pl, pr = norm.attrs["padding"]
    out = jax.lax.conv_general_dilated(
        x.reshape(norm.shapes[0]), w, norm.attrs["stride"], [(pt, pb), (pl, pr)], rhs_dilation=norm.attrs["dilation"],
        feature_group_count=groups, dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=jax.lax.Precision.HIGHEST)
    out = out if bias is None else out + bias.reshape(1, -1, 1, 1)
    if activation in ("gelu", "gelu_tanh"):
        out = jax.nn.gelu(out, approximate=activation == "gelu_tanh")
    elif activation is not None:
        out = getattr(jax.nn, activation)(out)
    return out.reshape(norm.result_shape)


def _onnx_conv(stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
               activation: str | None = None) -> Any:
    if isinstance(padding, str) or activation is not None:
        return None  # "same" / "valid": ONNX's auto_pad differs on odd totals; an activation is a second node
    (sh, sw), (ph, pw), (dh, dw) = (pair("conv2d", n, v, 0) for n, v in
                                    (("stride", stride), ("padding", padding), ("dilation", dilation)))
    return "Conv", {"strides": [sh, sw], "pads": [ph, pw, ph, pw], "dilations": [dh, dw], "group": groups}


class Conv2d(Operator):
    name = "conv2d"
    operands = ("x", "w", "bias")
    required = 2
    bound = "compute"
    #: every attribute, alone and together; depthwise, pointwise, grouped, unbatched, bias
    cases = [
        _cv((2, 3, 9, 11), (4, 3, 3, 3)),
        _cv((2, 3, 9, 11), (4, 3, 3, 3), True, stride=2, padding=1),
        _cv((1, 4, 10, 7), (6, 4, 3, 2), True, stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
        _cv((2, 4, 8, 8), (4, 2, 3, 3), groups=2, padding="same"),
        _cv((2, 4, 8, 9), (5, 4, 2, 4), True, padding="same", dilation=2),
        _cv((1, 6, 7, 7), (6, 1, 3, 3), True, groups=6, padding=1),
        _cv((1, 3, 7, 7), (6, 1, 3, 3), groups=3, stride=2),
        _cv((2, 8, 5, 6), (4, 8, 1, 1), True),
        _cv((2, 8, 9, 6), (4, 2, 1, 1), groups=4, stride=2),
        _cv((3, 5, 5), (2, 3, 3, 3), True, padding="valid"),
        _cv((1, 1, 1, 1), (1, 1, 1, 1)),
        _cv((1, 3, 13, 17), (7, 3, 5, 5), True, stride=3, padding=2),
        _cv((2, 3, 9, 9), (4, 3, 3, 3), views=("T", None), padding=1),
        # the activation epilogue after the bias: direct / Winograd-able, depthwise, pointwise, grouped
        _cv((2, 5, 9, 11), (6, 5, 3, 3), True, padding=1, activation="relu"),
        _cv((1, 6, 7, 7), (6, 1, 3, 3), True, groups=6, padding=1, activation="gelu"),
        _cv((2, 8, 5, 6), (4, 8, 1, 1), True, activation="gelu_tanh"),
        _cv((2, 4, 8, 9), (6, 2, 3, 3), groups=2, stride=2, activation="silu"),
    ]
    quick = (2, 5, 12)
    empty = [_cv((0, 3, 5, 5), (2, 3, 3, 3)), _cv((1, 0, 5, 5), (2, 0, 3, 3), True),
             _cv((1, 0, 5, 5), (2, 0, 3, 3), True, activation="gelu")]
    bench = {
        "cpu": [_layer(8, 64, 56, 64, 3, 1, 1),
                _cv((8, 64, 56, 56), (64, 1, 3, 3), padding=1, groups=64),
                _layer(8, 64, 56, 128, 1, 1, 0),
                _layer(1, 3, 224, 64, 7, 2, 3)],  # the 7x7 stem (issue 16's table)
        "overhead": [_cv((1, 1, 4, 4), (1, 1, 1, 1))],
        "gpu": [*(_layer(*layer) for layer in RESNET), *(_layer(*layer, dtype="float16") for layer in RESNET)],
    }
    peers = {"torch": _torch_conv, "jax": _jax_conv, "onnx": _onnx_conv}

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        sx, sw = shapes[0], shapes[1]
        sb = shapes[2] if len(shapes) > 2 else None
        stride = pair("conv2d", "stride", attrs.pop("stride", 1), 1)
        dilation = pair("conv2d", "dilation", attrs.pop("dilation", 1), 1)
        padding = attrs.pop("padding", 0)
        groups = attrs.pop("groups", 1)
        activation = activation_attr("conv2d", attrs.pop("activation", None))
        if attrs:
            raise UnknownAttributeError(f"conv2d() got unexpected keyword argument(s) {', '.join(attrs)}; it takes {', '.join(self.attributes)}")
        if len(sx) not in (3, 4):
            raise ShapeError(f"conv2d: x must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {sx}")
        if len(sw) != 4:
            raise ShapeError(f"conv2d: w must be 4-D (O, C/groups, kH, kW), got shape {sw}")
        x4 = (1, *sx) if len(sx) == 3 else tuple(sx)
        n, c, h, wd = x4
        o, cg, kh, kw = sw
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
            raise AttributeValueError(f"conv2d: groups must be an int >= 1, got {groups!r}")
        groups = int(groups)
        if c % groups or o % groups:
            raise AttributeValueError(f"conv2d: groups={groups} must divide both the input channels C={c} "
                                      f"(x {sx}) and the output channels O={o} (w {sw})")
        if cg != c // groups:
            raise ShapeError(f"conv2d: w {sw} expects {cg} channels per group but x {sx} has C={c} "
                             f"with groups={groups}, i.e. {c // groups} per group")
        if kh < 1 or kw < 1:
            raise ShapeError(f"conv2d: the kernel size must be at least 1x1, got w {sw}")
        if sb is not None and tuple(sb) != (o,):
            raise ShapeError(f"conv2d: bias must have shape ({o},) to match w {sw}, got {sb}")
        if isinstance(padding, str):
            if padding == "valid":
                pads = (0, 0, 0, 0)
            elif padding == "same":
                if stride != (1, 1):
                    raise AttributeValueError(f"conv2d: padding='same' needs stride 1, got stride={stride}")
                th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
                pads = (th // 2, th - th // 2, tw // 2, tw - tw // 2)
            else:
                raise AttributeValueError(f"conv2d: padding must be an int, a pair, 'same' or 'valid'; got {padding!r}")
        else:
            ph, pw = pair("conv2d", "padding", padding, 0)
            pads = (ph, ph, pw, pw)
        ho = out_size(h, kh, pads[0] + pads[1], stride[0], dilation[0])
        wo = out_size(wd, kw, pads[2] + pads[3], stride[1], dilation[1])
        if ho < 1 or wo < 1:
            raise ShapeError(f"conv2d: the output would be empty ({ho}x{wo}): the input {h}x{wd} padded by {pads} "
                             f"is smaller than the dilated kernel {dilation[0] * (kh - 1) + 1}x{dilation[1] * (kw - 1) + 1}")
        out = (n, o, ho, wo)
        result = out if len(sx) == 4 else out[1:]
        attrs_n = Attrs(stride=stride, padding=pads, dilation=dilation, groups=groups, bias=sb is not None,
                        activation=activation)
        trivial = "empty" if math.prod(out) == 0 else ("zeros" if cg == 0 else None)
        shapes_n = (x4, tuple(sw)) + ((tuple(sb),) if sb is not None else ())
        return Normalized(shapes_n, attrs_n, out, result, trivial)

    def reference(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, groups: int = 1, activation: str | None = None) -> np.ndarray:
        shapes = [np.shape(x), np.shape(w)] + ([np.shape(bias)] if bias is not None else [])
        norm = self.normalize(shapes, dict(stride=stride, padding=padding, dilation=dilation, groups=groups))
        x = np.asarray(x, np.float64).reshape(norm.shapes[0])
        w = np.asarray(w, np.float64)
        (sh, sw), (pt, pb, pl, pr), (dh, dw) = norm.attrs["stride"], norm.attrs["padding"], norm.attrs["dilation"]
        n, c, _, _ = x.shape
        o, cg, kh, kw = w.shape
        _, _, ho, wo = norm.out_shape
        xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        out = np.zeros(norm.out_shape)
        og = o // groups
        for g in range(groups):  # the plainest loops over groups and taps, for an obvious reference
            xs = xp[:, g * cg:(g + 1) * cg]
            for i in range(kh):
                for j in range(kw):
                    patch = xs[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
                    out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
        if bias is not None:
            out += np.asarray(bias, np.float64).reshape(1, -1, 1, 1)
        if activation is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                out = ACTIVATIONS[activation](out)
        return out.reshape(norm.result_shape)

    def flops(self, problem: Problem) -> float:
        _, cg, kh, kw = problem.shapes[1]
        return 2.0 * math.prod(problem.out_shape) * cg * kh * kw

    def trivial_result(self, problem: Problem, result_shape: tuple[int, ...], trivial: str, datas: Sequence[Any],
                       provider: Any) -> Any:
        """Over zero input channels the result is the bias, activated (a new array), else zeros
        (every activation of :data:`~opruntime.ops.base.EPILOGUES` keeps 0)."""
        if trivial == "empty" or not problem.attrs["bias"]:
            return super().trivial_result(problem, result_shape, trivial, datas, provider)
        bias = provider.to_host(datas[2])
        act = problem.attrs.get("activation")
        if act is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                bias = ACTIVATIONS[act](bias.astype(np.float64)).astype(bias.dtype)
        bias = bias.reshape(1, -1, 1, 1)
        return provider.from_host(np.array(np.broadcast_to(bias, problem.out_shape).reshape(result_shape)))


CONV2D = Conv2d()


@CONV2D.function
def conv2d(x: ArrayLike, w: ArrayLike, bias: ArrayLike | None = None, stride: IntPair = 1,
           padding: IntPair | str = 0, dilation: IntPair = 1, groups: int = 1, activation: str | None = None, *,
           device: DeviceLike = None) -> Tensor:
    """2-D convolution (cross-correlation), NCHW x OIHW, as ``torch.nn.functional.conv2d``.

    Args:
        x: (N, C, H, W) or (C, H, W): a Tensor, a native device array or host data.
        w: the filters, (O, C // groups, kH, kW).
        bias: (O,) or None.
        stride: int or (sh, sw), >= 1.
        padding: int or (ph, pw), >= 0, or ``"same"`` (output as large as the input; stride 1) or
            ``"valid"`` (no padding).
        dilation: int or (dh, dw), >= 1.
        groups: the number of channel groups: divides C and O (C for a depthwise convolution).
        activation: None, "relu", "gelu", "gelu_tanh" or "silu": applied after the bias, fused
            into the kernel's epilogue.
        device: run here.

    Returns:
        A Tensor (N, O, Ho, Wo) (or (O, Ho, Wo) for unbatched x).

    Raises:
        ShapeError: x not 3-D or 4-D, w not 4-D, channels that ``groups`` does not divide or that
            differ from w's, a bias not of shape (O,), an output size under 1.
        AttributeValueError: a bad stride, padding, dilation, groups or activation.
        DtypeError: integer or bool operands.
        DeviceMismatchError: operands on different devices.
    """
