"""The CUDA backend: devices ``cuda:N`` through CuPy, kernels in hand-written CUDA C (``*.cu``
beside the modules that launch them, built with NVRTC by ``compile.py``), and the vendor
libraries (cuBLAS through ``cupy.matmul``) as candidates beside them.

CuPy is imported inside the hooks and kernels, never at import time: without CuPy or a GPU the
backend reports ``cuda`` unavailable with the reason, and its kernels stay registered but unused.
"""

from __future__ import annotations

from opruntime import Kernel, hookimpl

from . import conv, matmul, softmax
from .memory import CudaDevice, devices


@hookimpl
def opruntime_devices() -> list[CudaDevice]:
    return devices()


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [*matmul.kernels(), *conv.kernels(), *softmax.kernels()]
