"""The NumPy backend: device ``cpu``; kernels for every operator in float16 (computed in
float32), float32 and float64."""

from __future__ import annotations

import numpy as np

from opruntime import Kernel, hookimpl
from opruntime.kernels import families

from .memory import CpuDevice

__version__ = np.__version__


#: every module of this package with kernels(): one per operator family (opruntime.kernels.families)
FAMILIES = families(__name__)


@hookimpl
def opruntime_device_kinds() -> dict[str, list[str]]:
    """The ``cpu`` devices, owning NumPy arrays: this backend loads when one is first needed."""
    return {"cpu": ["numpy"]}


@hookimpl
def opruntime_devices() -> list[CpuDevice]:
    return [CpuDevice()]


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [k for family in FAMILIES for k in family.kernels()]
