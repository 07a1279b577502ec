"""Tensor: an immutable handle on an array that lives on one device, and the rules for host data.

The memory rule, the same on every device: a Tensor never changes because the caller changed an
array (``opr.tensor`` copies what it is given, on the ``cpu`` device too), and the caller cannot
change a Tensor through ``.numpy()`` (a copy, or on ``cpu`` a read-only view). Host data is taken
by one rule on every device (:func:`host_array`): native byte order, no masked arrays, no ragged
or object sequences, Python ints as float32.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from . import config, dlpack
from .config import settings
from .devices import Device
from .errors import (
    AttributeValueError,
    DeviceMismatchError,
    DeviceUnavailableError,
    DtypeError,
    IndexingError,
    InputTypeError,
    ShapeError,
)
from .plugins import registry, resolve_device


class Tensor:
    """An array on a device: the result of every operator, and a way to keep data on a device.

    The native array (a NumPy, CuPy, pyopencl or JAX array) is ``t.data``, shared with the
    Tensor: read it, never write into it. ``t.numpy()`` gives the values on the host. Tensors are
    created with :func:`opruntime.tensor` or returned by operators, and never change.

    Views stay on the Tensor's device and share its memory where the device allows (NumPy, CuPy
    and OpenCL arrays: no copy; a ``reshape`` the strides forbid copies, as NumPy's; JAX arrays are
    immutable XLA buffers, so there a view is a new array). Neither the view nor the original can
    change, so sharing is safe. The arithmetic operators call the operators ``add``, ``sub``,
    ``mul``, ``div``, ``matmul`` and ``neg`` (so a Python number is weak: it takes the Tensor's
    dtype, as in torch), host arrays join the Tensor's device::

        t = opr.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4), device="cpu")
        t.reshape(6, -1).shape      # (6, 4)     a view
        t.permute(2, 0, 1).shape    # (4, 2, 3)  a view; t.transpose(0, 2), t.T (all dims reversed)
        t[..., 1:3].shape           # (2, 3, 2)  ints, slices with a step >= 1, ..., None
        opr.concat([t, t], axis=1)  # (2, 6, 4)  a new array
        y = 2 * (t @ w) + b - 1.0   # matmul, mul, add, sub
    """

    __slots__ = ("_data", "_device", "_key")

    def __init__(self, data: Any, device: Device | str | None = None, dtype: Any = None) -> None:
        t = tensor(data, device=device, dtype=dtype)
        if not isinstance(t, Tensor):  # a mesh: opr.tensor gives a MeshTensor (opruntime.mesh)
            raise InputTypeError(f"Tensor(...) is one device's; use opr.tensor(x, device=mesh) for a mesh "
                                 f"(got device={device!r})")
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

    def __iter__(self) -> Iterator[Tensor]:
        if not self._data.shape:
            raise TypeError("iteration over a 0-d Tensor")
        return (self[i] for i in range(self._data.shape[0]))

    # -- views ------------------------------------------------------------------------------
    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        """The values in ``shape`` (ints, or one tuple; one dim may be -1: inferred), in C order,
        as NumPy's ``reshape``: a view when the strides allow one, else a copy.

        Raises:
            ShapeError: the sizes differ.
            AttributeValueError: a dim that is not an int >= -1, or two -1.
        """
        have = self._data.shape
        plain = _plain(shape)  # a view's validation is kept per (shape, ints): a model repeats its views
        new = _VIEWS_get(("reshape", have, shape)) if plain else None
        if new is None:
            new = _reshape_target("reshape", tuple(have), shape[0] if len(shape) == 1 and not _is_int(shape[0])
                                  else shape)
            if plain:
                _remember(("reshape", have, shape), new)
        if new == have:
            return self
        return Tensor._wrap(self._device.provider.reshape(self._data, new), self._device)

    def permute(self, *dims: int | Sequence[int]) -> Tensor:
        """The dims reordered: result dim ``i`` is dim ``dims[i]`` (a permutation of all dims,
        negative ones counted from the end; ints or one tuple), as ``torch.permute``. A view."""
        ndim = len(self._data.shape)
        plain = _plain(dims)
        axes = _VIEWS_get(("permute", ndim, dims)) if plain else None
        if axes is None:
            axes = _permutation("permute", ndim, dims[0] if len(dims) == 1 and not _is_int(dims[0]) else dims)
            if plain:
                _remember(("permute", ndim, dims), axes)
        if axes == _IDENTITY[ndim]:
            return self
        return Tensor._wrap(self._device.provider.permute(self._data, axes), self._device)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Dims ``dim0`` and ``dim1`` swapped (negative dims count from the end), as
        ``torch.transpose``. A view."""
        a, b = _dim("transpose", "dim0", dim0, self.ndim), _dim("transpose", "dim1", dim1, self.ndim)
        axes = list(range(self.ndim))
        axes[a], axes[b] = b, a
        return self.permute(tuple(axes))

    @property
    def T(self) -> Tensor:  # noqa: N802 (NumPy's name)
        """Every dim reversed, as NumPy's ``.T`` (a 2-D Tensor transposed; 0-d and 1-d unchanged)."""
        return self.permute(tuple(range(self.ndim))[::-1])

    @property
    def mT(self) -> Tensor:  # noqa: N802 (NumPy's and torch's name)
        """The last two dims swapped (a batch of matrices, each transposed), as NumPy's ``.mT``."""
        if self.ndim < 2:
            raise ShapeError(f"mT: the tensor must be at least 2-D; got shape {self.shape}. Use .T or reshape")
        return self.transpose(-2, -1)

    def __getitem__(self, index: Any) -> Tensor:
        """Basic indexing, as NumPy's: ints (negative from the end), slices with a step >= 1,
        ``...`` and ``None`` (a new size-1 dim). A view. Advanced (integer array) and boolean
        indexing, and negative steps, raise :class:`~opruntime.errors.IndexingError`."""
        shape = self._data.shape
        plain = index.__class__ is int or index.__class__ is tuple and _plain(index, _INDEX_KINDS)
        plan = _VIEWS_get(("index", shape, index)) if plain else None
        if plan is None:
            entries, view_shape, out_shape = _basic_index(tuple(shape), index)
            if view_shape != shape or any(e.__class__ is not slice for e in entries):
                plan = (entries, None if out_shape == view_shape else out_shape)
            elif out_shape == shape:
                plan = ()  # everything selected
            else:
                plan = (None, out_shape)  # None entries only: size-1 dims, a view
            if plain:
                _remember(("index", shape, index), plan)
        if not plan:
            return self
        entries, out_shape = plan
        data = self._data if entries is None else self._device.provider.getitem(self._data, entries)
        if out_shape is not None:
            data = self._device.provider.reshape(data, out_shape)
        return Tensor._wrap(data, self._device)

    # -- arithmetic: the operators add, sub, mul, div, matmul and neg -------------------------
    def __add__(self, other: Any) -> Tensor:
        return _operator("add")(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _operator("add")(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _operator("sub")(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _operator("sub")(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _operator("mul")(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _operator("mul")(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _operator("div")(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _operator("div")(other, self)

    def __matmul__(self, other: Any) -> Tensor:
        return _operator("matmul")(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _operator("matmul")(other, self)

    def __neg__(self) -> Tensor:
        return _operator("neg")(self)

    def __pos__(self) -> Tensor:
        return self

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """NumPy's ``+ - * / @`` and unary ``-`` with a Tensor operand (``x @ t`` for a host ``x``)
        run the operators on the Tensor's device; any other ufunc gets the host values and returns
        a NumPy array, as before."""
        name = _UFUNCS.get(ufunc.__name__) if method == "__call__" and not kwargs else None
        if name is not None:
            return _operator(name)(*inputs)
        host = [np.asarray(x) if isinstance(x, Tensor) else x for x in inputs]
        if any(isinstance(o, Tensor) for o in kwargs.get("out", ())):
            raise InputTypeError(f"np.{ufunc.__name__}: a Tensor cannot be written into (Tensors never change); "
                                 f"leave out= out or give a NumPy array")
        return getattr(ufunc, method)(*host, **kwargs)

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


# -- the operators behind the arithmetic ------------------------------------------------------------
#: NumPy ufunc name -> operator (``x @ t``, ``x - t`` with a host ``x``)
_UFUNCS = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div",
           "matmul": "matmul", "negative": "neg"}


def _operator(name: str) -> Any:
    """The operator ``name``, looked up when called (``opruntime.ops`` sits above this module and
    has filled ``config.OPERATORS`` by the time any Tensor exists: importing this module imports
    the ``opruntime`` package first)."""
    return config.OPERATORS[name]


# -- validating views ---------------------------------------------------------------------------------
#: a view's validated, normalised arguments by (kind, shape or ndim, arguments as given), for
#: arguments of plain ints (:func:`_plain`): a model repeats the same views on every call, and
#: their checks cost more than the view itself
_VIEWS: dict[tuple, Any] = {}
_VIEWS_get = _VIEWS.get
_IDENTITY = [tuple(range(n)) for n in range(65)]
_INDEX_KINDS = frozenset({int, type(None), type(Ellipsis)})


def _plain(args: tuple, kinds: frozenset = frozenset({int})) -> bool:
    """Whether ``args`` holds only objects of exactly these classes (ints: not bools or floats,
    which hash as the ints they equal and must still be refused): a key for :data:`_VIEWS`."""
    for a in args:
        if a.__class__ not in kinds:
            return False
    return True


def _remember(key: tuple, value: Any) -> None:
    if len(_VIEWS) >= 4096:
        _VIEWS.clear()
    _VIEWS[key] = value


def _is_int(x: Any) -> bool:
    return x.__class__ is int or isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _dim(op: str, name: str, value: Any, ndim: int) -> int:
    """A dim in ``[-ndim, ndim)`` as a non-negative int."""
    if not _is_int(value) or not -ndim <= value < ndim:
        raise AttributeValueError(f"{op}: {name} must be an int in [{-ndim}, {ndim}) for a {ndim}-D tensor; "
                                  f"got {value!r}" + (" (a 0-d tensor has no dims)" if ndim == 0 else ""))
    return int(value) % ndim


def _permutation(op: str, ndim: int, dims: Any) -> tuple[int, ...]:
    try:
        dims = tuple(dims)
    except TypeError:
        raise AttributeValueError(f"{op}: dims must be ints or one tuple of ints; got {dims!r}") from None
    if len(dims) != ndim:
        raise AttributeValueError(f"{op}: dims must name each of the tensor's {ndim} dims once; got {dims!r} "
                                  f"({len(dims)} dims). E.g. permute({', '.join(map(str, range(ndim)[::-1]))})")
    axes = tuple(_dim(op, f"dims[{i}]", d, ndim) for i, d in enumerate(dims))
    if len(set(axes)) != ndim:
        raise AttributeValueError(f"{op}: dims {dims!r} repeat a dim; each of the {ndim} dims must appear once")
    return axes


def _reshape_target(op: str, shape: tuple[int, ...], new: Any) -> tuple[int, ...]:
    """``new`` (ints, one may be -1) checked against ``shape``'s size, with -1 resolved."""
    try:
        new = tuple(new)
    except TypeError:
        raise AttributeValueError(f"{op}: the shape must be ints or one tuple of ints; got {new!r}") from None
    if not all(_is_int(n) and n >= -1 for n in new):
        raise AttributeValueError(f"{op}: the shape must hold ints >= 0 (and at most one -1); got {new!r}")
    new = tuple(int(n) for n in new)
    size, known = math.prod(shape), math.prod(n for n in new if n != -1)
    if new.count(-1) > 1:
        raise AttributeValueError(f"{op}: at most one dim may be -1 (inferred); got {new}")
    if -1 in new:
        if known == 0 or size % known:
            why = "the other dims hold 0 elements, so -1 is ambiguous" if known == 0 else \
                f"{size} is not a multiple of {known}"
            raise ShapeError(f"{op}: cannot reshape a tensor of shape {shape} (size {size}) into {new}: {why}")
        new = tuple(size // known if n == -1 else n for n in new)
    elif known != size:
        raise ShapeError(f"{op}: cannot reshape a tensor of shape {shape} (size {size}) into shape {new} "
                         f"(size {known}); the sizes must match (one dim may be -1 to infer it)")
    return new


def _basic_index(shape: tuple[int, ...], index: Any) -> tuple[tuple[int | slice, ...], tuple[int, ...],
                                                                 tuple[int, ...]]:
    """NumPy's basic indexing, normalised: one entry per dim (an int in range, or a slice with
    ``0 <= start <= stop <= n`` and a step >= 1), the shape those give, and the shape with the
    size-1 dims of ``None`` entries."""
    if index.__class__ is int and shape and -shape[0] <= index < shape[0]:  # t[i]: the common case, quickly
        rest = shape[1:]
        return (index % shape[0], *(slice(0, n, 1) for n in rest)), rest, rest
    items = index if isinstance(index, tuple) else (index,)
    ndim = len(shape)
    for e in items:
        if e is None or e is Ellipsis or _is_int(e):
            continue
        if isinstance(e, slice):
            for part in ("start", "stop", "step"):
                v = getattr(e, part)
                if v is not None and not _is_int(v):
                    raise IndexingError(f"Tensor[...]: slice {part}s must be ints or None; got {v!r}")
            if e.step is not None and e.step <= 0:
                raise IndexingError(f"Tensor[...]: slices with a step <= 0 are not supported (got step {e.step}); "
                                    f"reverse on the host: opr.tensor(t.numpy()[::-1])")
            continue
        kind = "boolean" if isinstance(e, (bool, np.bool_)) or getattr(getattr(e, "dtype", None), "kind", "") == "b" \
            else "advanced (integer array)"
        raise IndexingError(f"Tensor[...]: {kind} indexing is not supported (got {type(e).__name__} {e!r:.60}); "
                            f"Tensors take ints, slices with a step >= 1, ... and None. Select on the host "
                            f"(opr.tensor(t.numpy()[idx], device=t.device)), or join slices with opr.concat")
    if sum(e is Ellipsis for e in items) > 1:
        raise IndexingError("Tensor[...]: an index can only have a single ellipsis ('...')")
    used = sum(e is not None and e is not Ellipsis for e in items)
    if used > ndim:
        raise IndexingError(f"Tensor[...]: too many indices for a {ndim}-D tensor of shape {shape}: {used} were given")
    if Ellipsis in items:  # `in` compares with ==: only Ellipsis equals Ellipsis among the kinds allowed
        at = next(i for i, e in enumerate(items) if e is Ellipsis)
        items = items[:at] + (slice(None),) * (ndim - used) + items[at + 1:]
    else:
        items = items + (slice(None),) * (ndim - used)
    entries: list[int | slice] = []
    view: list[int] = []
    out: list[int] = []
    for e in items:
        if e is None:
            out.append(1)
            continue
        n = shape[len(entries)]
        if isinstance(e, slice):
            start, stop, step = e.indices(n)
            stop = max(start, stop)
            entries.append(slice(start, stop, step))
            view.append(-(-(stop - start) // step))
            out.append(view[-1])
        else:
            if not -n <= e < n:
                raise IndexingError(f"Tensor[...]: index {e} is out of range for dim {len(entries)} of size {n} "
                                    f"(shape {shape})")
            entries.append(int(e) % n)
    return tuple(entries), tuple(view), tuple(out)


# -- the view functions ---------------------------------------------------------------------------------
def _operand(op: str, x: Any, device: Device | str | None) -> Tensor:
    """``x`` as a Tensor, as the operators take operands: a Tensor as it is (``device=`` must be its
    device), host data and native arrays copied onto their device or the configured one."""
    if isinstance(x, Tensor):
        if device is not None and Device(device) != x.device:
            raise DeviceMismatchError(f"{op}: device={str(device)!r} was asked but the tensor lives on "
                                      f"{x.device.name!r}; move it first with .to({str(device)!r}) (opruntime "
                                      f"never copies between devices silently)")
        return x
    return _make(op, x, device)


def reshape(x: Any, shape: Sequence[int], *, device: Any = None) -> Tensor:
    """``x`` with ``shape`` (one dim may be -1), as ``np.reshape``: a view when the strides allow
    one, else a copy. ``x``: a Tensor, a native device array or host data (copied to the device).

    Example:
        >>> opr.reshape(t, (2, -1))
    """
    return _operand("reshape", x, device).reshape(shape)


def transpose(x: Any, dim0: int, dim1: int, *, device: Any = None) -> Tensor:
    """``x`` with dims ``dim0`` and ``dim1`` swapped, as ``torch.transpose``. A view."""
    return _operand("transpose", x, device).transpose(dim0, dim1)


def permute(x: Any, dims: Sequence[int], *, device: Any = None) -> Tensor:
    """``x`` with its dims reordered (result dim ``i`` is dim ``dims[i]``), as ``torch.permute``.
    A view."""
    return _operand("permute", x, device).permute(dims)


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
            arr = np.from_dlpack(x)  # a view: no copy
        except Exception:
            try:  # a dtype NumPy cannot import (torch's bfloat16): read the capsule, still a view
                arr = dlpack.host_view(x)
            except Exception:  # a device-resident DLPack object: go through __array__
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


# -- foreign arrays ------------------------------------------------------------------------------------
#: operands that are host data by their type: no device owns them, and no DLPack is asked
_PLAIN = (np.ndarray, np.generic, list, tuple, int, float)


#: classes of native device arrays that a device's provider owns as they are (CuPy, jax.Array, ...)
#: and that say where they live (``__dlpack_device__``): the frontend's hot path takes them as
#: operands without adopting them again (ops/base.py)
NATIVE: set[type] = set()


def adopt(op: str, x: Any, name: str = "x") -> Any:
    """An operand as the frontend places it: a Tensor, or host data.

    * a Tensor, a NumPy array, a list or a scalar: as it is;
    * a native array of a registered device (CuPy, pyopencl, a ``jax.Array``): a Tensor on that
      device, sharing the array;
    * any other ``__dlpack__`` object (torch, ...) in device memory: imported without a copy by
      the device whose memory it is (``__dlpack_device__`` kDLCUDA id N: ``cuda:N``), as a Tensor
      there; in host memory (kDLCPU): host data, exactly as a NumPy array (read through DLPack
      without a copy, ``bfloat16`` included, then placed on the call's device).

    Raises:
        InputTypeError: a JAX tracer (the call is inside ``jax.jit``) or a torch tensor that
            requires grad.
        DeviceUnavailableError: a DLPack object on a device no plugin here holds.
    """
    if x.__class__ is Tensor or x is None or isinstance(x, _PLAIN):
        return x
    _refuse_untakeable(op, x, name)
    reg = registry()
    owner = reg.device_of(x)
    if owner is not None:
        if hasattr(x, "__dlpack_device__"):
            NATIVE.add(x.__class__)  # the frontend's hot path keys such arrays by class and DLPack device
        return Tensor._wrap(x, owner)
    where = _dlpack_device(x)
    if where is None or where[0] in dlpack.HOST_TYPES:
        return x  # host data: host_array reads it
    dev = reg.dlpack_holder(where)
    if dev is None:
        raise DeviceUnavailableError(
            f"{op}: operand {name} ({type(x).__module__}.{type(x).__name__}) lives on {dlpack.device_name(where)}, "
            f"and no device here holds that memory (devices: {', '.join(d.name for d in reg.devices) or 'none'}; "
            f"see `opruntime info`). Install the backend for it (CUDA: pip install 'opruntime[cuda12]'), or move "
            f"it to the host first (torch: {name}.cpu())")
    return Tensor._wrap(dev.provider.from_dlpack(x), dev)


def _dlpack_device(x: Any) -> tuple[int, int] | None:
    """``x.__dlpack_device__()`` as two ints, or None when ``x`` has no (working) one."""
    probe = getattr(x, "__dlpack_device__", None)
    if probe is None:
        return None
    try:
        kind, index = probe()
        return int(kind), int(index)
    except Exception:
        return None


def _refuse_untakeable(op: str, x: Any, name: str) -> None:
    """Refuse, naming the way out, the two foreign operands that cannot be taken as values."""
    cls = type(x)
    if any(c.__name__.endswith("Tracer") and c.__module__.startswith("jax") for c in cls.__mro__):
        raise InputTypeError(
            f"{op}: operand {name} is a JAX tracer: the call is inside jax.jit (or grad, vmap, scan...), but "
            f"opruntime runs eagerly, on concrete arrays, and cannot be traced. Call opr.{op} outside the "
            f"transformed function, or call it from inside through a host callback: "
            f"jax.pure_callback(lambda a: np.asarray(opr.{op}(np.asarray(a))), jax.ShapeDtypeStruct(shape, dtype), "
            f"{name})")
    if getattr(x, "requires_grad", False) is True and cls.__module__.startswith("torch"):
        raise InputTypeError(
            f"{op}: operand {name} is a torch tensor that requires grad; opruntime records no gradients, so its "
            f"result would silently cut the autograd graph. Pass {name}.detach() (the same memory, no copy) "
            f"where no gradient is needed")


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
    return _make("tensor", data, device, dtype)


#: ``spread(op, data, device, dtype)``: :func:`tensor` when a mesh is involved (a mesh device, a
#: mesh tensor, ``with opr.device(mesh)``), else None; set by ``opruntime.mesh`` (a layer above)
spread: Any = None


def _make(op: str, data: Any, device: Device | str | None = None, dtype: Any = None) -> Tensor:
    """:func:`tensor`, with errors naming ``op``."""
    if spread is not None and (placed := spread(op, data, device, dtype)) is not None:
        return placed
    dev = Device(device) if device is not None else None
    if isinstance(data, Tensor):
        t = data if dev is None else data.to(dev)
    else:
        found = adopt(op, data, "data")  # a Tensor sharing a native or DLPack array, or host data
        if isinstance(found, Tensor):
            t = Tensor._wrap(found.device.provider.copy(found.data), found.device) if dev is None or \
                dev == found.device else found.to(dev)
        else:
            dev = dev or resolve_device(settings(), op)
            host = host_array(op, data)
            prov = dev.provider
            placed = prov.from_host(host)
            if placed is host or prov.placement_free and np.shares_memory(placed, host):
                placed = placed.copy()  # the caller's array stays the caller's
            t = Tensor._wrap(placed, dev)
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt.kind not in "fiub" and dt.name != "bfloat16":
            raise DtypeError(f"{op}: unsupported dtype {dt}")
        if t.dtype != dt:
            t = Tensor._wrap(t.device.provider.astype(t.data, dt), t.device)
    return t
