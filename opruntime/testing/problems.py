"""The problems the conformance suite gives every kernel: a table per operator, and the code that
puts one on a device (with the non-contiguous views it asks for) and builds the exact
:class:`~opruntime.kernels.Problem` the frontend would build, through the operator's own ``plan``.

A case lists the operands as a user passes them (1-D matmul operands, 3-D conv input and a bias
included), so the frontend's normalisation is exercised too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..devices import Device
from ..ops import OPS
from .numerics import random_array


@dataclass(frozen=True)
class Case:
    """One generated problem.

    Attributes:
        op: the operator.
        shapes: the operands' shapes as the user passes them.
        attrs: the operator's keyword attributes.
        views: per operand, ``None`` (contiguous), ``"T"`` (the last two dims swapped on the device) or
            ``"slice"`` (every other element of the last dim, a strided device view).
        scale: the operands' standard deviation (softmax wants a spread of values).
    """

    op: str
    shapes: tuple[tuple[int, ...], ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    views: tuple[str | None, ...] = ()
    scale: float = 1.0

    @property
    def id(self) -> str:
        ops = "x".join("(" + ",".join(map(str, s)) + ")" for s in self.shapes)
        views = "".join(f"-{i}{v}" for i, v in enumerate(self.views) if v)
        attrs = "".join(f"-{k}={v}" for k, v in self.attrs.items()).replace(" ", "")
        return f"{ops}{attrs}{views}"


def _mm(a: tuple[int, ...], b: tuple[int, ...], views: tuple[str | None, ...] = ()) -> Case:
    return Case("matmul", (a, b), {}, views)


def _sm(op: str, shape: tuple[int, ...], axis: int, views: tuple[str | None, ...] = ()) -> Case:
    return Case(op, (shape,), {"axis": axis}, views, scale=4.0)


def _cv(x: tuple[int, ...], w: tuple[int, ...], bias: bool = False, views: tuple[str | None, ...] = (),
        **attrs: Any) -> Case:
    shapes = (x, w, (w[0],)) if bias else (x, w)
    return Case("conv2d", shapes, attrs, views)


#: Odd sizes, size-1 dims, 1-D operands, broadcast batch dims, primes past any tile size, and
#: non-contiguous operands.
MATMUL = [
    _mm((7, 13), (13, 5)), _mm((1, 1), (1, 1)), _mm((13,), (13, 4)), _mm((5, 13), (13,)), _mm((13,), (13,)),
    _mm((3, 7, 13), (13, 5)), _mm((2, 1, 7, 13), (1, 3, 13, 5)), _mm((67, 131), (131, 61)),
    _mm((37, 21), (21, 19), ("T", None)), _mm((37, 21), (21, 19), ("slice", "T")),
]
SOFTMAX_SHAPES = [((1,), -1), ((5,), 0), ((3, 7), -1), ((3, 7), 0), ((4, 1), 1), ((2, 3, 5), 1), ((33, 1025), -1),
                  ((1, 3000), 1), ((6, 4, 3, 2), 0)]
SOFTMAX_VIEWS = [((24, 40), 1, ("T",)), ((24, 40), 0, ("slice",))]
#: Every conv2d attribute, alone and together; depthwise, pointwise, grouped, unbatched, bias.
CONV2D = [
    _cv((2, 3, 9, 11), (4, 3, 3, 3)),
    _cv((2, 3, 9, 11), (4, 3, 3, 3), True, stride=2, padding=1),
    _cv((1, 4, 10, 7), (6, 4, 3, 2), True, stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    _cv((2, 4, 8, 8), (4, 2, 3, 3), groups=2, padding="same"),
    _cv((2, 4, 8, 9), (5, 4, 2, 4), True, padding="same", dilation=2),
    _cv((1, 6, 7, 7), (6, 1, 3, 3), True, groups=6, padding=1),
    _cv((1, 3, 7, 7), (6, 1, 3, 3), groups=3, stride=2),
    _cv((2, 8, 5, 6), (4, 8, 1, 1), True),
    _cv((2, 8, 9, 6), (4, 2, 1, 1), groups=4, stride=2),
    _cv((3, 5, 5), (2, 3, 3, 3), True, padding="valid"),
    _cv((1, 1, 1, 1), (1, 1, 1, 1)),
    _cv((1, 3, 13, 17), (7, 3, 5, 5), True, stride=3, padding=2),
    _cv((2, 3, 9, 9), (4, 3, 3, 3), views=("T", None), padding=1),
]
CASES: dict[str, list[Case]] = {
    "matmul": MATMUL,
    "conv2d": CONV2D,
    **{op: [_sm(op, s, a) for s, a in SOFTMAX_SHAPES] + [_sm(op, s, a, v) for s, a, v in SOFTMAX_VIEWS]
       for op in ("softmax", "log_softmax")},
}
#: A few cases per operator that still cover 1-D / broadcast operands and strided views, for
#: quick runs (``--opruntime-cases quick``; the project's CI on slow-compiling devices).
QUICK_CASES: dict[str, list[Case]] = {
    "matmul": [MATMUL[0], MATMUL[6], MATMUL[9]],
    "conv2d": [CONV2D[2], CONV2D[5], CONV2D[12]],
    **{op: [CASES[op][i] for i in (2, 5, 10)] for op in ("softmax", "log_softmax")},
}
#: Size-0 and empty-reduction problems: the frontend answers these itself (kernels never see
#: them) with the device's ``empty`` / ``zeros`` / ``from_host``.
EMPTY: dict[str, list[Case]] = {
    "matmul": [_mm((0, 5), (5, 3)), _mm((4, 0), (0, 3)), _mm((2, 0, 3), (3, 4))],
    "conv2d": [_cv((0, 3, 5, 5), (2, 3, 3, 3)), _cv((1, 0, 5, 5), (2, 0, 3, 3), True)],
    "softmax": [_sm("softmax", (0, 4), 1), _sm("softmax", (3, 0), 1)],
    "log_softmax": [_sm("log_softmax", (0, 4), 0)],
}


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


def device_view(device: Device, host: np.ndarray, view: str | None) -> tuple[Any, Any, np.ndarray]:
    """(the view on ``device`` showing ``host``, the device array it views, that array's host copy)."""
    prov = device.provider
    if view is None:
        base = np.ascontiguousarray(host)
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
    for i, shape in enumerate(case.shapes):
        host = random_array(rng, shape, dtype, case.scale)
        data, base, base_host = device_view(device, host, case.views[i] if i < len(case.views) else None)
        operands.append(data)
        hosts.append(host)
        bases.append((base, base_host))
    ref = OPS[case.op].reference(*[h.astype(np.float64) for h in hosts], **case.attrs)
    return Built(case, dtype, operands, hosts, bases, ref)


def plan_for(built: Built, device: Device) -> Any:
    """The frontend's :class:`~opruntime.selector.Plan` for ``built`` (ranking only: ``tune="off"``)."""
    from ..config import override, settings

    with override(tune="off"):
        return OPS[built.case.op].plan(list(built.operands), device, dict(built.case.attrs), settings())


def kernel_views(plan: Any, operands: Sequence[Any]) -> list[Any]:
    """The operands reshaped as the kernel sees them (1-D matmul operands, unbatched conv input)."""
    return [d if tuple(d.shape) == s else d.reshape(s) for d, s in zip(operands, plan.views)]
