"""Tensor: a handle on an array that lives on one device."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .devices import Device
from .errors import DtypeError


class Tensor:
    """An array on a device: the result of every operator, and a way to keep data on a device.

    The native array (a NumPy, CuPy, pyopencl or JAX array) is ``t.data``; ``t.numpy()``
    copies to the host. Tensors are created with :func:`opruntime.tensor` or returned by
    operators. ``data`` and ``device`` are read-only (the call path keeps each Tensor's cache key);
    writing into the array's elements is the caller's business, as with any array.
    """

    __slots__ = ("_data", "_device", "_key")

    def __init__(self, data: Any, device: Device | str | None = None, dtype: Any = None) -> None:
        t = tensor(data, device=device, dtype=dtype)
        self._data, self._device, self._key = t._data, t._device, None

    @classmethod
    def _wrap(cls, data: Any, device: Device) -> Tensor:
        t = object.__new__(cls)
        t._data, t._device, t._key = data, device, None
        return t

    @property
    def data(self) -> Any:
        """The native array (NumPy, CuPy, pyopencl or JAX), read-only: a Tensor never changes."""
        return self._data

    @property
    def device(self) -> Device:
        return self._device

    def _signature(self) -> int:
        """This operand's part of a plan-cache key (:func:`signature_id`), computed on the first
        call that uses the Tensor and kept."""
        k = self._key
        if k is None:
            k = self._key = signature_id(self._device.name, self._data)
        return k

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


_SIGNATURES: dict[tuple, int] = {}
_next_signature = itertools.count(1).__next__


def signature_id(device: str, data: Any) -> int:
    """A small int standing for an array's (device name, shape, dtype, strides) in plan-cache keys.

    Keys hold these instead of the tuples: an int hashes at once, a shape and a dtype do not. Ids
    are never reused (the table may start over; a fragment then gets a new id, so an old Tensor's
    id can only miss, never find another problem's plan).
    """
    fragment = (device, data.shape, data.dtype, getattr(data, "strides", None))
    i = _SIGNATURES.get(fragment)
    if i is None:
        if len(_SIGNATURES) >= 1 << 16:
            _SIGNATURES.clear()
        i = _SIGNATURES.setdefault(fragment, _next_signature())
    return i


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
