"""concat: tensors joined along one axis (``torch.cat`` / ``np.concatenate``).

Not an :class:`~.base.Operator`: its operands are a sequence of any length, and it computes
nothing (a copy through the device's ``DeviceProvider.concat``), so it has no kernels to select.
Operands are placed as an operator's are (Tensors, native device arrays, host data; one device)
and promoted to one dtype by the operators' rule (:func:`~.base.result_dtype`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config import settings
from ..errors import AttributeValueError, InputTypeError, ShapeError
from ..kernels import np_dtype
from ..tensor import Tensor
from ..typing import ArrayLike, DeviceLike
from .base import place, result_dtype


def concat(tensors: Sequence[ArrayLike], axis: int = 0, *, device: DeviceLike = None) -> Tensor:
    """``tensors`` joined along ``axis``, as ``torch.cat``: a new Tensor.

    Args:
        tensors: a list or tuple of one or more operands (Tensors, native device arrays or host
            data) on one device, of one rank, with equal shapes except on ``axis``; their dtypes
            promote as the operators' (float16 with float32 gives float32).
        axis: the dim to join along; negative counts from the end.
        device: the device for host operands when no operand is a Tensor.

    Raises:
        InputTypeError: ``tensors`` is not a sequence.
        ShapeError: no operand, a 0-d operand, or shapes that differ off ``axis``.
        AttributeValueError: a bad ``axis``.
        DeviceMismatchError: operands on two devices.
        DtypeError: a non-float dtype.

    Example:
        >>> opr.concat([a, b], axis=1)
    """
    if isinstance(tensors, (Tensor, np.ndarray)) or not isinstance(tensors, Sequence) or isinstance(tensors, str):
        raise InputTypeError(f"concat: tensors must be a list or tuple of tensors; got {type(tensors).__name__}. "
                             f"Write opr.concat([a, b], axis=...)")
    if not tensors:
        raise ShapeError("concat: needs at least one tensor; got an empty sequence")
    names = tuple(f"tensors[{i}]" for i in range(len(tensors)))
    datas, dev = place("concat", names, list(tensors), device, settings())
    shapes = [tuple(d.shape) for d in datas]
    ndim = len(shapes[0])
    if ndim == 0:
        raise ShapeError("concat: 0-d tensors cannot be joined; give 1-d or larger (t.reshape(1) makes one)")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise AttributeValueError(f"concat: axis must be an int in [{-ndim}, {ndim}) for {ndim}-D tensors; "
                                  f"got {axis!r}")
    ax = int(axis) % ndim
    for name, shape in zip(names, shapes):
        if len(shape) != ndim:
            raise ShapeError(f"concat: every tensor must have {ndim} dims, as tensors[0] {shapes[0]}; {name} has "
                             f"shape {shape}")
        if shape[:ax] + shape[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:]:
            raise ShapeError(f"concat: shapes must match except on axis {ax}; tensors[0] has {shapes[0]} and {name} "
                             f"has {shape}")
    dtype = np_dtype(result_dtype("concat", [d.dtype for d in datas]))
    prov = dev.provider
    datas = [d if np.dtype(d.dtype) == dtype else prov.astype(d, dtype) for d in datas]
    return Tensor._wrap(prov.concat(datas, ax), dev)

