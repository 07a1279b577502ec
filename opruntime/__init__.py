"""opruntime: a pluggable multi-backend operator runtime.

    import opruntime as opr
    y = opr.softmax(opr.matmul(x, w))            # on the configured device
    with opr.device("cuda:0"): ...               # or per block
    print(opr.explain("matmul", x, w))           # which kernel, and why

This module re-exports only; the operators' functions come from ``opruntime.ops`` (one file each).
"""

from . import errors
from ._version import __version__
from .capture import capture
from .config import configure, device, override, reload
from .devices import Device
from .hookspecs import DeviceProvider, hookimpl
from .kernels import FLOATS, Kernel, Problem
from .mesh import Mesh, MeshTensor, mesh
from .ops import *  # noqa: F403  (every operator's public function)
from .ops import FUNCTIONS, OPS, explain
from .ops.concat import concat
from .plugins import available_devices as devices
from .plugins import register, registry, unregister
from .tensor import Tensor, permute, reshape, tensor, transpose
from .trace import trace

__all__ = [
    "FLOATS", "OPS", "__version__", "Device", "DeviceProvider", "Kernel", "Problem", "Tensor", "capture", "concat", "configure",
    "device",
    "devices", "errors", "explain", "hookimpl", "override", "permute", "register", "registry", "reload", "reshape",
    "Mesh", "MeshTensor", "mesh",
    "tensor", "trace", "transpose", "unregister",
    *FUNCTIONS,
]
