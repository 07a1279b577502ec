"""The CUDA backend: devices ``cuda:N`` through CuPy, kernels in hand-written CUDA C (``*.cu``
beside the modules that launch them, built with NVRTC by ``compile.py``), and the vendor
libraries (cuBLAS through ``cupy.matmul``) as candidates beside them.

CuPy is imported inside the hooks and kernels, never at import time: without CuPy or a GPU the
backend reports ``cuda`` unavailable with the reason, and its kernels stay registered but unused.

    memory.py                       CudaDevice (the DeviceProvider): memory, DLPack, timing, figures
    compile.py                      NVRTC builds, the bounded module cache, FastLaunch
    matmul.py, matmul_launch.py     cuBLAS, SIMT, mma and wgmma GEMMs: the table / the launch plans
    conv.py, conv_launch.py         implicit GEMM, Winograd, depthwise, im2col + cuBLAS: the same split
    softmax.py                      softmax and log_softmax: row families and any-axis strided
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opruntime import Kernel, hookimpl
from opruntime.kernels import families

from .memory import CudaDevice, devices

#: every module of this package with kernels(): one per operator family (opruntime.kernels.families)
FAMILIES = families(__name__)


@hookimpl
def opruntime_device_kinds() -> dict[str, list[str]]:
    """The ``cuda`` devices, owning CuPy arrays: this backend loads when one is first needed."""
    return {"cuda": ["cupy"]}


@hookimpl
def opruntime_devices() -> list[CudaDevice]:
    return devices()


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [k for family in FAMILIES for k in family.kernels()]


@hookimpl
def opruntime_build_variants() -> list[tuple[str, Mapping[str, Any]]]:
    """Every variant CI compiles, as ``(file of this package, defines)``: each family's configs
    and layout flags (``build_variants()`` of matmul, conv, softmax and relu)."""
    return [v for family in FAMILIES for v in family.build_variants()]
