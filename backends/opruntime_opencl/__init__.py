"""The OpenCL backend: device kind ``opencl``, one device per OpenCL device of every platform
(``opencl:0``, ``opencl:1``, ... and the aliases ``opencl:gpu`` / ``opencl:cpu``), kernels written
in OpenCL C (``*.cl`` beside their launchers) with tunables passed as ``-D`` build options.

pyopencl is imported inside the hooks only, so ``import opruntime`` never loads it.
"""

from __future__ import annotations

from opruntime import Kernel, hookimpl
from opruntime.errors import BackendUnavailable
from opruntime.kernels import families

from .memory import OpenCLDevice, discover

__version__ = "0.1.0"


#: every module of this package with kernels(): one per operator family (opruntime.kernels.families)
FAMILIES = families(__name__)


@hookimpl
def opruntime_device_kinds() -> dict[str, list[str]]:
    """The ``opencl`` devices, owning pyopencl arrays: this backend loads when one is first needed."""
    return {"opencl": ["pyopencl"]}


@hookimpl
def opruntime_devices() -> list[OpenCLDevice]:
    devices, reason = discover()
    if not devices:
        raise BackendUnavailable(reason, kinds=["opencl"])
    return devices


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [k for family in FAMILIES for k in family.kernels()]
