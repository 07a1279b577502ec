"""Building OpenCL programs: one cache per (context, source hash, build options).

Sources are the ``.cl`` files beside the launchers (read with importlib.resources); tunables
arrive as ``-D`` options. A failed build raises :class:`~opruntime.errors.KernelCompileError`
with the device name and the compiler's log, so the selector drops that kernel for the problem
and runs the next candidate; the failure is cached too, so it is not rebuilt on every call.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections.abc import Mapping
from importlib import resources
from typing import Any

from opruntime.errors import KernelCompileError

_lock = threading.Lock()
_sources: dict[str, str] = {}
_programs: dict[tuple[int, str, tuple[str, ...]], Any] = {}  # -> Program, or the KernelCompileError
# (program id, name) and a per-call key without hashing -> pyopencl.Kernel, one table per thread:
# a kernel object carries its arguments (set_args), so threads sharing one would race.
_local = threading.local()
_generation = [0]  # bumped by clear(): every thread's table is then stale


def _kernel_table() -> dict[tuple, Any]:
    table = getattr(_local, "kernels", None)
    if table is None or _local.generation != _generation[0]:
        table = _local.kernels = {}
        _local.generation = _generation[0]
    return table


#: What every program starts with: the extension pragmas the build options ask for (the
#: launchers define USE_FP64 / USE_FP16 with T = double / half), so the .cl files need not.
PRELUDE = """#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#ifdef USE_FP16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
"""


def source(name: str) -> str:
    """The text of ``name`` (a ``.cl`` file of this package) after :data:`PRELUDE`."""
    text = _sources.get(name)
    if text is None:
        text = _sources[name] = PRELUDE + resources.files(__package__).joinpath(name).read_text()
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
    key = (device.context.int_ptr, hashlib.sha256(text.encode()).hexdigest(), opts)
    hit = _programs.get(key)
    if hit is None:
        with _lock:
            hit = _programs.get(key)
            if hit is None:
                hit = _programs[key] = _build(cl, device, text, opts, label)
    if isinstance(hit, KernelCompileError):
        raise hit
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
    """The ``pyopencl.Kernel`` called ``name`` from :func:`program` (cached: kernel objects are
    costly to create, and hashing the source on every call would cost more than a launch)."""
    kernels = _kernel_table()
    fast = (id(device), id(text), len(text), tuple(defines.items()), name, extra)
    knl = kernels.get(fast)
    if knl is None:
        import pyopencl as cl

        prg = program(device, text, defines, label=label, extra=extra)
        key = (id(prg), name)
        knl = kernels.get(key)
        if knl is None:
            knl = kernels[key] = cl.Kernel(prg, name)
        if text is _sources.get(_name_of(text)):  # only for the package's own (long-lived) sources
            kernels[fast] = knl
    return knl


def _name_of(text: str) -> str:
    return next((n for n, t in _sources.items() if t is text), "")


def clear() -> None:
    """Forget every built program (tests)."""
    with _lock:
        _programs.clear()
        _generation[0] += 1
