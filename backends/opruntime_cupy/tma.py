"""Tensor maps (``CUtensorMap``) for the kernels that load tiles with Hopper's tensor memory
accelerator (``matmul_tma.cu``).

A tensor map is 128 opaque bytes the driver encodes on the host (``cuTensorMapEncodeTiled``):
the global address, sizes and byte strides of a tensor, the box one copy moves, and the swizzle
of the box in shared memory. The kernel takes it by value (a ``__grid_constant__`` parameter), so
a map is made per operand buffer; :class:`MapCache` keeps the maps of the last few buffers an
operand position saw (a linear's weight is one buffer for its whole life).

The driver is called through ``ctypes`` on ``libcuda`` (CuPy has already loaded it): no binding
package is needed.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

#: CUtensorMapDataType of each element type the kernels load
DATA_TYPES = {"float16": 6, "bfloat16": 9}
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
#: a CUtensorMap as a NumPy structured scalar: CuPy passes it by value like any other
MAP = np.dtype([(f"w{i}", np.uint64) for i in range(16)])

_encode: Any = None


def _encoder() -> Any:
    global _encode
    if _encode is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        _encode = fn
    return _encode


def usable(ptr: int, row_stride_bytes: int) -> bool:
    """Whether a 2-D operand at ``ptr`` with rows ``row_stride_bytes`` apart can be described by a
    tensor map: the driver wants a 16-byte aligned base and strides that are multiples of 16."""
    return ptr % 16 == 0 and row_stride_bytes % 16 == 0 and 0 < row_stride_bytes < 2**40


def tile_map(ptr: int, dtype: str, cols: int, rows: int, row_stride_bytes: int, box: Sequence[int]) -> np.void:
    """The tensor map of a row-major 2-D tensor (``rows`` x ``cols``, rows ``row_stride_bytes``
    apart) at ``ptr``, copied in boxes of ``box`` = (cols, rows) elements with the 128-byte
    swizzle; reads past the edges give zeros."""
    out = np.zeros((), MAP)
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(row_stride_bytes)
    boxes = (ctypes.c_uint32 * 2)(*box)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    rc = _encoder()(out.ctypes.data, DATA_TYPES[dtype], 2, ptr, dims, strides, boxes, steps, 0, SWIZZLE_128B,
                    L2_PROMOTION_256B, 0)
    if rc:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for a {rows}x{cols} {dtype} tensor at "
                           f"{ptr:#x}, rows {row_stride_bytes} bytes apart, box {tuple(box)}")
    return out[()]


class MapCache:
    """The tensor maps of one operand position of one launch plan, by buffer address: the last
    ``size`` buffers seen (an LRU), so a weight's map is encoded once and an activation's each time
    its buffer changes (a few microseconds of host time)."""

    def __init__(self, dtype: str, cols: int, rows: int, box: Sequence[int], size: int = 8) -> None:
        self.dtype, self.cols, self.rows, self.box, self.size = dtype, cols, rows, tuple(box), size
        self._maps: OrderedDict[tuple[int, int], np.void] = OrderedDict()

    def get(self, ptr: int, row_stride_bytes: int) -> np.void:
        key = (ptr, row_stride_bytes)
        m = self._maps.get(key)
        if m is None:
            m = tile_map(ptr, self.dtype, self.cols, self.rows, row_stride_bytes, self.box)
            self._maps[key] = m
            if len(self._maps) > self.size:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(key)
        return m

    def __repr__(self) -> str:
        return (f"MapCache({self.dtype}, {self.rows}x{self.cols}, box {self.box}, "
                f"{len(self._maps)}/{self.size} maps)")
