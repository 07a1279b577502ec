"""The NumPy backend: device ``cpu``; kernels for every operator in float16 (computed in
float32), float32 and float64."""

from __future__ import annotations

import numpy as np

from opruntime import Kernel, hookimpl

from . import conv, matmul, relu, softmax
from .memory import CpuDevice

__version__ = np.__version__


@hookimpl
def opruntime_devices() -> list[CpuDevice]:
    return [CpuDevice()]


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [*matmul.kernels(), *conv.kernels(), *softmax.kernels(), *relu.kernels()]
