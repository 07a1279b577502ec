"""The ``opencl:<i>`` devices: one context and one in-order, profiling queue per OpenCL device.

Native data is a ``pyopencl.array.Array`` allocated from a per-device memory pool. Views that
pyopencl makes (``a.T``, ``a[:, ::2]``) keep their strides and byte offset; kernels either read
them through strides or call :meth:`OpenCLDevice.contiguous`, a device-side gather. DLPack goes
through the host (OpenCL has no DLPack device type). Kernels reach their device as
``problem.device.provider``, never by name.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from opruntime import DeviceProvider
from opruntime.errors import OutOfMemoryError

from . import compile as cl_compile
from .compile import BUFFER

#: device type -> (priority, alias); GPUs rank above the NumPy ``cpu`` (50), CPUs below it.
PRIORITY = {"gpu": 70, "accelerator": 40, "cpu": 20}


class OpenCLDevice(DeviceProvider):
    """One OpenCL device of any platform. The context and queue are made on first use."""

    kind = "opencl"

    def __init__(self, index: int, cl_device: Any, aliases: tuple[str, ...] = ()) -> None:
        import pyopencl as cl

        self.cl_device = cl_device
        self.platform = cl_device.platform
        self.name = f"opencl:{index}"
        self.description = cl_device.name.strip()
        self.type = _type_name(cl_device.type, cl)
        self.priority = PRIORITY.get(self.type, 20)
        self.aliases = aliases
        self.extensions = frozenset(cl_device.extensions.split())
        self.max_wg = int(cl_device.max_work_group_size)
        self.local_mem = int(cl_device.local_mem_size)
        self.max_alloc = int(cl_device.max_mem_alloc_size)  # asked once: empty() checks it per call
        self.compute_units = int(cl_device.max_compute_units)
        self.clock_hz = float(cl_device.max_clock_frequency or 1000) * 1e6
        self.accelerator = self.type == "gpu"  # own memory and clock: tests on it carry the gpu marker
        self.is_nvidia = "NVIDIA" in self.platform.name.upper()
        self.has_fp64 = "cl_khr_fp64" in self.extensions
        self.has_fp16 = "cl_khr_fp16" in self.extensions
        self.has_subgroups = "cl_khr_subgroups" in self.extensions
        # rough peak figures for the cost estimates (they only rank this backend's kernels)
        lanes = (128 if self.is_nvidia else 64) if self.accelerator else 16
        self.flops = self.compute_units * self.clock_hz * 2 * lanes
        self.bandwidth = 2.5e12 if self.accelerator else 15e9
        self.launch_s = 8e-6 if self.accelerator else 20e-6
        self._ctx = self._queue = self._pool = None
        self._events: list[Any] | None = None  # what time() is collecting, else None
        # the strided copy, one per element size (at most 4): device machinery, not a cache of
        # problems; made on first use, as the queue is
        self._copies: dict[int, cl_compile.Launch] = {}
        self._copies_into: dict[int, cl_compile.Launch] = {}
        #: held around every enqueue on the device's queue (launches, copies to and from the host,
        #: fills, device copies): NVIDIA's OpenCL driver crashed (a segmentation fault in
        #: ``enqueue_copy``) when 8 threads copied host data into one queue at once; re-entrant, as
        #: a copy may launch the strided-copy kernel
        self.enqueue_lock = threading.RLock()
        self._context_lock = threading.Lock()

    # -- context ----------------------------------------------------------------------------
    @property
    def context(self) -> Any:
        """The device's one context (with its queue and memory pool), made on first use. Made
        under a lock: threads whose first calls race would otherwise each make a context, and a
        buffer of one reaching a kernel of another fails (INVALID_MEM_OBJECT)."""
        if self._ctx is None:
            import pyopencl as cl
            import pyopencl.tools

            with self._context_lock:
                if self._ctx is None:
                    ctx = cl.Context([self.cl_device])
                    self._queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
                    self._pool = cl.tools.MemoryPool(cl.tools.ImmediateAllocator(self._queue))
                    self._ctx = ctx  # last: a thread that sees it sees the queue and the pool too
        return self._ctx

    @property
    def queue(self) -> Any:
        self.context  # noqa: B018 - creates the queue
        return self._queue

    def dtype_ok(self, dtype: str) -> bool:
        """Whether kernels can compute in ``dtype`` here (fp64 / fp16 need their extensions)."""
        return dtype == "float32" or (dtype == "float64" and self.has_fp64) or (dtype == "float16" and self.has_fp16)

    def launch(self, kernel: Any, gsize: tuple[int, ...], lsize: tuple[int, ...], *args: Any) -> Any:
        """Enqueue a plugin's own ``pyopencl.Kernel`` (``gsize`` rounded up to a multiple of
        ``lsize``) so that :meth:`time` sees it. Arguments are set and the kernel enqueued under
        the device's :attr:`enqueue_lock`, so plugins may share one kernel object between threads.
        (This backend's kernels use :class:`~.compile.Launch`: typed arguments, the same lock.)"""
        import pyopencl as cl

        with self.enqueue_lock:
            kernel.set_args(*args)
            evt = cl.enqueue_nd_range_kernel(self.queue, kernel, cl_compile.round_up(gsize, lsize), lsize)
        self.record(evt)
        return evt

    def record(self, event: Any) -> None:
        """Note a kernel's event for :meth:`time` (every :class:`~.compile.Launch` calls it)."""
        if self._events is not None:
            self._events.append(event)

    # -- memory -----------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        import pyopencl as cl
        import pyopencl.array as cla

        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.max_alloc:
            raise OutOfMemoryError(f"{self._cannot(shape, dtype)}: the device's largest single allocation is "
                                   f"{self.max_alloc / 2**20:.0f} MiB (max_mem_alloc_size)")
        queue = self.queue
        for attempt in (0, 1):
            try:
                return cla.empty(queue, tuple(shape), dtype, allocator=self._pool)
            except (cl.Error, MemoryError) as exc:
                code = getattr(exc, "code", None)
                if not isinstance(exc, MemoryError) and code not in _OOM_CODES:
                    raise
                if attempt == 0:  # the pool may hold freed blocks: give them back and retry once
                    self._pool.free_held()
                    continue
                raise OutOfMemoryError(f"{self._cannot(shape, dtype)}: {exc}") from exc
        raise AssertionError("unreachable")

    def _cannot(self, shape: tuple[int, ...], dtype: np.dtype, where: str = "") -> str:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        return (f"{self.name} ({self.description}): cannot allocate {nbytes / 2**20:.1f} MiB {where}for a "
                f"{np.dtype(dtype).name} array of shape {tuple(shape)}")

    @contextlib.contextmanager
    def _host_memory(self, shape: tuple[int, ...], dtype: np.dtype) -> Iterator[None]:
        """Turn a failed host allocation of a transfer (NumPy's ``_ArrayMemoryError``, or the
        OpenCL runtime's host side running out) into OutOfMemoryError naming the device, shape
        and dtype: callers catch that type, not NumPy's."""
        import pyopencl as cl

        try:
            yield
        except OutOfMemoryError:
            raise
        except (MemoryError, cl.Error) as exc:
            if isinstance(exc, cl.Error) and getattr(exc, "code", None) not in _OOM_CODES:
                raise
            raise OutOfMemoryError(f"{self._cannot(shape, dtype, 'in host memory ')} (a copy to or from the "
                                   f"device): {exc}. Use smaller arrays or free host memory") from exc

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        import pyopencl as cl

        out = self.empty(shape, dtype)
        if out.nbytes:
            with self.enqueue_lock:
                cl.enqueue_fill_buffer(self.queue, out.base_data, np.uint8(0), out.offset, out.nbytes)
        return out

    def from_host(self, array: np.ndarray) -> Any:
        array = np.asarray(array)
        with self._host_memory(array.shape, array.dtype):  # making it C-contiguous and native copies
            if not array.dtype.isnative:  # big-endian data: the kernels read native words only
                # (astype keeps a 0-d array 0-d; np.ascontiguousarray would make it 1-d)
                array = array.astype(array.dtype.newbyteorder("="), order="C")
            elif not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
        out = self.empty(array.shape, array.dtype)
        if array.size:
            with self._host_memory(array.shape, array.dtype), self.enqueue_lock:
                out.set(array)
        return out

    def to_host(self, data: Any) -> np.ndarray:
        data = self.contiguous(data)
        with self._host_memory(data.shape, data.dtype), self.enqueue_lock:
            return data.get() if data.size else np.empty(data.shape, data.dtype)

    def copy(self, data: Any) -> Any:
        out = self.contiguous(data)
        if out is not data:
            return out  # a gathered view is already a new array
        with self.enqueue_lock:
            return out.copy()

    def astype(self, data: Any, dtype: np.dtype) -> Any:
        dtype = np.dtype(dtype)
        native = {"float32", "float64"} if self.has_fp64 else {"float32"}
        if data.dtype.name in native and dtype.name in native:
            data = self.contiguous(data)
            with self.enqueue_lock:
                return data.astype(dtype)
        host = self.to_host(data)  # half / bfloat16: through the host
        with self._host_memory(host.shape, dtype):
            host = host.astype(dtype)
        return self.from_host(host)

    def owns(self, data: Any) -> bool:
        if self._ctx is None or type(data).__module__ != "pyopencl.array":
            return False
        return getattr(data, "context", None) == self._ctx

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether ``a`` and ``b`` overlap: the same buffer and overlapping byte ranges (each
        view's span from its offset through its strides, so interleaved views count as
        overlapping: conservative, as ``np.may_share_memory``)."""
        if a is b:
            return True
        ba, bb = getattr(a, "base_data", None), getattr(b, "base_data", None)
        if ba is None or bb is None or not (ba is bb or ba.int_ptr == bb.int_ptr):
            return False
        (alo, ahi), (blo, bhi) = _span(a), _span(b)
        return alo < bhi and blo < ahi

    def free_memory(self) -> int:
        """The device's ``global_mem_size``: OpenCL has no query for free memory, and the largest
        single allocation (``max_mem_alloc_size``) is checked by :meth:`empty`."""
        return int(self.cl_device.global_mem_size)

    def contiguous(self, data: Any) -> Any:
        """``data`` itself when C-contiguous without offset, else a C-contiguous device copy."""
        if data.flags.c_contiguous and not data.offset:
            return data
        out = self.empty(data.shape, data.dtype)
        if not data.size:
            return out
        shape, strides = _collapse(data.shape, [s // data.dtype.itemsize for s in data.strides])
        if len(shape) > MAX_COPY_RANK:  # pragma: no cover - 7-D views that do not collapse
            host = self.to_host_strided(data)
            with self.enqueue_lock:
                out.set(host)
            return out
        shape = [1] * (MAX_COPY_RANK - len(shape)) + shape
        strides = [0] * (MAX_COPY_RANK - len(strides)) + strides
        n = out.size
        self._copy(data.dtype.itemsize).sized((n,), out.base_data, data.base_data, data.offset // data.dtype.itemsize,
                                               n, *shape, *strides)
        return out

    # -- views: pyopencl arrays over the same buffer (offset and strides), copies only where needed --
    def reshape(self, data: Any, shape: tuple[int, ...]) -> Any:
        """A view when ``data``'s strides allow one (NumPy's rule), else a gathered copy reshaped."""
        shape = tuple(shape)
        strides = view_strides(data.shape, data.strides, data.dtype.itemsize, shape)
        if strides is None:
            data = self.contiguous(data)
            strides = _c_strides(shape, data.dtype.itemsize)
        return self._view(data, shape, strides, data.offset)

    def permute(self, data: Any, axes: tuple[int, ...]) -> Any:
        return self._view(data, tuple(data.shape[a] for a in axes), tuple(data.strides[a] for a in axes), data.offset)

    def getitem(self, data: Any, index: tuple[int | slice, ...]) -> Any:
        offset, shape, strides = data.offset, [], []
        for entry, stride in zip(index, data.strides):
            if isinstance(entry, slice):
                shape.append(len(range(entry.start, entry.stop, entry.step)))
                strides.append(stride * entry.step)
                offset += stride * entry.start if shape[-1] else 0
            else:
                offset += stride * entry
        return self._view(data, tuple(shape), tuple(strides), offset)

    def concat(self, datas: Any, axis: int) -> Any:
        """A new C-contiguous array; each part (any strides and offset) copied into its slab."""
        shape = list(datas[0].shape)
        shape[axis] = sum(d.shape[axis] for d in datas)
        out = self.empty(tuple(shape), datas[0].dtype)
        at = 0
        for d in datas:
            if d.size:
                self.copy_into(self._view(out, tuple(d.shape), out.strides, at * out.strides[axis]), d)
            at += d.shape[axis]
        return out

    def _view(self, data: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        """A pyopencl array over ``data``'s buffer (a new empty array when the view holds nothing:
        a size-0 array may have no buffer)."""
        import pyopencl.array as cla

        if not math.prod(shape):
            return self.empty(shape, data.dtype)
        return cla.Array(self.queue, shape, data.dtype, allocator=data.allocator, data=data.base_data,
                         offset=offset, strides=strides)

    def copy_into(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` (views of one shape and dtype, any strides and offsets) on the
        device."""
        size = dst.dtype.itemsize
        shape, dstr, sstr = _collapse_pair(dst.shape, [s // size for s in dst.strides], [s // size for s in src.strides])
        if len(shape) > MAX_COPY_RANK:  # more dims than the kernel takes, after merging: one copy per leading index
            for i in range(dst.shape[0]):
                self.copy_into(dst[i], src[i])
            return
        pad = MAX_COPY_RANK - len(shape)
        n = math.prod(shape)
        self._copy_into(size).sized((n,), dst.base_data, dst.offset // size, src.base_data, src.offset // size, n,
                                    *([1] * pad + shape), *([0] * pad + dstr), *([0] * pad + sstr))

    def _copy_into(self, itemsize: int) -> cl_compile.Launch:
        """The strided-to-strided copy for elements of ``itemsize`` bytes (built on first use)."""
        launch = self._copies_into.get(itemsize)
        if launch is None:
            word = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}[itemsize]
            knl = cl_compile.kernel(self, cl_compile.source("memory.cl"), {"W": word}, "strided_copy_into",
                                    label="opencl.copy_into")
            signature = (BUFFER, np.int64, BUFFER) + (np.int64,) * (2 + 3 * MAX_COPY_RANK)
            launch = self._copies_into[itemsize] = cl_compile.Launch(self, knl, (min(256, self.max_wg),), signature)
        return launch

    def _copy(self, itemsize: int) -> cl_compile.Launch:
        """The strided copy for elements of ``itemsize`` bytes (built on first use)."""
        launch = self._copies.get(itemsize)
        if launch is None:
            word = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}[itemsize]
            knl = cl_compile.kernel(self, cl_compile.source("memory.cl"), {"W": word}, "strided_copy",
                                    label="opencl.copy")
            signature = (BUFFER, BUFFER) + (np.int64,) * (2 + 2 * MAX_COPY_RANK)
            launch = self._copies[itemsize] = cl_compile.Launch(self, knl, (min(256, self.max_wg),), signature)
        return launch

    def to_host_strided(self, data: Any) -> np.ndarray:  # pragma: no cover - rank > 6 only
        base = data.base_data
        flat = np.empty(base.size // data.dtype.itemsize, data.dtype)
        import pyopencl as cl

        with self.enqueue_lock:
            cl.enqueue_copy(self.queue, flat, base)
        return np.lib.stride_tricks.as_strided(flat[data.offset // data.dtype.itemsize:], data.shape,
                                               data.strides).copy()

    # -- DLPack: through the host --------------------------------------------------------------
    def to_dlpack(self, data: Any, **kwargs: Any) -> Any:
        return self.to_host(data).__dlpack__(**kwargs)

    def dlpack_device(self, data: Any) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: the capsule holds a host copy

    # -- execution ------------------------------------------------------------------------------
    def synchronize(self) -> None:
        if self._queue is not None:
            self._queue.finish()

    def time(self, fn: Callable[[], Any], *, repeats: int = 20, warmup: int = 3) -> list[float]:
        """Seconds per run from profiling events: first kernel's start to last kernel's end.

        Runs that launch no kernel of this backend (pure pyopencl operations) use the host clock.
        """
        for _ in range(warmup):
            fn()
        self.synchronize()
        times = []
        for _ in range(repeats):
            self._events = []
            t0 = time.perf_counter()
            try:
                fn()
            finally:
                events, self._events = self._events, None
            if events:
                events[-1].wait()
                times.append((events[-1].profile.end - events[0].profile.start) * 1e-9)
            else:
                self.synchronize()
                times.append(time.perf_counter() - t0)
        return times

    def fingerprint(self) -> dict[str, str]:
        import pyopencl as cl

        d = self.cl_device
        return {"name": self.name, "device": self.description, "platform": self.platform.name.strip(),
                "platform_version": self.platform.version, "driver": d.driver_version,
                "opencl": d.version, "pyopencl": cl.VERSION_TEXT}

    def info(self) -> dict[str, str]:
        d = self.cl_device
        exts = sorted(e.removeprefix("cl_") for e in self.extensions)
        shown = ", ".join(e for e in exts if e.startswith("khr_fp") or "subgroup" in e)
        return {
            "platform": f"{self.platform.name.strip()} ({self.platform.version})",
            "device": f"{self.description} [{self.type}]",
            "opencl": f"{d.version}; {d.opencl_c_version}; driver {d.driver_version}",
            "compute units": f"{self.compute_units} @ {self.clock_hz / 1e6:.0f} MHz",
            "max work-group size": str(self.max_wg),
            "local memory": f"{self.local_mem // 1024} KiB",
            "global memory": f"{d.global_mem_size / 2**30:.1f} GiB",
            "extensions": f"{len(exts)} ({shown or 'no fp16/fp64/subgroups'}, ...)",
        }


MAX_COPY_RANK = 6
#: CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES, CL_OUT_OF_HOST_MEMORY, CL_INVALID_BUFFER_SIZE
_OOM_CODES = (-4, -5, -6, -61)


def _collapse(shape: tuple[int, ...], strides: list[int]) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge dims that are contiguous with their inner neighbour."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1] or [(1, 1)]
    out = [list(dims[-1])]
    for n, s in reversed(dims[:-1]):
        inner_n, inner_s = out[0]
        if s == inner_n * inner_s:
            out[0] = [n * inner_n, inner_s]
        else:
            out.insert(0, [n, s])
    return [n for n, _ in out], [s for _, s in out]


def _collapse_pair(shape: tuple[int, ...], a: list[int], b: list[int]) -> tuple[list[int], list[int], list[int]]:
    """:func:`_collapse` for two views of one shape: drop size-1 dims, merge a dim into its inner
    neighbour where both views allow it."""
    dims = [(n, x, y) for n, x, y in zip(shape, a, b) if n != 1] or [(1, 1, 1)]
    out = [list(dims[-1])]
    for n, x, y in reversed(dims[:-1]):
        inner_n, inner_x, inner_y = out[0]
        if x == inner_n * inner_x and y == inner_n * inner_y:
            out[0] = [n * inner_n, inner_x, inner_y]
        else:
            out.insert(0, [n, x, y])
    return [d[0] for d in out], [d[1] for d in out], [d[2] for d in out]


def view_strides(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
                 new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The byte strides of ``new_shape`` as a view of an array of ``shape`` and ``strides``, by
    NumPy's own rule (``np.reshape(copy=False)`` on a stand-in that reads no memory), or None
    when the reshape needs a copy."""
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, np.dtype((np.void, itemsize))), shape, strides)
    try:
        return np.reshape(stand_in, new_shape, copy=False).strides
    except ValueError:
        return None


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _type_name(t: int, cl: Any) -> str:
    if t & cl.device_type.GPU:
        return "gpu"
    if t & cl.device_type.CPU:
        return "cpu"
    return "accelerator"


def alias_map(devices: list[Any], cl: Any) -> dict[int, tuple[str, ...]]:
    """index -> aliases: ``opencl:gpu`` / ``opencl:cpu`` name the first device of that type."""
    seen: set[str] = set()
    out: dict[int, tuple[str, ...]] = {}
    for i, d in enumerate(devices):
        t = _type_name(d.type, cl)
        out[i] = () if t in seen else (f"opencl:{t}",)
        seen.add(t)
    return out


def elem_strides(data: Any) -> tuple[int, ...]:
    """Strides in elements."""
    return tuple(s // data.dtype.itemsize for s in data.strides)


def _span(data: Any) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` of its buffer that a view may touch (empty for a size-0 view)."""
    if not data.size:
        return data.offset, data.offset
    lo = hi = data.offset
    for n, s in zip(data.shape, data.strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + data.dtype.itemsize


# -- discovery: one provider per OpenCL device, made once per process ---------------------------
_providers: list[OpenCLDevice] = []
_discovered = False
_reason = ""


def discover() -> tuple[list[OpenCLDevice], str]:
    """Every OpenCL device of every platform, and why there are none (empty when some exist).

    The providers (and so their contexts) are made once per process: a rebuilt registry reuses
    them, so arrays made earlier still belong to their device.
    """
    global _discovered, _reason
    if not _discovered:
        _discovered, _reason = True, ""
        try:
            import pyopencl as cl
        except ImportError as exc:
            _reason = f"pyopencl not installed ({exc}); pip install pyopencl"
            return [], _reason
        try:
            platforms = cl.get_platforms()
        except cl.Error as exc:  # no ICD loader entries: clGetPlatformIDs fails with -1001
            platforms, _reason = [], f"no OpenCL platform found ({exc}); install an ICD such as pocl-opencl-icd"
        found = []
        for p in platforms:
            try:
                found += p.get_devices()
            except cl.Error:  # a platform with no devices
                continue
        if not platforms and not _reason:
            _reason = "no OpenCL platform found (the ICD loader lists none); install an ICD such as pocl-opencl-icd"
        elif platforms and not found:
            _reason = f"OpenCL platforms {', '.join(p.name for p in platforms)} have no devices"
        aliases = alias_map(found, cl)
        _providers[:] = [OpenCLDevice(i, d, aliases[i]) for i, d in enumerate(found)]
    return list(_providers), _reason


def kernel_dtypes() -> frozenset[str]:
    """The dtypes some present device computes: float32, plus float64 / float16 where a device
    has cl_khr_fp64 / cl_khr_fp16 (kernels check the device itself in ``supports``)."""
    devs, _ = discover()
    out = {"float32"}
    out |= {"float64"} if any(d.has_fp64 for d in devs) else set()
    out |= {"float16"} if any(d.has_fp16 for d in devs) else set()
    return frozenset(out)
