"""numba plumbing of the cpu backend: whether its compiled kernels are offered, where numba caches
them, and compiling them on first use.

The compiled kernels (``numpy.<op>.numba``) are registered beside the NumPy ones when numba is
installed (the ``cpu`` extra: ``pip install 'opruntime[cpu]'``); the selector picks per problem.
Their loops live in this package's ``_nb_*`` modules, which import numba at the top: nothing
imports them until a numba kernel is prepared (:func:`loops`), so importing the backend, listing
its kernels or running NumPy kernels never loads numba (about 0.7 s).

**The disk cache.** Every loop is ``@njit(cache=True)``, and numba's cache for this package's
files is put beside the tuning cache (``opruntime.cache.default_dir() / "numba"``, so
``OPRUNTIME_CACHE_DIR`` moves both) by a cache locator registered before the first loop module
is imported; it applies to this package's files only (a user's own numba functions keep numba's
usual places). A directory that cannot be written falls back to numba's own locators. A cached
kernel loads in milliseconds in a later process; numba keys the entries by source file stamp
and CPU, so an edited loop or another machine recompiles.

**First use.** A kernel's launcher compiles (or loads) its loop for the operands' types on its
first call; :data:`COMPILE_S` keeps how long that took per kernel (and the tuner, which times a
candidate's first call as part of its budget, counts it). Without numba, :func:`missing` says
why, the device's ``info()`` shows it (``opruntime info``) and only the NumPy kernels register.

**Threads.** The loops release the GIL (``nogil``) and run their rows in parallel with
``prange`` on numba's threading layer. numba's fallback layer, ``workqueue``, must not be
entered by two threads at once, so while it is the layer in use the launchers take a lock
(:func:`call`); OpenMP and TBB need none.

**BLAS threads that spin.** The kernels' GEMMs go to scipy's OpenBLAS (numba's ``np.dot``, the
linear's ``sgemm``), whose worker threads spin for 2**28 cycles (about 0.1 s) after each call
before they sleep: on a machine of few cores the next kernel's threads (numba's, the launchers')
share the cores with them for that long (a GPT-2 block's attention right after its qkv GEMM took
115-145 ms instead of 87 here). OpenBLAS reads its spin time (``OPENBLAS_THREAD_TIMEOUT``, in
powers of 2 cycles) only when it starts its threads, as the library loads; so before the first
loop module, :func:`_short_blas_spin` loads scipy's OpenBLAS itself with :data:`BLAS_SPIN` (2**20
cycles: about 0.4 ms, of the order of libgomp's own spin, which torch's one OpenMP pool uses),
unless the user set the variable or scipy's BLAS is loaded already (their setting stands). The
variable is set for the load only: the process's environment is left as it was. NumPy's own
OpenBLAS (``np.matmul``) is loaded with NumPy, before opruntime, and keeps its default.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opruntime.errors import KernelError

#: kernel name -> seconds its first call took in this process, compiling its loops (or loading them
#: from the disk cache) included
COMPILE_S: dict[str, float] = {}

_HERE = Path(__file__).resolve().parent
_lock = threading.RLock()
_state: dict[str, Any] = {}  # "numba": the module once set up; "error": why it could not be


def missing() -> str | None:
    """Why the numba kernels are not offered, or None when they are (numba importable)."""
    if "error" in _state:
        return _state["error"]
    if importlib.util.find_spec("numba") is None:
        return "numba is not installed: only the NumPy kernels run (pip install 'opruntime[cpu]' adds compiled ones)"
    return None


def available() -> bool:
    """Whether the numba kernels are registered."""
    return missing() is None


def cache_dir() -> Path:
    """Where numba keeps the compiled kernels: beside the tuning cache."""
    from opruntime.cache import default_dir

    return default_dir() / "numba"


def source(*modules: str) -> str:
    """The text of loop modules (a kernel's ``source``: a changed loop invalidates its tuning)."""
    return "\n".join((_HERE / f"{m}.py").read_text() for m in ("_nb_math", *modules))


def loops(name: str) -> Any:
    """The loop module ``name`` (``"_nb_rows"``...), imported after numba's cache is set up.

    Raises:
        KernelError: numba cannot be imported (the kernel fails; the selector runs the next).
    """
    with _lock:
        if "numba" not in _state:
            if "error" in _state:
                raise KernelError(_state["error"])
            try:
                _state["numba"] = _setup()
            except Exception as exc:  # ImportError, or a numba that does not fit this NumPy
                _state["error"] = f"numba cannot be imported: {type(exc).__name__}: {exc}"
                raise KernelError(_state["error"]) from exc
        return importlib.import_module(f"{__package__}.{name}")


#: OpenBLAS's spin after a call, for scipy's library when opruntime loads it: 2**BLAS_SPIN cycles
BLAS_SPIN = 20
_SPIN_VARS = ("OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT")


def _short_blas_spin() -> bool:
    """Load scipy's OpenBLAS (``scipy.libs``) with ``OPENBLAS_THREAD_TIMEOUT=BLAS_SPIN`` in the
    environment for the load only (the library reads it as it starts its threads), unless the
    user set the spin or scipy's BLAS is already loaded; True when it was loaded here. Loaded by
    path with ctypes (a few ms): scipy's own import later finds the library already mapped."""
    import ctypes
    import glob
    import sys

    if "scipy.linalg.cython_blas" in sys.modules or any(v in os.environ for v in _SPIN_VARS):
        return False
    spec = importlib.util.find_spec("scipy")
    if spec is None or not spec.submodule_search_locations:
        return False
    base = Path(list(spec.submodule_search_locations)[0])
    paths = sorted(glob.glob(str(base.parent / "scipy.libs" / "*openblas*"))) + sorted(
        glob.glob(str(base / ".dylibs" / "*openblas*")))
    if not paths:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(BLAS_SPIN)
    try:
        ctypes.CDLL(paths[0])
        return True
    except OSError:
        return False
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]


def _setup() -> Any:
    _short_blas_spin()
    import numba
    from numba.core import caching

    _wide_vectors(numba)

    class Locator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        """numba's cache for this package's files, under :func:`cache_dir`."""

        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(cache_dir() / _HERE.name)

        def get_cache_path(self) -> str:
            return self._cache_path

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if Path(py_file).resolve().parent != _HERE:
                return None
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:  # not writable: numba's own locators
                return None
            return self

    try:
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # (the older name)
        classes = impl._locator_classes
        if not any(c.__name__ == "Locator" and c.__module__ == __name__ for c in classes):
            classes.insert(0, Locator)
    except AttributeError:  # another numba layout: its own cache places (__pycache__ or the user's)
        pass
    return numba


def _wide_vectors(numba: Any) -> None:
    """Let LLVM use 512-bit vectors on AVX-512 hosts (numba's default for them prefers 256 bits):
    the loops of :mod:`._nb_math` run twice as many lanes (measured 2.2x on gelu). Only when numba
    has compiled nothing yet in this process and ``NUMBA_CPU_FEATURES`` is not set; the features
    are the host's own plus ``-prefer-256-bit`` (numba keys its disk cache on them)."""
    try:
        from numba.core.registry import cpu_target

        if numba.config.CPU_FEATURES is not None or "_toplevel_target_context" in vars(cpu_target):
            return
        import llvmlite.binding as ll

        features = ll.get_host_cpu_features()
        if features.get("avx512f"):
            numba.config.CPU_FEATURES = features.flatten() + ",-prefer-256-bit"
    except Exception:  # another numba layout, or no feature map: numba's defaults
        pass


def call(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, serialized while numba's threading layer is ``workqueue`` (not re-entrant)."""
    if _state.get("layer_safe"):
        return fn(*args)
    with _lock:
        out = fn(*args)
        try:
            _state["layer_safe"] = _state["numba"].threading_layer() != "workqueue"
        except Exception:  # no parallel region has run yet
            pass
        return out


def first_use(kernel: str, launch: Callable[..., Any]) -> Callable[..., Any]:
    """``launch`` whose first call's time is recorded in :data:`COMPILE_S` under ``kernel`` (the
    loops compile, or load from the disk cache, on that call)."""
    done = [False]

    def timed(*arrays: Any) -> Any:
        if done[0]:
            return launch(*arrays)
        t0 = time.perf_counter()
        out = launch(*arrays)
        COMPILE_S[kernel] = COMPILE_S.get(kernel, 0.0) + time.perf_counter() - t0
        done[0] = True
        return out

    return timed


def notes(kernel: str) -> Callable[[Any], str]:
    """The ``notes`` of a numba kernel for ``explain``: its first call's time in this process."""

    def note(problem: Any) -> str:
        t = COMPILE_S.get(kernel)
        if t is None:
            return "numba: compiled (or loaded from the disk cache) on first use"
        return f"numba: first call {t:.2f} s, compiling or loading its loops included"

    return note


def info() -> dict[str, str]:
    """What ``opruntime info`` shows of numba: its version, threading layer and cache, or why not."""
    why = missing()
    if why is None:
        try:
            loops("_nb_math")
        except KernelError:
            why = missing()
    if why is not None:
        return {"numba": f"no: {why}"}
    numba = _state["numba"]
    return {"numba": f"{numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads), cache {cache_dir()}"}


def threads() -> int:
    """How many threads a parallel loop uses (numba's, else the cores)."""
    numba = _state.get("numba")
    return int(numba.get_num_threads()) if numba is not None else (os.cpu_count() or 1)


class _Task:
    """A compiled loop as a first-class function argument: its C wrapper's address and its type.
    Not a ``WrapperAddressProtocol`` subclass: numba types those by building a ``FunctionType``
    from the signature on every call (8 us of the wrapper's dispatch, 4 calls per Winograd); this
    one carries its type (``_numba_type_``), and numba reads its address through the protocol's
    ``__wrapper_address__``."""

    __slots__ = ("cres", "address", "sig", "_numba_type_")

    def __init__(self, cres: Any) -> None:
        from numba import types

        self.cres = cres  # keeps the code alive
        self.address = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
        self.sig = cres.signature
        self._numba_type_ = types.FunctionType(self.sig)

    def __wrapper_address__(self) -> int:
        return self.address

    def signature(self) -> Any:
        return self.sig


_TASKS: dict[tuple, _Task] = {}


def task(loop: Any, *args: Any) -> _Task:
    """``loop`` (a plain ``@njit`` loop over a range of tasks, ``loop(*args, first, last)``)
    compiled, or loaded from the disk cache, for ``args`` and ``first``, ``last`` (int64), as a
    first-class function of that one signature, for a ``parallel=True`` wrapper that calls it by
    address (the ``par_*`` of :mod:`._nb_conv` and :mod:`._nb_rows`): by address, the loop is
    optimized once in its own module, where a call by name links its call tree into the wrapper's
    module, optimized again three times over (the parfor's kernel, its gufunc wrapper, the
    function). Kept per loop and operand layout (2 us per call, where numba's ``typeof`` of the
    arrays would take 5 us each). The loops raise nothing but a failed allocation, which a
    first-class call reports without raising (numba's C wrapper)."""
    import numpy as np

    key = (loop,) + tuple((a.dtype, a.ndim, a.flags.c_contiguous, a.flags.f_contiguous, a.flags.writeable,
                           a.flags.aligned) if isinstance(a, np.ndarray) else type(a) for a in args)
    fn = _TASKS.get(key)
    if fn is None:
        from numba import typeof, types

        sig = tuple(typeof(a) for a in args) + (types.int64, types.int64)
        loop.compile(sig)
        fn = _TASKS[key] = _Task(loop.overloads[sig])
    return fn


def wrapper_options(**options: Any) -> dict[str, Any]:
    """``@njit`` options of a ``parallel=True`` wrapper that only calls a loop by address per
    range (the ``par_*``): ``options`` plus ``parallel=True`` and numba's ``_dbg_optnone`` (LLVM's
    ``optnone`` on the wrapper's functions: nothing in them is worth optimizing, the loop is
    compiled apart), where this numba has it: such a wrapper compiled in 0.22 s instead of 0.31
    (most of it LLVM's O3 of the parfor's three functions), a tenth of a kernel's first use."""
    out = dict(options, parallel=True)
    try:
        from numba.core.cpu import CPUTargetOptions

        if hasattr(CPUTargetOptions, "_dbg_optnone"):
            out["_dbg_optnone"] = True
    except ImportError:  # another numba layout: optimized wrappers
        pass
    return out


def run_dynamic(wrapper: Any, *args: Any) -> None:
    """``wrapper(*args)`` (a ``parallel=True`` wrapper of a loop) with numba's chunk size 1 in this
    thread for the call: its ranges are handed out one at a time (dynamic schedule), not cut
    evenly among the threads up front. On 2 cores shared with other libraries' spinning threads
    (torch's OpenMP, NumPy's BLAS) the even split waited for the slower thread: the 7x7 stem
    measured 1.4-8.5 ms from round to round, 1.6-3.3 with one range at a time."""
    numba = _state["numba"]
    old = numba.set_parallel_chunksize(1)
    try:
        call(wrapper, *args)
    finally:
        numba.set_parallel_chunksize(old)

