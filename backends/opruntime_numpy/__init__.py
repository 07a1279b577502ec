"""The NumPy backend: device ``cpu``; kernels for every operator in float16 (computed in
float32), float32 and float64."""

from __future__ import annotations

import numpy as np

from opruntime import FLOATS, Kernel, hookimpl

from . import conv, matmul, softmax
from .memory import CpuDevice

__version__ = np.__version__


@hookimpl
def opruntime_devices() -> list[CpuDevice]:
    return [CpuDevice()]


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [
        #       op             name                         kind   dtypes  run / supports / cost
        Kernel("matmul", "numpy.matmul.blas", "cpu", FLOATS, matmul.run, cost=matmul.cost),
        Kernel("conv2d", "numpy.conv2d.im2col", "cpu", FLOATS, conv.im2col, cost=conv.im2col_cost),
        Kernel("conv2d", "numpy.conv2d.pointwise", "cpu", FLOATS, conv.pointwise,
               supports=conv.is_pointwise, cost=conv.pointwise_cost),
        Kernel("conv2d", "numpy.conv2d.depthwise", "cpu", FLOATS, conv.depthwise,
               supports=conv.is_depthwise, cost=conv.depthwise_cost),
        Kernel("softmax", "numpy.softmax.fused", "cpu", FLOATS, softmax.softmax, cost=softmax.cost),
        Kernel("log_softmax", "numpy.log_softmax.fused", "cpu", FLOATS, softmax.log_softmax, cost=softmax.cost),
    ]
