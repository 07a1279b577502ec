"""Tensor maps (``CUtensorMap``) for the kernels that load tiles with Hopper's tensor memory
accelerator (``matmul_tma.cu``).

A tensor map is 128 opaque bytes the driver encodes on the host (``cuTensorMapEncodeTiled``):
the global address, sizes and byte strides of a tensor, the box one copy moves, and the swizzle
of the box in shared memory. The kernel takes it by value (a ``__grid_constant__`` parameter), so
a call needs the maps of its own buffers: :class:`TileMaps` makes them cheaply for one operand
position of a launch plan.

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


class TileMaps:
    """The tensor maps of one operand position of a launch plan: a fixed shape, row stride, box and
    element type, at whatever address each call brings.

    The driver encodes one map; where a probe at plan time shows that the map holds the address
    as one plain 64-bit word (three encodings that differ only in the address differ only in that
    word, which equals it), a call's map is that map with its address written in (well under a
    microsecond); otherwise each new address is encoded (about 7 us of host time on the H100's
    host), and the last ``size`` of them are kept."""

    def __init__(self, dtype: str, cols: int, rows: int, row_stride_bytes: int, box: Sequence[int],
                 size: int = 8) -> None:
        self.dtype, self.cols, self.rows, self.stride, self.box = dtype, cols, rows, row_stride_bytes, tuple(box)
        self.size = size
        self._maps: OrderedDict[int, np.void] = OrderedDict()
        self.words: np.ndarray | None = None  #: the encoded map's 16 words, when patched
        self.slot = -1  #: the word that holds the address
        probes = (1 << 20, 1 << 33, 0x7F3A_5C40_1230)
        try:
            enc = [np.array(self._encode(a).tolist(), np.uint64) for a in probes]
        except RuntimeError:
            return
        diff = np.flatnonzero((enc[0] != enc[1]) | (enc[0] != enc[2]))
        if len(diff) == 1 and all(int(e[diff[0]]) == a for e, a in zip(enc, probes)):
            self.words, self.slot = enc[0], int(diff[0])

    def _encode(self, ptr: int) -> np.void:
        return tile_map(ptr, self.dtype, self.cols, self.rows, self.stride, self.box)

    @property
    def patched(self) -> bool:
        """Whether a call's map is made by writing its address into one encoded map."""
        return self.words is not None

    def __call__(self, ptr: int) -> np.void:
        if self.words is not None:
            w = self.words.copy()
            w[self.slot] = ptr
            return w.view(MAP)[0]
        m = self._maps.get(ptr)
        if m is None:
            m = self._maps[ptr] = self._encode(ptr)
            if len(self._maps) > self.size:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(ptr)
        return m

    def __repr__(self) -> str:
        how = f"address patched at word {self.slot}" if self.patched else f"{len(self._maps)} encoded"
        return f"TileMaps({self.dtype}, {self.rows}x{self.cols}, row stride {self.stride} B, box {self.box}, {how})"
