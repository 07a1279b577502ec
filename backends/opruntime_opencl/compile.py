"""Building OpenCL programs, and launching their kernels.

Sources are the ``.cl`` files beside the launchers (read with importlib.resources); tunables
arrive as ``-D`` options. Built programs are kept in one bounded cache, :data:`_programs`, keyed
by (context, source hash, build options). A failed build raises
:class:`~opruntime.errors.KernelCompileError` with the device name and the compiler's log, so the
selector drops that kernel for the problem and runs the next candidate; the failure is cached
too, so it is not rebuilt for every problem that needs it.

Kernels build in their ``prepare`` (once per problem and config, kept by the runtime's launch
cache): there :func:`kernel` makes the launcher its own ``pyopencl.Kernel`` and wraps it in a
:class:`Launch`, so a call only sets the arguments and enqueues.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np

from opruntime.errors import KernelCompileError
from opruntime.lru import LRU

_lock = threading.Lock()  # one build at a time: two threads never build the same program twice
#: held while pyopencl makes a kernel's argument setter (``Kernel(...)``, ``set_scalar_arg_dtypes``):
#: both read and fill pyopencl's invoker cache, a pytools ``PersistentDict`` on one SQLite
#: connection, and two threads in it at once crashed the process (a segmentation fault in
#: ``_exec_sql_fn`` under ``test_eight_threads_one_device_same_kernel[opencl:0-softmax]`` on the
#: H100 machine's NVIDIA OpenCL)
INVOKERS = threading.Lock()
#: name -> text of this package's .cl files (a fixed handful, read once)
_sources: dict[tuple[str, ...], str] = {}
#: (context, source hash, options) -> built Program, or the KernelCompileError of a failed build
_programs = LRU("opencl programs")

#: What every program starts with: the extension pragmas the build options ask for (the
#: launchers define USE_FP64 / USE_FP16 with T = double / half), so the .cl files need not.
PRELUDE = """#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#ifdef USE_FP16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
"""

#: A memory-object argument in a :class:`Launch` signature (scalars are NumPy dtypes).
BUFFER = None


def source(name: str, *includes: str) -> str:
    """The text of ``name`` (a ``.cl`` file of this package) after :data:`PRELUDE` and the
    ``includes`` (other ``.cl`` files of this package, e.g. ``"epilogue.cl"``), in that order."""
    key = (name, *includes)
    text = _sources.get(key)
    if text is None:
        files = resources.files(__package__)
        text = _sources[key] = PRELUDE + "".join(files.joinpath(f).read_text() + "\n" for f in (*includes, name))
    return text


def options(defines: Mapping[str, Any]) -> tuple[str, ...]:
    """``-DNAME=value`` options in a stable order (part of the cache key)."""
    return tuple(f"-D{k}={_fmt(v)}" for k, v in sorted(defines.items()))


def _fmt(v: Any) -> str:
    return str(int(v)) if isinstance(v, bool) else str(v)


def program(device: Any, text: str, defines: Mapping[str, Any], *, label: str, extra: tuple[str, ...] = ()) -> Any:
    """The built program for ``text`` with ``defines`` on ``device`` (an ``OpenCLDevice``).

    Raises:
        KernelCompileError: the build failed; ``label`` (the kernel's name) and the log say why.
    """
    import pyopencl as cl

    opts = options(defines) + tuple(extra)
    # The context itself is the key (pyopencl hashes it by handle and the key keeps it alive), so
    # a recycled handle can never return another context's program.
    key = (device.context, hashlib.sha256(text.encode()).hexdigest(), opts)
    hit = _programs.get(key)
    if hit is None:
        with _lock:
            hit = _programs.get(key)
            if hit is None:
                hit = _programs[key] = _build(cl, device, text, opts, label)
    if isinstance(hit, KernelCompileError):
        raise hit.with_traceback(None)  # the cached error again, without the last raise's frames piling up
    return hit


def _build(cl: Any, device: Any, text: str, opts: tuple[str, ...], label: str) -> Any:
    prg = cl.Program(device.context, text)
    try:
        with warnings.catch_warnings():  # a non-empty log on success is a CompilerWarning: not ours to show
            warnings.simplefilter("ignore", cl.CompilerWarning)
            return prg.build(options=list(opts), devices=[device.cl_device])
    except cl.Error as exc:
        try:
            log = prg.get_build_info(device.cl_device, cl.program_build_info.LOG)
        except cl.Error:
            log = ""
        log = (log or str(exc)).strip()
        return KernelCompileError(label, f"{device.name} ({device.description})",
                                  f"options: {' '.join(opts)}\n{log}")


def kernel(device: Any, text: str, defines: Mapping[str, Any], name: str, *, label: str,
           extra: tuple[str, ...] = ()) -> Any:
    """A new ``pyopencl.Kernel`` called ``name`` from :func:`program`, for one launcher to own
    (a kernel object carries its arguments, so launchers never share one)."""
    import pyopencl as cl

    prg = program(device, text, defines, label=label, extra=extra)
    with INVOKERS:  # a Kernel's __init__ consults pyopencl's invoker cache (see INVOKERS)
        return cl.Kernel(prg, name)


class Launch:
    """A kernel ready to enqueue on its device's queue: ``launch(*args)``.

    Args:
        device: the ``OpenCLDevice`` whose queue runs it.
        knl: the ``pyopencl.Kernel`` (this launch's own, from :func:`kernel`).
        lsize: the work-group size.
        signature: per kernel argument, :data:`BUFFER` or the NumPy dtype of the scalar; with it
            pyopencl sets all arguments in one generated call (15x faster than untyped ones).
        gsize: the global size, rounded up to a multiple of ``lsize``; omitted for kernels whose
            size varies per call (:meth:`sized`).
    """

    __slots__ = ("_lock", "device", "gsize", "knl", "lsize", "queue")

    def __init__(self, device: Any, knl: Any, lsize: tuple[int, ...], signature: Sequence[Any],
                 gsize: tuple[int, ...] | None = None) -> None:
        with INVOKERS:
            knl.set_scalar_arg_dtypes([None if t is None else np.dtype(t) for t in signature])
        self.device, self.knl, self.lsize, self.queue = device, knl, tuple(lsize), device.queue
        self.gsize = None if gsize is None else round_up(gsize, lsize)
        # Setting the arguments and enqueueing must not interleave with another thread's call
        # (the arguments live on the kernel object until the enqueue copies them), nor with any
        # other enqueue on the device's queue: the device's lock (``OpenCLDevice.enqueue_lock``).
        self._lock = device.enqueue_lock

    def __call__(self, *args: Any) -> Any:
        with self._lock:
            evt = self.knl(self.queue, self.gsize, self.lsize, *args)
        self.device.record(evt)
        return evt

    def sized(self, gsize: tuple[int, ...], *args: Any) -> Any:
        """Enqueue over ``gsize`` (rounded up to a multiple of the work-group size)."""
        g = round_up(gsize, self.lsize)
        with self._lock:
            evt = self.knl(self.queue, g, self.lsize, *args)
        self.device.record(evt)
        return evt


def round_up(gsize: Sequence[int], lsize: Sequence[int]) -> tuple[int, ...]:
    """``gsize`` rounded up to a multiple of the work-group size ``lsize``, per dimension."""
    return tuple(-(-n // w) * w for n, w in zip(gsize, lsize))


def clear() -> None:
    """Forget every built program (tests)."""
    _programs.clear()
