"""DLPack, read and written directly: the device codes, a reader for the capsules NumPy cannot
import, and an exporter for the host arrays NumPy cannot export (:func:`export`: bfloat16, which
the cpu device's ``to_dlpack`` hands to ``torch.from_dlpack`` this way).

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


# -- export: a capsule for host arrays NumPy cannot export (bfloat16) --------------------------------
#: ``DLManagedTensorVersioned.flags`` bits (dlpack.h 1.0)
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2
#: the DLPack version this exporter writes into a versioned capsule
VERSION = (1, 0)

_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):  # DLManagedTensor (the legacy capsule "dltensor")
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):  # DLManagedTensorVersioned (the capsule "dltensor_versioned")
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


#: address of an exported struct -> what must outlive it: the struct, its shape and strides, the array
_LIVE: dict[int, tuple[Any, ...]] = {}


@_Deleter
def _delete(address: int | None) -> None:
    """The ``deleter`` of every exported tensor: the consumer is done, the array may go. ctypes
    takes the GIL for the call, so any thread may call it, as the standard allows."""
    _LIVE.pop(address or 0, None)


# raw PyObject* prototypes for the capsule destructor, which runs while the capsule is being freed:
# a py_object argument would take a new reference to it (and free it a second time)
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid",
                                                                                   ctypes.pythonapi))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer",
                                                                                        ctypes.pythonapi))
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NAMES = {False: b"dltensor", True: b"dltensor_versioned"}  # module constants: the capsule keeps their char*


@_Destructor
def _destroy_capsule(capsule: int | None) -> None:
    """A capsule freed unconsumed (still named ``dltensor``/``dltensor_versioned``) deletes its
    tensor; a consumer renames the capsule ``used_...`` and calls the deleter itself when done."""
    for name in _NAMES.values():
        if capsule and _raw_is_valid(capsule, name):
            _delete(_raw_get_pointer(capsule, name))
            return


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _Destructor)(
    ("PyCapsule_New", ctypes.pythonapi))

#: the ``DLDataType`` of a NumPy dtype kind (bfloat16 below, by name: ml_dtypes' dtypes are kind "V")
_CODES = {"i": _INT, "u": _UINT, "f": _FLOAT, "c": _COMPLEX, "b": _BOOL}


def _data_type(dtype: np.dtype) -> tuple[int, int]:
    if dtype.name == "bfloat16":
        return _BFLOAT, 16
    if dtype.kind in _CODES:
        return _CODES[dtype.kind], dtype.itemsize * 8
    raise BufferError(f"DLPack has no type for the NumPy dtype {dtype}")


def export(array: np.ndarray, *, stream: Any = None, max_version: tuple[int, int] | None = None,
           dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
    """``array.__dlpack__(...)`` for a host array of any dtype :func:`dtype_of` reads, bfloat16
    included (NumPy's own ``__dlpack__`` refuses dtypes NumPy does not define): a DLPack capsule
    over the array's memory, without a copy unless ``copy=True``.

    The capsule is versioned (``dltensor_versioned``, DLPack 1.0, with the read-only flag) when
    the consumer asks for ``max_version >= (1, 0)``, as ``torch.from_dlpack`` does; else the legacy
    ``dltensor``, which cannot say read-only, so a read-only array is refused then (BufferError,
    as NumPy does). The struct, its shape and strides and a reference to ``array`` stay in a
    module table until the consumer calls the deleter (or the capsule is freed unconsumed), so
    the memory outlives every Python reference the producer had (``del t``).
    """
    if stream is not None:
        raise BufferError("a host array takes no stream: call __dlpack__ with stream=None")
    if dl_device is not None and tuple(dl_device) != (CPU, 0):
        raise BufferError(f"a host array exports to the CPU (DLPack device ({CPU}, 0)), not {tuple(dl_device)}")
    copied = False
    if copy or any(s % array.itemsize for s in array.strides):  # DLPack strides count elements
        if copy is False:
            raise BufferError("this array's strides are not whole elements: DLPack needs a copy (copy=False given)")
        array, copied = np.array(array, copy=True), True
    versioned = max_version is not None and tuple(max_version)[0] >= VERSION[0]
    if not versioned and not array.flags.writeable:
        raise BufferError("cannot export a read-only array through a legacy DLPack capsule (it cannot say "
                          "read-only): ask for max_version=(1, 0)")
    code, bits = _data_type(array.dtype)
    ndim = array.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // array.itemsize for s in array.strides))
    managed: Any = _ManagedVersioned() if versioned else _Managed()
    t = managed.dl_tensor
    t.data = array.ctypes.data if array.size else None
    t.device = _Device(CPU, 0)
    t.ndim = ndim
    t.dtype = _DataType(code, bits, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    managed.deleter = _delete
    if versioned:
        managed.version = _Version(*VERSION)
        managed.flags = (0 if array.flags.writeable else FLAG_READ_ONLY) | (FLAG_IS_COPIED if copied else 0)
    address = ctypes.addressof(managed)
    _LIVE[address] = (managed, shape, strides, array)
    try:
        return _capsule_new(address, _NAMES[versioned], _destroy_capsule)
    except BaseException:
        _LIVE.pop(address, None)
        raise
