"""Result arrays of more than 4 MB, from memory the process already has.

glibc serves an allocation of 32 MB or more (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit hosts: the
largest its dynamic threshold reaches) with a fresh ``mmap`` and unmaps it on ``free``, so every
such result is faulted in and zeroed by the kernel page by page while the kernel writes it: on
this VM a 32 MB copy into a fresh array takes 7.2 ms against 2.4 ms into one that is already
mapped (NumPy's hugepage advice included), and a 256x32768 softmax 6.0 ms against 2.5 ms.
Smaller results too, in a model: glibc's heap gives memory back (trims it) and takes it again as
results of a few MB come and go, faulting it in anew: in ResNet-50 at batch 4 (results of 1.6 to
12.8 MB) the elementwise kernels between the convolutions took 3-4x their time alone (add and
ReLU on 4x256x56x56 about 5 ms against 1.2), and a forward 221 ms against 174 with every result
above 4 MB pooled. Results of 4 MB and less come from glibc's heap and are not touched here.

:func:`empty` hands out a view of a pooled block (a 1-D byte array this module owns) when no
array refers to that block any more, else a new block. Whether anything refers to a block is
its reference count: every array made from a view of it (slices, reshapes, ``view``, a
``memoryview``, a DLPack capsule, a torch tensor made by ``from_numpy``) holds the block as its
``base``, so a block with no extra reference is unreachable and its bytes can be handed out
again. Results are therefore new memory no operand shares, as the frontend checks. At most
:data:`KEEP_BYTES` are kept: a block that would pass it empties the pool first (its blocks are
freed with their last arrays, as usual).
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np

#: results of more than this many bytes come from the pool
LARGE = 4 << 20
#: the most bytes the pool keeps mapped between calls
KEEP_BYTES = 256 << 20
#: results of more bytes than this are stored past the caches by the kernels that can
#: (non-temporal stores: a result this large is not read back from the cache, and a plain store
#: first reads each line it writes from memory); the cpu suite's 4096 x 1024 float32 sub:
#: 1.23 -> 0.88 ms in a loop of the kernel alone
STREAM_BYTES = 8 << 20

_lock = threading.Lock()
_blocks: list[np.ndarray] = []
#: a block's reference count when only the pool refers to it: the list, getrefcount's argument
#: and the loop variable (measured once, so that an interpreter that counts differently still works)
_FREE_REFS: list[int] = []


def _free_refs() -> int:
    if not _FREE_REFS:
        probe = [np.empty(1, np.uint8)]
        for b in probe:
            _FREE_REFS.append(sys.getrefcount(b))
    return _FREE_REFS[0]


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)`` (C order); from a pooled block when it is above :data:`LARGE`."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes <= LARGE or nbytes > KEEP_BYTES:
        return np.empty(shape, dtype)
    free = _free_refs()
    with _lock:
        for b in _blocks:
            if nbytes <= b.nbytes <= 2 * nbytes and sys.getrefcount(b) == free:
                return b[:nbytes].view(dtype).reshape(shape)
        if sum(b.nbytes for b in _blocks) + nbytes > KEEP_BYTES:
            _blocks.clear()  # the pool forgets them; each is freed with its last array, as usual
        block = np.empty(nbytes, np.uint8)
        _blocks.append(block)
        return block.view(dtype).reshape(shape)


def clear() -> None:
    """Drop every pooled block (each is freed when the last array of it goes)."""
    with _lock:
        _blocks.clear()
