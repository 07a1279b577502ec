"""The types of the public API's parameters, named once (as ``numpy.typing`` and ``jax.typing`` do).

    import opruntime as opr
    from opruntime.typing import ArrayLike

    def block(x: ArrayLike) -> opr.Tensor:
        return opr.relu(opr.matmul(x, x))

The operators take a :class:`~opruntime.tensor.Tensor`, a device's own array (a CuPy array, a
``jax.Array``, a ``pyopencl`` array), any object that exports DLPack (a torch tensor) or host data
(a NumPy array, nested lists, a Python float); they always return a Tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy.typing as npt

from .devices import Device
from .tensor import Tensor


@runtime_checkable
class SupportsDLPack(Protocol):
    """An array that exports its memory through DLPack (torch, CuPy, JAX and NumPy arrays do)."""

    def __dlpack__(self, *, stream: Any = None) -> Any:
        """A DLPack capsule of the array's memory."""

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack device type and index the memory lives on."""


#: An operand: a Tensor, a device array or DLPack exporter, or host data NumPy converts.
ArrayLike: TypeAlias = Tensor | SupportsDLPack | npt.ArrayLike
#: Where to run: a device name (``"cpu"``, ``"cuda:0"``, ``"opencl:gpu"``), a :class:`Device`, or a
#: priority list of them (the first present one wins); None: the operands' device, else the
#: configured one.
DeviceLike: TypeAlias = Device | str | Sequence[Device | str] | None
#: A 2-D size: one int for both dims, or ``(height, width)``.
IntPair: TypeAlias = int | tuple[int, int]
#: The axes of a reduction: one, several, or None for every axis.
Axes: TypeAlias = int | tuple[int, ...] | None
#: A shape: one int (a 1-D shape) or a sequence of ints.
ShapeLike: TypeAlias = int | Sequence[int]

__all__ = ["ArrayLike", "Axes", "DeviceLike", "IntPair", "ShapeLike", "SupportsDLPack"]
