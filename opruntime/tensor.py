"""Tensor: a handle on an array that lives on one device."""

from __future__ import annotations

from typing import Any

import numpy as np

from .devices import Device
from .errors import DtypeError


class Tensor:
    """An array on a device: the result of every operator, and a way to keep data on a device.

    The native array (a NumPy, CuPy, pyopencl or JAX array) is ``t.data``; ``t.numpy()``
    copies to the host. Tensors are created with :func:`opruntime.tensor` or returned by
    operators; they are not meant to be mutated in place.
    """

    __slots__ = ("data", "device")

    data: Any
    device: Device

    def __init__(self, data: Any, device: Device | str | None = None, dtype: Any = None) -> None:
        t = tensor(data, device=device, dtype=dtype)
        self.data, self.device = t.data, t.device

    @classmethod
    def _wrap(cls, data: Any, device: Device) -> Tensor:
        t = object.__new__(cls)
        t.data = data
        t.device = device
        return t

    # -- array facts ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.data.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.data.shape:
            raise TypeError("len() of a 0-d Tensor")
        return self.data.shape[0]

    # -- moving data ----------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A host NumPy copy (or the array itself on the ``cpu`` device)."""
        return self.device.provider.to_host(self.data)

    def to(self, device: Device | str) -> Tensor:
        """This tensor on ``device`` (itself if already there); copies through the host."""
        dev = Device(device)
        if dev == self.device:
            return self
        return Tensor._wrap(dev.provider.from_host(np.ascontiguousarray(self.numpy())), dev)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.numpy()
        if dtype is not None and out.dtype != dtype:
            return out.astype(dtype)
        return out.copy() if copy else out

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.device.provider.to_dlpack(self.data, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device.provider.dlpack_device(self.data)

    def __repr__(self) -> str:
        head = f"Tensor(shape={self.shape}, dtype={self.dtype}, device={self.device.name!r}"
        if self.size <= 1000:
            body = np.array2string(self.numpy(), separator=", ", prefix="       ", threshold=20, edgeitems=3)
            return f"{head},\n       {body})"
        return head + ")"


def tensor(data: Any, device: Device | str | None = None, dtype: Any = None) -> Tensor:
    """Make a Tensor from a Tensor, a native device array, any ``__dlpack__`` object, a NumPy
    array, a list or a scalar.

    Args:
        data: the values.
        device: where to put them; default: where ``data`` already lives (a Tensor or native
            device array), else the configured device (``opr.configure`` / ``opr.device``).
        dtype: convert to this dtype (on the device).

    Example:
        >>> t = opr.tensor([[1.0, 2.0]], device="cpu")
    """
    from .config import resolve_device, settings
    from .plugins import registry

    dev = Device(device) if device is not None else None
    if isinstance(data, Tensor):
        t = data if dev is None else data.to(dev)
    else:
        owner = None if isinstance(data, np.ndarray) else registry().device_of(data)
        if owner is not None and (dev is None or dev == owner):
            t = Tensor._wrap(data, owner)
        else:
            dev = dev or resolve_device(settings(), "tensor")
            t = Tensor._wrap(dev.provider.from_host(_host_array(data)), dev)
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt.kind not in "fiub" and dt.name != "bfloat16":
            raise DtypeError(f"tensor: unsupported dtype {dt}")
        if t.dtype != dt:
            t = Tensor._wrap(t.device.provider.astype(t.data, dt), t.device)
    return t


def _host_array(data: Any) -> np.ndarray:
    if hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
        try:
            return np.from_dlpack(data)
        except Exception:  # a device-resident DLPack object NumPy cannot read: go through __array__
            pass
    return np.asarray(data)
