"""The problems the conformance suite gives every kernel, read from each operator's own tables
(``Operator.cases``, ``quick``, ``empty``), and the code that puts one on a device (with the
non-contiguous views it asks for) and builds the exact :class:`~opruntime.kernels.Problem` the
frontend would build, through the operator's own ``plan``.

A case lists the operands as a user passes them (1-D matmul operands, 3-D conv input and a bias
included), so the frontend's normalisation is exercised too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..devices import Device
from ..ops import OPS, Case
from ..ops.base import wide
from .numerics import random_array, sensitivity

#: operator -> its conformance problems (each operator's own ``cases``)
CASES: dict[str, list[Case]] = {name: list(op.cases) for name, op in OPS.items()}
#: a few cases per operator (each operator's ``quick`` picks), for quick runs (``--opruntime-cases quick``)
QUICK_CASES: dict[str, list[Case]] = {name: [op.cases[i] for i in op.quick] for name, op in OPS.items()}
#: size-0 and empty-reduction problems: the frontend answers these itself (kernels never see them)
EMPTY: dict[str, list[Case]] = {name: list(op.empty) for name, op in OPS.items()}


class Unsupported(Exception):
    """The device cannot build this case (e.g. its arrays cannot make the asked view)."""


@dataclass
class Built:
    """A case on a device: the native operands, their host values and the float64 reference.

    ``bases`` holds, per operand, the contiguous device array a view was made from and its host
    copy, so that a kernel writing into its operands is caught.
    """

    case: Case
    dtype: str
    operands: list[Any]
    hosts: list[np.ndarray]
    bases: list[tuple[Any, np.ndarray]]
    reference: np.ndarray

    def sensitivity(self) -> float:
        """The relative error a correct kernel may have on this problem (:func:`~.numerics.sensitivity`)."""
        op, attrs = OPS[self.case.op], self.case.attrs
        return sensitivity(lambda hosts: op.reference(*wide(hosts), **attrs), self.hosts, self.reference, self.dtype)


def device_view(device: Device, host: np.ndarray, view: str | None) -> tuple[Any, Any, np.ndarray]:
    """(the view on ``device`` showing ``host``, the device array it views, that array's host copy)."""
    prov = device.provider
    if view is None:
        base = host.copy(order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
        data = prov.from_host(base)
        return data, data, base.copy()  # a host device may hand back ``base`` itself
    try:
        if view == "T":
            perm = (*range(host.ndim - 2), host.ndim - 1, host.ndim - 2)
            base = np.ascontiguousarray(host.transpose(perm))
            data = prov.from_host(base)
            return (data.T if host.ndim == 2 else data.transpose(perm)), data, base.copy()
        if view == "slice":
            base = np.repeat(host, 2, axis=-1)
            base[..., 1::2] = np.nan  # the skipped elements: a kernel that reads them gives NaN
            data = prov.from_host(base)
            return data[(Ellipsis, slice(None, None, 2))], data, base.copy()
    except Exception as exc:  # the native array type has no such view
        raise Unsupported(f"{device.name} arrays cannot make a {view!r} view: {type(exc).__name__}: {exc}") from exc
    raise ValueError(f"unknown view {view!r}")


def build(case: Case, device: Device, dtype: str, rng: np.random.Generator) -> Built:
    """Put ``case`` on ``device`` in ``dtype`` with fresh random values."""
    hosts, operands, bases = [], [], []
    drawn = OPS[case.op].sample([random_array(rng, shape, dtype, case.scale) for shape in case.shapes], case)
    for i, host in enumerate(drawn):
        data, base, base_host = device_view(device, host, case.views[i] if i < len(case.views) else None)
        operands.append(data)
        hosts.append(host)
        bases.append((base, base_host))
    ref = OPS[case.op].reference(*wide(hosts), **case.attrs)
    return Built(case, dtype, operands, hosts, bases, ref)


def plan_for(built: Built, device: Device) -> Any:
    """The frontend's :class:`~opruntime.selector.Plan` for ``built`` (ranking only: ``tune="off"``)."""
    from ..config import override, settings

    with override(tune="off"):
        return OPS[built.case.op].plan(list(built.operands), device, dict(built.case.attrs), settings())


def kernel_views(plan: Any, operands: Sequence[Any]) -> list[Any]:
    """The operands reshaped as the kernel sees them (1-D matmul operands, unbatched conv input)."""
    return [d if tuple(d.shape) == s else d.reshape(s) for d, s in zip(operands, plan.views)]
