"""Tensor: an immutable handle on an array that lives on one device, and the rules for host data.

The memory rule, the same on every device: a Tensor never changes because the caller changed an
array (``opr.tensor`` copies what it is given, on the ``cpu`` device too), and the caller cannot
change a Tensor through ``.numpy()`` (a copy, or on ``cpu`` a read-only view). Host data is taken
by one rule on every device (:func:`host_array`): native byte order, no masked arrays, no ragged
or object sequences, Python ints as float32.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .config import settings
from .devices import Device
from .errors import DtypeError, InputTypeError, ShapeError
from .plugins import registry, resolve_device


class Tensor:
    """An array on a device: the result of every operator, and a way to keep data on a device.

    The native array (a NumPy, CuPy, pyopencl or JAX array) is ``t.data``, shared with the
    Tensor: read it, never write into it. ``t.numpy()`` gives the values on the host. Tensors are
    created with :func:`opruntime.tensor` or returned by operators, and never change.
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
        """The native array (NumPy, CuPy, pyopencl or JAX); the Tensor's own: do not write into it."""
        return self._data

    @property
    def device(self) -> Device:
        """The device the values live on."""
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
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._data.dtype)

    @property
    def ndim(self) -> int:
        return len(self._data.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._data.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self._data.shape:
            raise TypeError("len() of a 0-d Tensor")
        return self._data.shape[0]

    # -- moving data ----------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The values as a host NumPy array: a copy, or on the ``cpu`` device a read-only view."""
        prov = self._device.provider
        out = prov.to_host(self._data)
        if prov.placement_free:  # host memory is the Tensor's own: lend it read-only
            out = out.view()
            out.flags.writeable = False
        return out

    def to(self, device: Device | str) -> Tensor:
        """This tensor on ``device`` (itself if already there); copies through the host."""
        dev = Device(device)
        if dev == self._device:
            return self
        return Tensor._wrap(dev.provider.from_host(np.ascontiguousarray(self._device.provider.to_host(self._data))),
                            dev)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.numpy()
        if dtype is not None and out.dtype != dtype:
            return out.astype(dtype)
        return out.copy() if copy else out

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._device.provider.to_dlpack(self._data, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device.provider.dlpack_device(self._data)

    def __repr__(self) -> str:
        head = f"Tensor(shape={self.shape}, dtype={self.dtype}, device={self._device.name!r}"
        if self.size <= 1000:
            body = np.array2string(self.numpy(), separator=", ", prefix="       ", threshold=20, edgeitems=3)
            return f"{head},\n       {body})"
        return head + ")"


_SIGNATURES: dict[tuple, int] = {}
_next_signature = itertools.count(1).__next__


def signature_id(device: str, data: Any) -> int:
    """A small int standing for an array's (device name, shape, dtype, strides) in plan-cache keys.

    Keys hold these instead of the tuples: an int hashes at once, a shape and a dtype do not. Ids
    are never reused (the table starts over past 65536 fragments; a fragment then gets a new id,
    so an old Tensor's id can only miss, never find another problem's plan).
    """
    fragment = (device, data.shape, data.dtype, getattr(data, "strides", None))
    i = _SIGNATURES.get(fragment)
    if i is None:
        if len(_SIGNATURES) >= 1 << 16:
            _SIGNATURES.clear()
        i = _SIGNATURES.setdefault(fragment, _next_signature())
    return i


def host_array(op: str, x: Any) -> np.ndarray:
    """Host data as the NumPy array every device is given: the one rule for all of them.

    * a masked array is refused (its mask would be honoured on one device and lost on another);
    * ragged nested sequences and object arrays are refused;
    * Python (nested) lists and scalars of ints or bools become float32 (NumPy and other arrays
      keep their dtype: integer arrays are refused later, by the operator, naming the dtype);
    * a non-native byte order (``>f4`` on a little-endian host) is converted to native, values kept.

    Raises:
        InputTypeError, ShapeError: naming ``op`` and what to do.
    """
    if isinstance(x, np.ma.MaskedArray):
        raise InputTypeError(f"{op}: masked arrays are not supported (the mask would be lost); pass "
                             f"x.filled(value) or x.data")
    arr: np.ndarray | None = None
    if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        try:
            arr = np.from_dlpack(x)
        except Exception:  # a device-resident DLPack object NumPy cannot read: go through __array__
            arr = None
    if arr is None:
        try:
            arr = np.asarray(x)
        except ValueError as exc:
            raise ShapeError(f"{op}: the operand is not a rectangular array ({exc}); give nested lists of equal "
                             f"lengths or an array") from None
    if arr.dtype.kind in "OSUVMm" and arr.dtype.name != "bfloat16":  # ml_dtypes' bfloat16 is of kind "V"
        raise InputTypeError(f"{op}: operands must be numeric arrays; got a {arr.dtype} array from "
                             f"{type(x).__name__} (ragged lists, strings and objects are not arrays of numbers)")
    if arr.dtype.kind in "biu" and not isinstance(x, (np.ndarray, np.generic)) and not hasattr(x, "__dlpack__") \
            and not hasattr(x, "__array__"):
        arr = arr.astype(np.float32)  # Python lists / scalars of ints: float32 (documented rule)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def tensor(data: Any, device: Device | str | None = None, dtype: Any = None) -> Tensor:
    """Make a Tensor from a Tensor, a native device array, any ``__dlpack__`` object, a NumPy
    array, a list or a scalar. The values are copied: changing ``data`` later leaves the Tensor
    as it is (on every device).

    Args:
        data: the values.
        device: where to put them; default: where ``data`` already lives (a Tensor or native
            device array), else the configured device (``opr.configure`` / ``opr.device``).
        dtype: convert to this dtype (on the device).

    Example:
        >>> t = opr.tensor([[1.0, 2.0]], device="cpu")
    """
    dev = Device(device) if device is not None else None
    if isinstance(data, Tensor):
        t = data if dev is None else data.to(dev)
    else:
        owner = None if isinstance(data, np.ndarray) else registry().device_of(data)
        if owner is not None and (dev is None or dev == owner):
            t = Tensor._wrap(owner.provider.copy(data), owner)
        else:
            dev = dev or resolve_device(settings(), "tensor")
            host = host_array("tensor", data)
            prov = dev.provider
            placed = prov.from_host(host)
            if placed is host or prov.placement_free and np.shares_memory(placed, host):
                placed = placed.copy()  # the caller's array stays the caller's
            t = Tensor._wrap(placed, dev)
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt.kind not in "fiub" and dt.name != "bfloat16":
            raise DtypeError(f"tensor: unsupported dtype {dt}")
        if t.dtype != dt:
            t = Tensor._wrap(t.device.provider.astype(t.data, dt), t.device)
    return t
