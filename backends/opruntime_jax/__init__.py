"""The JAX backend: device kind ``jax``, one device per JAX device of every platform
(``jax:cpu:0``, ``jax:gpu:0``, ``jax:tpu:0``...; ``jax:<platform>`` names the first). Memory is
``jax.Array``; every kernel is a JAX function jit-compiled once per static signature: XLA's own
ops (vendor baselines) and Pallas kernels (interpreted on the CPU, compiled on GPU / TPU).

JAX is imported inside the hooks only, never at import time.
"""

from __future__ import annotations

import importlib.util

from opruntime import Kernel, hookimpl
from opruntime.errors import BackendUnavailable

from . import conv, matmul, softmax

__version__ = "0.1.0"


@hookimpl
def opruntime_devices() -> list:
    if importlib.util.find_spec("jax") is None:
        raise BackendUnavailable("jax not installed", kinds=["jax"])
    try:
        from .memory import discover

        devices = discover()
    except ImportError as exc:
        raise BackendUnavailable(f"jax failed to import: {exc}", kinds=["jax"]) from exc
    if not devices:
        raise BackendUnavailable("jax found no devices", kinds=["jax"])
    return devices


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [*matmul.kernels(), *conv.kernels(), *softmax.kernels()]
