"""The BLAS that numba's ``np.dot`` calls (scipy's OpenBLAS, through ``scipy.linalg.cython_blas``),
held to one thread while the cpu backend's own threads call it.

A kernel that splits its work over threads and calls BLAS on small blocks from each (flash
attention's tiles) wants each call to run in the calling thread: an OpenBLAS left at its default
starts its own threads for a 64 x 256 x 64 product, and two callers at once then wait on its one
thread pool (or, from OpenMP threads, on each other: "Detect OpenMP Loop"). :func:`one_thread` sets
the library's thread count to 1 for the duration of a call (reference-counted: concurrent callers
share one setting, the last one out restores the count); the libraries are scipy's bundled one
(``scipy.libs`` / ``.dylibs``) and any OpenBLAS mapped into the process (NumPy's). :func:`controllable` is
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


def _find() -> list[tuple[Any, Any]]:
    """(get, set) of each OpenBLAS library found: scipy's (which numba calls) and NumPy's."""
    found, seen = [], set()
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", ""), ("scipy_openblas", "64_"), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                key = ctypes.cast(put, ctypes.c_void_p).value
                if key not in seen:
                    seen.add(key)
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    found.append((get, put))
                break
    return found


def _libs() -> list[tuple[Any, Any]]:
    with _lock:
        if "libs" not in _state:
            _state["libs"] = _find()
        return _state["libs"]


def _lib() -> tuple[Any, Any] | None:
    """(get, set) of the first library found (scipy's, the one numba calls), or None."""
    libs = _libs()
    return libs[0] if libs else None


def controllable() -> bool:
    """Whether :func:`one_thread` can hold numba's BLAS to one thread."""
    return bool(_libs())


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Inside this block every OpenBLAS found (numba's, which is scipy's, and NumPy's) runs each
    call in its calling thread (no-op without one). NumPy's too: its worker threads, once given
    work, keep spinning for about 0.1 s after a call (``OPENBLAS_THREAD_TIMEOUT``, read once at
    load), and on 2 cores they take a core from whatever runs next; a small product is not worth
    waking them."""
    libs = _libs()
    if not libs:
        yield
        return
    with _lock:
        if not _state.get("depth"):
            _state["saved"] = [get() for get, _ in libs]
            for _, put in libs:
                put(1)
        _state["depth"] = _state.get("depth", 0) + 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if not _state["depth"]:
                for (_, put), n in zip(libs, _state["saved"]):
                    put(n)
