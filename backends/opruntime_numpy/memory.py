"""The ``cpu`` device: host memory is device memory, so placement copies nothing."""

from __future__ import annotations

import os
import platform
from typing import Any

import numpy as np

from opruntime import DeviceProvider
from opruntime.errors import OutOfMemoryError


class CpuDevice(DeviceProvider):
    kind = "cpu"
    name = "cpu"
    priority = 50
    array_types = (np.ndarray,)
    placement_free = True

    def __init__(self) -> None:
        self.description = platform.processor() or platform.machine()

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, data: Any) -> np.ndarray:
        return data

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        try:
            return np.empty(shape, dtype)
        except MemoryError as exc:
            raise OutOfMemoryError(f"cpu: cannot allocate a {np.dtype(dtype).name} array of shape {tuple(shape)}: "
                                   f"{exc}") from exc

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        try:
            return np.zeros(shape, dtype)
        except MemoryError as exc:
            raise OutOfMemoryError(f"cpu: cannot allocate a {np.dtype(dtype).name} array of shape {tuple(shape)}: "
                                   f"{exc}") from exc

    def concat(self, datas: Any, axis: int) -> np.ndarray:
        try:
            return np.concatenate(datas, axis=axis)
        except MemoryError as exc:
            raise OutOfMemoryError(f"cpu: cannot allocate the result of concat ({datas[0].dtype} parts of shapes "
                                   f"{', '.join(str(d.shape) for d in datas)}): {exc}") from exc

    def from_dlpack(self, obj: Any) -> np.ndarray:
        return np.from_dlpack(obj)

    def to_dlpack(self, data: np.ndarray, **kwargs: Any) -> Any:
        """NumPy's own capsule, except for the dtypes NumPy does not define and so will not
        export (bfloat16, ml_dtypes' kind "V"): those through :func:`opruntime.dlpack.export`,
        over the same memory (``torch.from_dlpack`` of a bfloat16 Tensor on cpu shares it)."""
        if data.dtype.kind == "V":
            from opruntime import dlpack

            return dlpack.export(data, **kwargs)
        return data.__dlpack__(**kwargs)

    def shares_memory(self, a: Any, b: Any) -> bool:
        return np.may_share_memory(a, b)

    def free_memory(self) -> int | None:
        return available_memory()

    def fingerprint(self) -> dict[str, str]:
        return {"name": self.name, "cpu": self.description, "cores": str(os.cpu_count()), "numpy": np.__version__}

    def info(self) -> dict[str, str]:
        """Cores, NumPy, and numba: its version, threads and cache, or why its kernels are absent."""
        from . import jit

        return {"cores": str(os.cpu_count()), "numpy": np.__version__, **jit.info()}


def available_memory() -> int | None:
    """Bytes of host memory a new allocation can take now (Linux: MemAvailable), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def compute_dtype(dtype: str) -> np.dtype:
    """float16 is computed in float32 (NumPy's float16 BLAS path is slow and imprecise)."""
    return np.dtype(np.float32 if dtype == "float16" else dtype)
