"""Tensor maps (``CUtensorMap``) for the kernels that load tiles with Hopper's tensor memory
accelerator (``matmul_tma.cu``: matmul, linear, and conv2d's implicit GEMM).

A tensor map is 128 opaque bytes the driver encodes on the host: the global address, sizes and
byte strides of a tensor, and the box one copy moves with its swizzle in shared memory
(``cuTensorMapEncodeTiled``), or, for a convolution's input, the pixels and channels one copy
gathers at a filter tap (``cuTensorMapEncodeIm2col``). The kernel takes it by value (a ``__grid_constant__`` parameter), so
a call needs the maps of its own buffers: :class:`TileMaps` makes them cheaply for one operand
position of a launch plan.

The driver is called through ``ctypes`` on ``libcuda`` (CuPy has already loaded it): no binding
package is needed.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: CUtensorMapDataType of each element type the kernels load
DATA_TYPES = {"float16": 6, "bfloat16": 9}
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
#: a CUtensorMap as a NumPy structured scalar: CuPy passes it by value like any other
MAP = np.dtype([(f"w{i}", np.uint64) for i in range(16)])

_encoders: dict[str, Any] = {}


def _encoder(name: str) -> Any:
    """``cuTensorMapEncodeTiled`` or ``cuTensorMapEncodeIm2col`` from libcuda, typed once."""
    fn = _encoders.get(name)
    if fn is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = getattr(lib, name)
        u32p, u64p, i32p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int)
        head = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p]
        tail = [u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]  # element strides, interleave, swizzle, L2, OOB
        fn.argtypes = head + ([u32p] if name.endswith("Tiled") else [i32p, i32p, ctypes.c_uint32, ctypes.c_uint32]) + tail
        fn.restype = ctypes.c_int
        _encoders[name] = fn
    return fn


def _arrays(dims: Sequence[int], strides: Sequence[int]) -> tuple[Any, Any]:
    return (ctypes.c_uint64 * len(dims))(*dims), (ctypes.c_uint64 * max(1, len(strides)))(*strides)


def tile_map(ptr: int, dtype: str, dims: Sequence[int], strides: Sequence[int], box: Sequence[int]) -> np.void:
    """The tensor map of a tensor at ``ptr`` with ``dims`` (innermost first, that one contiguous)
    and the byte ``strides`` of the others, copied in boxes of ``box`` elements with the 128-byte
    swizzle; reads past the edges give zeros, writes past them are dropped."""
    out = np.zeros((), MAP)
    d, st = _arrays(dims, strides)
    rc = _encoder("cuTensorMapEncodeTiled")(out.ctypes.data, DATA_TYPES[dtype], len(dims), ptr, d, st,
                                             (ctypes.c_uint32 * len(box))(*box),
                                             (ctypes.c_uint32 * len(dims))(*([1] * len(dims))), 0, SWIZZLE_128B,
                                             L2_PROMOTION_256B, 0)
    if rc:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for a {dtype} tensor at {ptr:#x}: "
                           f"dims {tuple(dims)} (innermost first), byte strides {tuple(strides)}, box {tuple(box)}")
    return out[()]


def im2col_map(ptr: int, dtype: str, dims: Sequence[int], strides: Sequence[int], lower: Sequence[int],
               upper: Sequence[int], channels: int, pixels: int, steps: Sequence[int]) -> np.void:
    """The im2col tensor map of a channels-last tensor at ``ptr`` (``dims`` = (C, W, H, N), the
    channels contiguous, byte ``strides`` of W, H, N): a copy at start pixel (w, h, n) with filter
    offsets (s, r) loads ``pixels`` pixels x ``channels`` channels, walking the output positions of
    the bounding box [lower, dim + upper) per spatial dim (W first, then H, then the images) in
    ``steps`` (the convolution's strides, (1, stride_w, stride_h, 1)); taps outside the tensor read
    zeros (the padding)."""
    out = np.zeros((), MAP)
    d, st = _arrays(dims, strides)
    spatial = len(dims) - 2
    rc = _encoder("cuTensorMapEncodeIm2col")(out.ctypes.data, DATA_TYPES[dtype], len(dims), ptr, d, st,
                                              (ctypes.c_int * spatial)(*lower), (ctypes.c_int * spatial)(*upper),
                                              channels, pixels, (ctypes.c_uint32 * len(dims))(*steps), 0,
                                              SWIZZLE_128B, L2_PROMOTION_256B, 0)
    if rc:
        raise RuntimeError(f"cuTensorMapEncodeIm2col failed (CUresult {rc}) for a {dtype} tensor at {ptr:#x}: "
                           f"dims {tuple(dims)}, byte strides {tuple(strides)}, corners {tuple(lower)} / "
                           f"{tuple(upper)}, {pixels} pixels x {channels} channels, steps {tuple(steps)}")
    return out[()]


class TileMaps:
    """The tensor maps of one operand position of a launch plan: one geometry (``encode(ptr)``
    makes its map at an address, e.g. ``functools.partial(tile_map, dtype=..., dims=..., ...)``),
    at whatever address each call brings.

    The driver encodes one map; where a probe at plan time shows that the map holds the address
    as one plain 64-bit word (three encodings that differ only in the address differ only in that
    word, which equals it), a call's map is that map with its address written in (well under a
    microsecond); otherwise each new address is encoded (about 7 us of host time on the H100's
    host), and the last ``size`` of them are kept."""

    def __init__(self, encode: Callable[[int], np.void], what: str = "", size: int = 8) -> None:
        self.encode, self.what, self.size = encode, what, size
        self._maps: OrderedDict[int, np.void] = OrderedDict()
        self.words: np.ndarray | None = None  #: the encoded map's 16 words, when patched
        self.slot = -1  #: the word that holds the address
        probes = (1 << 20, 1 << 33, 0x7F3A_5C40_1230)
        try:
            enc = [np.array(encode(a).tolist(), np.uint64) for a in probes]
        except RuntimeError:
            return
        diff = np.flatnonzero((enc[0] != enc[1]) | (enc[0] != enc[2]))
        if len(diff) == 1 and all(int(e[diff[0]]) == a for e, a in zip(enc, probes)):
            self.words, self.slot = enc[0], int(diff[0])

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
            m = self._maps[ptr] = self.encode(ptr)
            if len(self._maps) > self.size:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(ptr)
        return m

    def __repr__(self) -> str:
        how = f"address patched at word {self.slot}" if self.patched else f"{len(self._maps)} encoded"
        return f"TileMaps({self.what}, {how})"


def tiles(dtype: str, dims: Sequence[int], strides: Sequence[int], box: Sequence[int]) -> TileMaps:
    """:class:`TileMaps` of :func:`tile_map` with this geometry."""
    return TileMaps(lambda ptr: tile_map(ptr, dtype, dims, strides, box),
                    f"{dtype} {'x'.join(map(str, dims))}, byte strides {tuple(strides)}, box {tuple(box)}")
