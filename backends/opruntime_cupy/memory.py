"""The ``cuda:N`` devices: CuPy arrays are the device memory; DLPack in and out; CUDA events
for timing; free memory and aliasing as the frontend asks for them; out-of-memory turned into
:class:`opruntime.errors.OutOfMemoryError`.

Kernels of this backend take their device from the Problem (``problem.device.provider``, a
:class:`CudaDevice`), allocate their outputs with :func:`empty` (same error handling) and launch
on the operands' device with :func:`on_device`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import numpy as np

from opruntime import DeviceProvider
from opruntime.errors import OutOfMemoryError

#: Device figures used by the cost models when the device does not report them: name fragment
#: -> (fp32 FMA TFLOP/s, dense fp16/bf16 tensor TFLOP/s, memory TB/s read+write achievable).
_FIGURES = {
    "H200": (66.9, 989.0, 4.1),
    "H100 PCIe": (51.2, 756.0, 1.8),
    "H100": (66.9, 989.0, 3.0),
    "A100": (19.5, 312.0, 1.7),
}


def _oom(what: str, nbytes: float, exc: BaseException) -> OutOfMemoryError:
    free = ""
    try:
        import cupy

        f, t = cupy.cuda.runtime.memGetInfo()
        pool = cupy.get_default_memory_pool()
        free = (f"; {f / 2**30:.2f} GiB free of {t / 2**30:.2f} GiB, CuPy's pool holds "
                f"{pool.total_bytes() / 2**30:.2f} GiB")
    except Exception:
        pass
    return OutOfMemoryError(f"{what}: out of CUDA memory allocating {nbytes / 2**20:.1f} MiB{free}. "
                            f"Use smaller operands, free arrays you no longer need, or call "
                            f"cupy.get_default_memory_pool().free_all_blocks()")


@contextlib.contextmanager
def oom_guard(what: str, nbytes: float = 0.0) -> Iterator[None]:
    """Turn CuPy's out-of-memory error raised in the block into ``OutOfMemoryError``."""
    import cupy

    try:
        yield
    except cupy.cuda.memory.OutOfMemoryError as exc:
        size = getattr(exc, "_size", None) or nbytes
        raise _oom(what, size, exc) from exc


def empty(shape: tuple[int, ...], dtype: Any, what: str = "allocation") -> Any:
    """``cupy.empty`` on the current device, raising ``OutOfMemoryError`` when it cannot."""
    import cupy

    try:
        return cupy.empty(shape, dtype)
    except cupy.cuda.memory.OutOfMemoryError as exc:
        raise _oom(what, math.prod(shape) * np.dtype(dtype).itemsize, exc) from exc


def on_device(data: Any) -> contextlib.AbstractContextManager:
    """A context that makes ``data``'s device current (a no-op when it already is)."""
    import cupy

    dev = data.device.id
    if dev == cupy.cuda.runtime.getDevice():
        return contextlib.nullcontext()
    return cupy.cuda.Device(dev)


@cache
def bfloat16() -> np.dtype | None:
    """NumPy's bfloat16 (ml_dtypes) when CuPy can hold it on the device, else None."""
    try:
        import cupy
        import ml_dtypes

        dt = np.dtype(ml_dtypes.bfloat16)
        x = cupy.asarray(np.arange(4, dtype=np.float32).astype(dt))
        ok = x.dtype == dt and np.array_equal(cupy.asnumpy(x).astype(np.float32), np.arange(4))
        return dt if ok else None
    except Exception:
        return None


class CudaDevice(DeviceProvider):
    """One CUDA device seen through CuPy."""

    kind = "cuda"
    priority = 100
    accelerator = True

    def __init__(self, index: int) -> None:
        import cupy

        self.index = index
        self.name = f"cuda:{index}"
        self.array_types = (cupy.ndarray,)
        self._cupy = cupy
        self._props = cupy.cuda.runtime.getDeviceProperties(index)
        name = self._props["name"]
        self.description = name.decode() if isinstance(name, bytes) else str(name)
        self._device = cupy.cuda.Device(index)

    # -- memory ---------------------------------------------------------------------------
    def from_host(self, array: np.ndarray) -> Any:
        # a plain host-to-device copy: cupy.asarray fills small arrays by value, and a fill of
        # -0.0 (== 0) came back +0.0 (x / -0.0 gave +inf)
        with self._device, oom_guard(f"copy to {self.name}", array.nbytes):
            host = array if array.flags.c_contiguous else array.copy(order="C")  # (0-d stays 0-d)
            raw = host.view(np.uint16) if host.dtype.name == "bfloat16" else host
            out = self._cupy.empty(host.shape, raw.dtype)
            if host.size:
                out.set(raw)
            return out.view(host.dtype) if raw is not host else out

    def to_host(self, data: Any) -> np.ndarray:
        return self._cupy.asnumpy(data)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self._device:
            return empty(tuple(shape), dtype, f"empty on {self.name}")

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self._device, oom_guard(f"zeros on {self.name}", math.prod(shape) * np.dtype(dtype).itemsize):
            return self._cupy.zeros(tuple(shape), dtype)

    def copy(self, data: Any) -> Any:
        with self._device, oom_guard(f"copy on {self.name}", data.nbytes):
            return data.copy()

    def astype(self, data: Any, dtype: np.dtype) -> Any:
        with self._device, oom_guard(f"astype on {self.name}", data.size * np.dtype(dtype).itemsize):
            return data.astype(dtype, order="C")  # the Problem describes a cast operand as C-contiguous

    def owns(self, data: Any) -> bool:
        return isinstance(data, self.array_types) and data.device.id == self.index

    # -- views: CuPy's own (views share the buffer; a reshape the strides forbid copies) ---------
    def reshape(self, data: Any, shape: tuple[int, ...]) -> Any:
        if data.flags.c_contiguous:  # a view: no kernel, no allocation, no device switch
            return data.reshape(shape)
        with self._device, oom_guard(f"reshape on {self.name}", data.nbytes):
            words = _words(data)  # bfloat16 copied as 16-bit words: CuPy's copy kernels need no bf16 type
            return data.reshape(shape) if words is None else words.reshape(shape).view(data.dtype)

    def permute(self, data: Any, axes: tuple[int, ...]) -> Any:
        return data.transpose(axes)

    def getitem(self, data: Any, index: tuple[int | slice, ...]) -> Any:
        n, shape = len(index), data.shape  # trailing whole-dim slices left out: CuPy pays per entry
        while n and (e := index[n - 1]).__class__ is slice and e.start == 0 and e.step == 1 and e.stop == shape[n - 1]:
            n -= 1
        return data[(*index[:n], Ellipsis)]

    def concat(self, datas: Any, axis: int) -> Any:
        nbytes = sum(d.nbytes for d in datas)
        with self._device, oom_guard(f"concat on {self.name}", nbytes):
            words = [_words(d) for d in datas]
            if words[0] is None:
                return self._cupy.concatenate(list(datas), axis=axis)
            return self._cupy.concatenate(words, axis=axis).view(datas[0].dtype)

    def free_memory(self) -> int | None:
        """What the driver has free on this device plus the free blocks of CuPy's pool there
        (CuPy frees those and retries when the driver alone cannot serve an allocation), capped
        by the pool's limit when one is set; None when the driver cannot be asked."""
        cp = self._cupy
        try:
            with self._device:
                free, _ = cp.cuda.runtime.memGetInfo()
                pool = cp.get_default_memory_pool()  # its byte counts are the current device's
                room = free + pool.free_bytes()
                limit = pool.get_limit()
                if limit:  # pool.set_limit / CUPY_GPU_MEMORY_LIMIT: what the pool may still hand out
                    room = min(room, limit - pool.used_bytes())
        except cp.cuda.runtime.CUDARuntimeError:
            return None
        return max(int(room), 0)

    def shares_memory(self, a: Any, b: Any) -> bool:
        """True when the byte ranges of two CuPy arrays overlap (views of one buffer included);
        an array of size 0 holds no bytes and overlaps nothing. Other objects: identity."""
        if not (isinstance(a, self.array_types) and isinstance(b, self.array_types)):
            return a is b
        if a.size == 0 or b.size == 0:
            return False
        lo_a, hi_a = _extent(a)
        lo_b, hi_b = _extent(b)
        return lo_a < hi_b and lo_b < hi_a

    def random_normal(self, shape: tuple[int, ...], dtype: np.dtype, seed: int) -> Any:
        """Drawn on the device by cuRAND rather than on the host and copied."""
        cp = self._cupy
        wide = np.float64 if dtype == np.float64 else np.float32
        with self._device, oom_guard(f"random operands on {self.name}", math.prod(shape) * 4):
            data = cp.random.RandomState(seed).standard_normal(tuple(shape), dtype=wide)
            return data if data.dtype == dtype else data.astype(dtype)

    # -- DLPack ---------------------------------------------------------------------------
    def holds_dlpack(self, device_type: int, device_id: int) -> bool:
        """CUDA memory (and managed memory) of this device's ordinal."""
        return device_type in (2, 13) and device_id == self.index

    def from_dlpack(self, obj: Any) -> Any:
        kind = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else None
        if kind in (2, 13):  # kDLCUDA, kDLCUDAManaged: zero-copy when on this device
            with self._device:
                arr = self._cupy.from_dlpack(obj)
            if arr.device.id == self.index:
                return arr
            with self._device, oom_guard(f"copy to {self.name}", arr.nbytes):
                return arr.copy()
        return self.from_host(np.from_dlpack(obj))

    # -- execution ------------------------------------------------------------------------
    def synchronize(self) -> None:
        self._device.synchronize()

    def time(self, fn: Callable[[], Any], *, repeats: int = 20, warmup: int = 3) -> list[float]:
        """Seconds per run of ``fn``, from CUDA events recorded on the current stream."""
        cp = self._cupy
        with self._device:
            for _ in range(warmup):
                fn()
            stream = cp.cuda.get_current_stream()
            events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeats)]
            stream.synchronize()
            for start, stop in events:
                start.record(stream)
                fn()
                stop.record(stream)
            events[-1][1].synchronize()
            return [cp.cuda.get_elapsed_time(s, e) * 1e-3 for s, e in events]

    def roofline(self) -> dict[str, Any]:
        """The roofs of :meth:`figures` (the cost models' own): memory bytes/s and peak FLOP/s per
        dtype (float64 at half the fp32 rate, as the cost models assume)."""
        f32, f16, bw = self.figures()
        return {"bytes_per_s": bw,
                "flops_per_s": {"float32": f32, "float16": f16, "bfloat16": f16, "float64": f32 / 2}}

    def fingerprint(self) -> dict[str, str]:
        rt = self._cupy.cuda.runtime
        return {
            "name": self.name,
            "description": self.description,
            "compute_capability": self._device.compute_capability,
            "driver": str(rt.driverGetVersion()),
            "runtime": str(rt.runtimeGetVersion()),
            "cupy": self._cupy.__version__,
        }

    def capture(self, fn: Callable[[list[Any]], list[Any]], inputs: Any) -> Any:
        """A CUDA graph of ``fn`` on this device (``graph.CudaGraph``: a private stream and pool)."""
        from .graph import CudaGraph

        return CudaGraph(self.index, fn, inputs)

    def mesh_engine(self, members: Any) -> Any:
        """NCCL communicators over the members (``mesh.CudaMesh``), made once per mesh."""
        from .mesh import CudaMesh

        return CudaMesh(members)

    def info(self) -> dict[str, str]:
        p = self._props
        free, total = self._cupy.cuda.runtime.memGetInfo() if self.index == self._cupy.cuda.runtime.getDevice() \
            else (None, p.get("totalGlobalMem", 0))
        out = {
            "compute capability": self._device.compute_capability,
            "multiprocessors": str(p.get("multiProcessorCount", "?")),
            "memory": f"{total / 2**30:.1f} GiB" + (f" ({free / 2**30:.1f} GiB free)" if free is not None else ""),
            "L2 cache": f"{p.get('l2CacheSize', 0) / 2**20:.0f} MiB",
            "shared memory per block (opt-in)": f"{p.get('sharedMemPerBlockOptin', 0) // 1024} KiB",
            "cupy": self._cupy.__version__,
            "bfloat16": "yes (ml_dtypes)" if bfloat16() is not None else "no (CuPy cannot hold ml_dtypes.bfloat16)",
        }
        from . import cudnn, linear  # (neither imports a GPU library at import)

        out.update(cudnn.info())  # "cudnn": "9.19.0 (frontend 1.32.0)" or "unavailable: <why>"
        out["cublaslt (nvmath)"] = linear.nvmath_missing() or "yes"
        return out

    # -- figures for the cost models --------------------------------------------------------
    @property
    def sm_count(self) -> int:
        return int(self._props.get("multiProcessorCount", 132))

    def figures(self) -> tuple[float, float, float]:
        """(fp32 FLOP/s, fp16 tensor FLOP/s, memory bytes/s) for the cost models."""
        return figures_for(self.description, self.sm_count)


def _words(data: Any) -> Any:
    """A bfloat16 (ml_dtypes) array seen as uint16 words, or None for the dtypes CuPy computes."""
    return data.view(np.uint16) if np.dtype(data.dtype).name == "bfloat16" else None


def _extent(x: Any) -> tuple[int, int]:
    """[first, last + 1) byte addresses a non-empty CuPy array touches (negative strides too)."""
    lo = hi = x.data.ptr
    for n, stride in zip(x.shape, x.strides):
        span = (n - 1) * stride
        if span < 0:
            lo += span
        else:
            hi += span
    return lo, hi + x.itemsize


def figures_for(description: str, sms: int = 132) -> tuple[float, float, float]:
    """Peak figures for a device name (a table, scaled by SM count when the name is unknown)."""
    for frag, (f32, f16, bw) in _FIGURES.items():
        if frag in description:
            return f32 * 1e12, f16 * 1e12, bw * 1e12
    f32, f16, bw = _FIGURES["H100"]
    scale = sms / 132
    return f32 * 1e12 * scale, f16 * 1e12 * scale, bw * 1e12 * scale


def devices() -> list[CudaDevice]:
    """Every CUDA device CuPy sees; ``BackendUnavailable`` with the reason when none."""
    from opruntime.errors import BackendUnavailable

    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install failing at import
        raise BackendUnavailable(f"cupy not installed ({type(exc).__name__}: {exc})", kinds=["cuda"]) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise BackendUnavailable(f"no CUDA device: {exc}", kinds=["cuda"]) from None
    if count == 0:
        raise BackendUnavailable("no CUDA device: cudaGetDeviceCount() returned 0", kinds=["cuda"])
    return [CudaDevice(i) for i in range(count)]
