"""Channels-first <-> channels-last copies on CUDA (``layout.cu``), for the kernels that read
NHWC: the TMA convolution (``conv_launch.py``) and cuDNN's ``nhwc`` config (``cudnn.py``).

Each function returns ``launch(x_ptr, y_ptr)`` for one geometry, built once per plan: a
:class:`compile.FastLaunch` of ``transpose_batched`` whose sizes and strides are packed once, so
a call costs one driver launch."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

from . import compile as cc

TILE = 32
#: the grid's y and z extents (CUDA's limit): the channels (or pixels) and the batch of a transpose
MAX_GRID_YZ = 65535

Launch = Callable[[int, int], None]


def fits(batches: int, cols: int) -> bool:
    """Whether a transpose of ``batches`` matrices with ``cols`` output columns fits the grid."""
    return batches <= MAX_GRID_YZ and -(-cols // TILE) <= MAX_GRID_YZ


def transpose(itemsize: int, dev: int, batches: int, rows: int, cols: int, wi: int,
              strides: Sequence[int]) -> Launch:
    """``launch(x, y)``: ``y[b][i][j] = x[b*sb + j*sj + (i // wi)*sh + (i % wi)*sw]`` (elements;
    ``strides`` = (sb, sj, sh, sw)), y contiguous (batches, rows, cols)."""
    fn = cc.get_function("layout.cu", "transpose_batched", {"ELEM": itemsize}, dev, kernel="cupy layout")
    sb, sj, sh, sw = strides
    grid = (-(-rows // TILE), -(-cols // TILE), batches)
    scalars = [ctypes.c_int(rows), ctypes.c_int(cols), ctypes.c_int(wi),
               *(ctypes.c_longlong(v) for v in (sb, sj, sh, sw))]
    return cc.FastLaunch(fn, grid, (TILE, 8), pointers=2, scalars=scalars)


def to_channels_last(itemsize: int, dev: int, shape: Sequence[int], strides: Sequence[int]) -> Launch:
    """NCHW (any ``strides``, in elements) -> a contiguous NHWC buffer; a weight KCRS -> KRSC.
    16-bit planes of contiguous pixels with even steps take the word-wide kernel."""
    n, c, h, w = shape
    sn, sc, sh, sw = strides
    generic = transpose(itemsize, dev, n, h * w, c, w, (sn, sc, sh, sw))
    if itemsize == 2 and sw == 1 and (sh == w or h == 1) and sn % 2 == 0 and sc % 2 == 0 and c % 2 == 0:
        fn = cc.get_function("layout.cu", "transpose_plane2", {"ELEM": 2}, dev, kernel="cupy layout")
        grid = (-(-(h * w) // 64), -(-c // 64), n)
        words = cc.FastLaunch(fn, grid, (32, 8), pointers=2,
                              scalars=[ctypes.c_int(h * w), ctypes.c_int(c), ctypes.c_longlong(sn), ctypes.c_longlong(sc)])

        def launch(x: int, y: int) -> None:
            (generic if x & 3 else words)(x, y)  # a view's offset may leave x off 4 bytes

        return launch
    return generic


def to_channels_first(itemsize: int, dev: int, shape: Sequence[int]) -> Launch:
    """A contiguous NHWC buffer of the NCHW ``shape`` -> a contiguous NCHW one."""
    n, c, h, w = shape
    return transpose(itemsize, dev, n, c, h * w, c, (h * w * c, c, 0, 1))
