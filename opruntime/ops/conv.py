"""conv2d: NCHW input x OIHW weight, with ``torch.nn.functional.conv2d`` semantics.

* ``x`` is (N, C, H, W), or (C, H, W) unbatched; ``w`` is (O, C // groups, kH, kW);
  ``bias`` is (O,) or None.
* ``stride``, ``dilation``: an int or a pair, >= 1. ``padding``: an int or pair >= 0,
  ``"valid"`` (0) or ``"same"`` (output size = input size; stride must be 1; an odd total pad
  puts the extra row / column at the bottom / right, as torch does).
* ``groups`` >= 1 divides both C and O.

Kernels see ``x`` 4-D, ``w``, and ``bias`` when present, and ``attrs``: ``stride`` (sh, sw),
``padding`` (top, bottom, left, right), ``dilation`` (dh, dw), ``groups``, ``bias`` (bool).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AttributeValueError, ShapeError
from ..kernels import Attrs, Problem
from .base import Normalized, Operator, pair


def out_size(size: int, k: int, pad: int, stride: int, dilation: int) -> int:
    """Output length of one spatial dim."""
    return (size + pad - dilation * (k - 1) - 1) // stride + 1


class Conv2d(Operator):
    name = "conv2d"
    operands = ("x", "w", "bias")
    required = 2

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        sx, sw = shapes[0], shapes[1]
        sb = shapes[2] if len(shapes) > 2 else None
        stride = pair("conv2d", "stride", attrs.pop("stride", 1), 1)
        dilation = pair("conv2d", "dilation", attrs.pop("dilation", 1), 1)
        padding = attrs.pop("padding", 0)
        groups = attrs.pop("groups", 1)
        if attrs:
            raise TypeError(f"conv2d() got unexpected keyword argument(s) {', '.join(attrs)}")
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
        attrs_n = Attrs(stride=stride, padding=pads, dilation=dilation, groups=groups, bias=sb is not None)
        trivial = "empty" if math.prod(out) == 0 else ("zeros" if cg == 0 else None)
        shapes_n = (x4, tuple(sw)) + ((tuple(sb),) if sb is not None else ())
        return Normalized(shapes_n, attrs_n, out, result, trivial)

    def reference(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, groups: int = 1) -> np.ndarray:
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
        return out.reshape(norm.result_shape)

    def flops(self, problem: Problem) -> float:
        _, cg, kh, kw = problem.shapes[1]
        return 2.0 * math.prod(problem.out_shape) * cg * kh * kw


CONV2D = Conv2d()


def conv2d(x: Any, w: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, *, device: Any = None) -> Any:
    """2-D convolution (cross-correlation), NCHW x OIHW, as ``torch.nn.functional.conv2d``.

    Args:
        x: (N, C, H, W) or (C, H, W).  w: (O, C // groups, kH, kW).  bias: (O,) or None.
        stride: int or (sh, sw), >= 1.  padding: int, (ph, pw), "same" or "valid".
        dilation: int or (dh, dw), >= 1.  groups: divides C and O.
        device: run here.

    Returns:
        A Tensor (N, O, Ho, Wo) (or (O, Ho, Wo) for unbatched x).

    Raises:
        ShapeError, AttributeValueError, DtypeError, DeviceMismatchError: see the module doc.
    """
    attrs = (("stride", stride), ("padding", padding), ("dilation", dilation), ("groups", groups))
    return CONV2D.call((x, w) if bias is None else (x, w, bias), device, attrs)
