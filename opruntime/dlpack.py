"""DLPack, read directly: the device codes, and a reader for the capsules NumPy cannot import.

``np.from_dlpack`` refuses dtypes NumPy lacks (a torch ``bfloat16`` tensor raises "Unsupported
dtype in DLTensor"), and CuPy's ``from_dlpack`` refuses some too. :func:`read` takes the capsule of
any ``__dlpack__`` object apart (the ``DLTensor`` of the DLPack standard, legacy capsule named
``dltensor``) without a copy; :func:`host_view` makes a NumPy view of host memory from it
(``bfloat16`` as ml_dtypes' ``bfloat16``, the project's bf16 dtype). The capsule is never
renamed: it stays alive as long as the view (the view's base holds it) and its producer's
destructor frees the memory after the last view is gone, as the standard asks of a consumer
that does not take ownership.

This module imports no device stack (ctypes and NumPy only).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InputTypeError

#: ``DLDeviceType`` codes (dlpack.h)
CPU, CUDA, CUDA_HOST, OPENCL, VULKAN, METAL, VPI, ROCM, ROCM_HOST, EXT_DEV, CUDA_MANAGED, ONE_API = \
    1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14
#: device types whose memory the host reads directly: a DLPack object there is host data
HOST_TYPES = (CPU, CUDA_HOST, ROCM_HOST)
#: device code -> the name used in messages
DEVICE_NAMES = {CPU: "CPU", CUDA: "CUDA", CUDA_HOST: "CUDA host (pinned)", OPENCL: "OpenCL", VULKAN: "Vulkan",
                METAL: "Metal", VPI: "VPI", ROCM: "ROCm", ROCM_HOST: "ROCm host", EXT_DEV: "extension device",
                CUDA_MANAGED: "CUDA managed", ONE_API: "oneAPI"}

_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):  # the first member of the legacy DLManagedTensor
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class View:
    """One DLPack tensor: where its first element is, its layout, and the capsule that keeps the
    memory alive (hold ``owner`` as long as the memory is used)."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes
    dtype: np.dtype
    device: tuple[int, int]  # (DLDeviceType, device id)
    owner: Any

    @property
    def nbytes(self) -> int:
        """The bytes from the first element to one past the last (strides >= 0), 0 when empty."""
        if 0 in self.shape:
            return 0
        return sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + self.dtype.itemsize


def dtype_of(code: int, bits: int, lanes: int = 1) -> np.dtype:
    """The NumPy dtype of a ``DLDataType`` (``bfloat16``: ml_dtypes'); InputTypeError for vector
    lanes and codes NumPy has no dtype for."""
    if lanes == 1:
        if code == _BFLOAT and bits == 16:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        kind = {_INT: "i", _UINT: "u", _FLOAT: "f", _COMPLEX: "c", _BOOL: "b"}.get(code)
        if kind is not None:
            try:
                return np.dtype(f"{kind}{bits // 8}") if kind != "b" else np.dtype(bool)
            except TypeError:
                pass
    raise InputTypeError(f"DLPack dtype (code {code}, {bits} bits, {lanes} lanes) has no NumPy dtype; convert the "
                         f"array to float32, float16, bfloat16 or float64 first")


def read(obj: Any, **kwargs: Any) -> View:
    """Take ``obj.__dlpack__(**kwargs)`` apart without copying. The memory stays valid while the
    returned view's ``owner`` (the capsule) lives."""
    capsule = obj.__dlpack__(**kwargs)
    try:
        address = _get_pointer(capsule, b"dltensor")
    except ValueError as exc:  # a versioned or used capsule
        raise InputTypeError(f"{type(obj).__name__}.__dlpack__() did not give a DLPack 'dltensor' capsule "
                             f"({exc})") from None
    t = _Tensor.from_address(address)
    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim))
    dtype = dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    if t.strides:
        strides = tuple(t.strides[i] * dtype.itemsize for i in range(ndim))
    else:  # NULL strides: C-contiguous
        strides, acc = [], dtype.itemsize
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= max(n, 1)
        strides = tuple(strides)
    return View((t.data or 0) + t.byte_offset, shape, strides, dtype, (t.device.device_type, t.device.device_id),
                capsule)


class _HostBuffer:
    """Gives NumPy the array interface of a DLPack view of host memory, and keeps its capsule."""

    def __init__(self, view: View, typestr: str) -> None:
        self.view = view
        self.__array_interface__ = {"shape": view.shape, "typestr": typestr, "data": (view.ptr, True),
                                    "strides": view.strides, "version": 3}


def host_view(obj: Any) -> np.ndarray:
    """A read-only NumPy view of a DLPack object in host memory, any dtype :func:`dtype_of` knows
    (bfloat16 included), without a copy."""
    v = read(obj)
    if v.device[0] not in HOST_TYPES:
        raise InputTypeError(f"{type(obj).__name__} lives on a {device_name(v.device)} device, not in host memory")
    if 0 in v.shape or not v.ptr:
        return np.zeros(v.shape, v.dtype)
    raw = np.dtype(f"u{v.dtype.itemsize}") if v.dtype.kind == "V" else v.dtype  # bfloat16: its words
    arr = np.asarray(_HostBuffer(v, raw.str))
    return arr if raw is v.dtype else arr.view(v.dtype)


def device_name(device: tuple[int, int]) -> str:
    """``(2, 0)`` as ``"CUDA 0"``, for messages."""
    return f"{DEVICE_NAMES.get(device[0], f'DLPack device type {device[0]}')} {device[1]}"
