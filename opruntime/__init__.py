"""opruntime: a pluggable multi-backend operator runtime.

    import opruntime as opr
    y = opr.softmax(opr.matmul(x, w))            # on the configured device
    with opr.device("cuda:0"): ...               # or per block
    print(opr.explain("matmul", x, w))           # which kernel, and why
"""

from . import errors
from .config import configure, device, override, reload
from .devices import Device
from .hookspecs import DeviceProvider
from .hookspecs import hookimpl
from .kernels import FLOATS, Kernel, Problem
from .ops import conv2d, log_softmax, matmul, softmax
from .plugins import available_devices as devices
from .plugins import register, registry, unregister
from .selector import explain
from .tensor import Tensor, tensor
from .trace import trace

__version__ = "0.1.0"


__all__ = [
    "FLOATS", "Device", "DeviceProvider", "Kernel", "Problem", "Tensor", "configure", "conv2d", "device",
    "devices", "errors", "explain", "hookimpl", "log_softmax", "matmul", "override", "register", "reload",
    "registry", "softmax", "tensor", "trace", "unregister",
]
