"""The ``demo`` device: its memory type and its :class:`~opruntime.DeviceProvider`.

A real accelerator keeps data in its own memory; :class:`DemoArray` plays that part with a host
buffer that only this backend reads or writes, so that every copy in and out is explicit, just as
it would be for a GPU. The frontend needs little of a native array: ``shape``, ``dtype``,
``strides`` (bytes) and ``reshape``; the provider does the rest.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opruntime import DeviceProvider


class DemoArray:
    """An array in the demo device's memory."""

    __slots__ = ("buf",)

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf

    shape = property(lambda self: self.buf.shape)
    dtype = property(lambda self: self.buf.dtype)
    strides = property(lambda self: self.buf.strides)
    ndim = property(lambda self: self.buf.ndim)

    def reshape(self, *shape: Any) -> DemoArray:
        return DemoArray(self.buf.reshape(*shape))

    def astype(self, dtype: Any) -> DemoArray:
        return DemoArray(self.buf.astype(dtype))

    def __repr__(self) -> str:
        return f"DemoArray(shape={self.shape}, dtype={self.dtype})"


class DemoDevice(DeviceProvider):
    """Device ``demo:<index>``. Only ``from_host`` and ``to_host`` are required; the rest of
    :class:`~opruntime.DeviceProvider` has defaults built on them, overridden here where the
    device can do better."""

    kind = "demo"
    priority = 1  # never the default device: users ask for it by name
    array_types = (DemoArray,)  # native arrays passed to an operator are adopted by type

    def __init__(self, index: int = 0) -> None:
        self.name = f"demo:{index}"
        self.description = "opruntime demo device (NumPy in its own memory)"

    # -- memory --------------------------------------------------------------------------------
    def from_host(self, array: np.ndarray) -> DemoArray:
        return DemoArray(np.array(array, copy=True))  # a real device copies host -> device here

    def to_host(self, data: DemoArray) -> np.ndarray:
        return np.array(data.buf, copy=True)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> DemoArray:
        return DemoArray(np.empty(shape, dtype))

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> DemoArray:
        return DemoArray(np.zeros(shape, dtype))

    # -- DLPack: expose the buffer (a GPU backend would export its device pointer) --------------
    def to_dlpack(self, data: DemoArray, **kwargs: Any) -> Any:
        return data.buf.__dlpack__(**kwargs)

    def dlpack_device(self, data: DemoArray) -> tuple[int, int]:
        return data.buf.__dlpack_device__()

    # -- facts -----------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, str]:
        """What tuning results are keyed on: change it when the device or the stack changes."""
        return {"name": self.name, "numpy": np.__version__}

    def info(self) -> dict[str, str]:
        return {"memory": "host buffers", "numpy": np.__version__}
