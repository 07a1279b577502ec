"""Building the backend's CUDA C: load a ``.cu`` file of this package, inject ``#define``s,
compile it with NVRTC for the device's own architecture and cache the result.

    mod = compile.load("softmax.cu", {"BLOCK": 256, "LOG": 1}, device=problem.device.provider.index)
    fn = compile.get_function("matmul_sgemm.cu", "sgemm", defines, device=0)
    fn((gx, gy, gz), (threads,), (a, b, c, m, n, k), shared_mem=smem)

Sources are read with ``importlib.resources``; a line ``#include "name.cuh"`` naming a file of
this package is inlined (so NVRTC needs no include path). NVRTC runs with ``--std=c++17`` and
``-arch=sm_XX`` (the device's compute capability, so the result is a cubin with the chip's own
instructions, not PTX for the driver to finish). Modules are kept in memory per (file, defines,
device, target, options) in a bounded :class:`opruntime.lru.LRU` (``cache_entries``), and their
cubins on disk under ``$OPRUNTIME_CACHE_DIR/cuda`` (default ``~/.cache/opruntime/cuda``), so a
new process skips NVRTC. A failed build raises
:class:`opruntime.errors.KernelCompileError` with the NVRTC log; the selector then runs the next
candidate.

CuPy is imported inside the functions, never at module import.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from opruntime.errors import KernelCompileError
from opruntime.lru import LRU

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_.]+)"\s*$', re.M)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_lock = threading.Lock()
#: (filename, defines, device, arch, options) -> cupy.RawModule; an evicted module is rebuilt
#: from the disk cache (no NVRTC), and launchers still holding its functions keep it alive
_modules = LRU("cuda modules")


@cache
def source(filename: str) -> str:
    """The text of ``filename`` from this package, with local ``#include "x.cuh"`` inlined once."""
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return f"// {name} already included\n"
        seen.add(name)
        text = resources.files(__package__).joinpath(name).read_text().replace("#pragma once", "")
        return _INCLUDE.sub(lambda m: expand(m.group(1)) if _is_local(m.group(1)) else m.group(0), text)

    return expand(filename)


def _is_local(name: str) -> bool:
    return resources.files(__package__).joinpath(name).is_file()


def source_hash(filename: str) -> str:
    """A short hash of the expanded source: identifies the kernel version for tuning caches."""
    return hashlib.sha256(source(filename).encode()).hexdigest()[:16]


def render(filename: str, defines: Mapping[str, Any]) -> str:
    """The source with one ``#define NAME value`` line per entry of ``defines`` in front.

    Values: bool -> 1/0, int/float/str as written. Names must be C identifiers.
    """
    lines = []
    for name, value in defines.items():
        if not _NAME.match(str(name)):
            raise ValueError(f"bad #define name {name!r} for {filename}")
        if isinstance(value, bool):
            value = int(value)
        lines.append(f"#define {name} {value}")
    return "\n".join(lines) + f"\n#line 1 \"{filename}\"\n" + source(filename)


def device_id(device: Any) -> int:
    """A device id from an int, a :class:`~opruntime_cupy.memory.CudaDevice` (``.index``), a
    ``cupy.cuda.Device`` (``.id``) or None (the current device). Names are not accepted: kernels
    pass ``problem.device.provider.index``."""
    if device is None:
        import cupy

        return cupy.cuda.runtime.getDevice()
    if isinstance(device, int):
        return device
    if isinstance(device, str):  # a name would need parsing: the Problem's provider knows its index
        raise TypeError(f"device {device!r}: pass problem.device.provider.index (or the provider), not a name")
    index = getattr(device, "index", None)
    return int(index if index is not None else device.id)


@cache
def arch_of(dev: int) -> str:
    """The NVRTC architecture for device ``dev``: its compute capability (``"90"``), capped at
    the newest that this NVRTC supports."""
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    cc = int(cupy.cuda.Device(dev).compute_capability)
    try:
        supported = [int(a) for a in nvrtc.getSupportedArchs()]
        if supported and cc not in supported:
            cc = max([a for a in supported if a <= cc] or [min(supported)])
    except Exception:  # older NVRTC without the query: trust the device
        pass
    return str(cc)


def options(arch: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The NVRTC options used for every build."""
    return ("--std=c++17", f"-arch=sm_{arch}", *extra)


def load(filename: str, defines: Mapping[str, Any] | None = None, device: Any = None, *,
         kernel: str = "", arch: str | None = None, extra_options: Sequence[str] = ()) -> Any:
    """Compile ``filename`` with ``defines`` for ``device`` (cached) and return a ``cupy.RawModule``.

    Args:
        filename: a ``.cu`` file of this package.
        defines: tunables injected as ``#define`` lines (order-insensitive for caching).
        device: device id, a ``CudaDevice`` or None for the current device.
        kernel: the opruntime kernel name, for the error message.
        arch: override the target (``"90a"`` for wgmma); default: the device's.
        extra_options: more NVRTC options (``"--use_fast_math"``).

    Raises:
        KernelCompileError: NVRTC rejected the source; ``.log`` holds its log.
    """
    dev = device_id(device)
    defs = dict(defines or {})
    key = (filename, tuple(sorted((k, str(v)) for k, v in defs.items())), dev, arch, tuple(extra_options))
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:  # one build per key when threads race (NVRTC takes seconds)
        mod = _modules.get(key)
        if mod is None:
            mod = _modules[key] = _build(filename, defs, dev, kernel or filename, arch, tuple(extra_options))
    return mod


def get_function(filename: str, name: str, defines: Mapping[str, Any] | None = None, device: Any = None,
                 **kwargs: Any) -> Any:
    """``load(...).get_function(name)``: a ``cupy.RawKernel`` for ``extern "C" __global__ name``."""
    import cupy

    mod = load(filename, defines, device, **kwargs)
    with cupy.cuda.Device(device_id(device)):
        return mod.get_function(name)


def _cache_dir() -> Path:
    base = os.environ.get("OPRUNTIME_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "opruntime")
    return Path(base) / "cuda"


def cubin_path(filename: str, defines: Mapping[str, Any], arch: str, extra: Sequence[str] = ()) -> Path:
    """Where the disk cache keeps the cubin of this source, defines, target and options."""
    from cupy_backends.cuda.libs import nvrtc

    text = render(filename, defines)
    opts = options(arch, extra)
    digest = hashlib.sha256("\0".join([text, *opts, repr(nvrtc.getVersion())]).encode()).hexdigest()[:32]
    return _cache_dir() / f"{Path(filename).stem}-{digest}.cubin"


def build(filename: str, defines: Mapping[str, Any], arch: str, extra: Sequence[str] = (), *,
          kernel: str = "", device: str = "") -> Path:
    """Compile to the disk cache (no device needed: safe in worker processes) and return the
    cubin's path; a cached cubin is reused."""
    path = cubin_path(filename, defines, arch, extra)
    if path.is_file():
        return path
    opts = options(arch, extra)
    cubin = _nvrtc(render(filename, defines), filename, opts, kernel or filename, device or f"sm_{arch}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)  # atomic: concurrent builders write the same bytes
    except OSError:  # a read-only cache: a private temporary file instead
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(cubin)
        path = Path(f.name)
    return path


def _build(filename: str, defines: dict, dev: int, kernel: str, arch: str | None, extra: tuple) -> Any:
    import cupy

    path = build(filename, defines, arch or arch_of(dev), extra, kernel=kernel, device=f"cuda:{dev}")
    with cupy.cuda.Device(dev):
        return cupy.RawModule(path=str(path))


def _nvrtc(text: str, filename: str, opts: tuple[str, ...], kernel: str, where: str) -> bytes:
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(text, filename, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(opts))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(kernel, f"{where} ({opts[1].lstrip('-')})",
                                     f"{log.strip()}\n[{exc}; options: {' '.join(opts)}]") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def prebuild(jobs: Sequence[tuple[str, Mapping[str, Any]]], arch: str, processes: int | None = None) -> list[str]:
    """Compile many (filename, defines) variants into the disk cache in parallel worker
    processes; returns the error messages. Later ``load`` calls hit the cache.

    Threads would do as well: CuPy's NVRTC binding releases the GIL while it compiles (6 sgemm
    variants: 2.54 s one after another, 0.60 s in 6 threads on the H100 machine's host)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    todo = [(f, dict(d)) for f, d in jobs if not cubin_path(f, d, arch).is_file()]
    if not todo:
        return []
    errors = []
    ctx = multiprocessing.get_context("spawn")  # no CUDA state is inherited
    with ProcessPoolExecutor(max_workers=processes or os.cpu_count(), mp_context=ctx) as pool:
        futures = [pool.submit(_prebuild_one, f, d, arch) for f, d in todo]
        for fut in futures:
            err = fut.result()
            if err:
                errors.append(err)
    return errors


def _prebuild_one(filename: str, defines: dict, arch: str) -> str:
    try:
        build(filename, defines, arch)
        return ""
    except Exception as exc:
        return f"{filename} {defines}: {type(exc).__name__}: {exc}"


def clear() -> None:
    """Forget the in-memory modules (tests; the disk cache stays)."""
    _modules.clear()


class FastLaunch:
    """One compiled kernel launched through ``cuLaunchKernel`` with a parameter block built once.

    ``RawKernel.__call__`` converts every argument on every call (about 5 us on the H200's host
    CPU, more than the launch itself). Here the scalar arguments are packed once, when the plan is
    built; a call writes the pointer arguments into the block and launches on the current stream:

        launch = FastLaunch(fn, (grid,), (threads,), pointers=2, scalars=(ctypes.c_int64(rows), ...))
        launch(x.data.ptr, y.data.ptr)

    The pointers come first in the kernel's parameter list, then ``scalars`` in order, each a
    ``ctypes`` value of the parameter's exact C type. ``patches``: words of scalar arguments that a
    call rewrites after its pointers, each (index in ``scalars``, index of the word in that ctypes
    array): the address inside a tensor map, ``launch(c.data.ptr, a.data.ptr, b.data.ptr)``. A lock
    keeps two threads from interleaving their writes to the block (the driver copies the block
    when the launch is queued).
    """

    __slots__ = ("_address", "_args", "_block", "_func", "_function", "_grid", "_launch", "_lock", "_params",
                 "_patches", "_pointers", "_shared", "_stream")

    def __init__(self, kernel: Any, grid: Sequence[int], block: Sequence[int], *, pointers: int,
                 scalars: Sequence[Any] = (), shared_mem: int = 0, patches: Sequence[tuple[int, int]] = ()) -> None:
        import ctypes

        import cupy
        from cupy.cuda import driver

        func = getattr(kernel, "kernel", kernel)  # a RawKernel's cupy.cuda.Function
        # held, not only its address: the Function holds its module loaded, and the module cache
        # (an LRU) may drop the module while this launcher is still in use
        self._function = func
        self._func = int(func.ptr)
        self._grid = (*grid, 1, 1)[:3]
        self._block = (*block, 1, 1)[:3]
        self._shared = shared_mem
        self._pointers = [ctypes.c_void_p(0) for _ in range(pointers)]
        self._args = [*self._pointers, *scalars]  # kept alive: the block points at them
        self._patches = [(scalars[i], w) for i, w in patches]
        self._params = (ctypes.c_void_p * len(self._args))(*(ctypes.addressof(a) for a in self._args))
        self._address = ctypes.addressof(self._params)
        self._launch = driver.launchKernel
        self._stream = cupy.cuda.get_current_stream
        self._lock = threading.Lock()

    def __call__(self, *pointers: int) -> None:
        (gx, gy, gz), (bx, by, bz) = self._grid, self._block
        with self._lock:
            for slot, p in zip(self._pointers, pointers):
                slot.value = p
            if self._patches:
                for (arr, w), p in zip(self._patches, pointers[len(self._pointers):]):
                    arr[w] = p
            self._launch(self._func, gx, gy, gz, bx, by, bz, self._shared, self._stream().ptr,
                         self._address, 0)
