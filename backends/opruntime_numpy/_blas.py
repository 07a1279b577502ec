"""The BLAS that numba's ``np.dot`` calls (scipy's OpenBLAS, through ``scipy.linalg.cython_blas``),
held to one thread while the cpu backend's own threads call it.

A kernel that splits its work over threads and calls BLAS on small blocks from each (flash
attention's tiles) wants each call to run in the calling thread: an OpenBLAS left at its default
starts its own threads for a 64 x 256 x 64 product, and two callers at once then wait on its one
thread pool (or, from OpenMP threads, on each other: "Detect OpenMP Loop"). :func:`one_thread` sets
the library's thread count to 1 for the duration of a call (reference-counted: concurrent callers
share one setting, the last one out restores the count); the library is scipy's bundled one
(``scipy.libs`` / ``.dylibs``) or any OpenBLAS mapped into the process. :func:`controllable` is
False when none is found (another BLAS: MKL, Accelerate): kernels then call BLAS from one thread
and let it spread each product itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib": (get, set) or None; "depth", "saved"


def _candidates() -> list[str]:
    try:
        import scipy
        import scipy.linalg.cython_blas  # noqa: F401  (loads the library numba's np.dot calls)
    except ImportError:
        return []
    base = os.path.dirname(scipy.__file__)
    paths = sorted(glob.glob(os.path.join(base, os.pardir, "scipy.libs", "*openblas*")))
    paths += sorted(glob.glob(os.path.join(base, ".dylibs", "*openblas*")))
    try:
        with open("/proc/self/maps") as maps:
            paths += sorted({line.split()[-1] for line in maps if "openblas" in line.split()[-1].lower()})
    except OSError:
        pass
    return paths


def _find() -> tuple[Any, Any] | None:
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            get = getattr(lib, f"{prefix}_get_num_threads", None)
            put = getattr(lib, f"{prefix}_set_num_threads", None)
            if get is not None and put is not None:
                get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                return get, put
    return None


def _lib() -> tuple[Any, Any] | None:
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _find()
        return _state["lib"]


def controllable() -> bool:
    """Whether :func:`one_thread` can hold numba's BLAS to one thread."""
    return _lib() is not None


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """numba's BLAS runs each call in its calling thread inside this block (no-op without one)."""
    lib = _lib()
    if lib is None:
        yield
        return
    get, put = lib
    with _lock:
        if not _state.get("depth"):
            _state["saved"] = get()
            put(1)
        _state["depth"] = _state.get("depth", 0) + 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if not _state["depth"]:
                put(_state["saved"])
