"""The JAX backend: device kind ``jax``, one device per JAX device of every platform
(``jax:cpu:0``, ``jax:gpu:0``, ``jax:tpu:0``...; ``jax:<platform>`` names the first). Memory is
``jax.Array``; every kernel is a JAX function jit-compiled once per static signature: XLA's own
ops (vendor baselines) and Pallas kernels (interpreted on the CPU, compiled on GPU / TPU).

JAX is imported inside the hooks only, never at import time. Before it is, the backend sets
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless the user has set it: by default JAX reserves 75% of
each GPU's memory when its GPU client starts, which would leave the other backends (CUDA through
CuPy, OpenCL) of the same process a quarter of the device. JAX then allocates as it goes, like
the others. Set the variable yourself to keep JAX's default.
"""

from __future__ import annotations

import importlib.util
import os

from opruntime import Kernel, hookimpl
from opruntime.errors import BackendUnavailable
from opruntime.kernels import families

__version__ = "0.1.0"


#: every module of this package with kernels(): one per operator family (opruntime.kernels.families)
FAMILIES = families(__name__)


@hookimpl
def opruntime_device_kinds() -> dict[str, list[str]]:
    """The ``jax`` devices, owning JAX arrays: this backend loads when one is first needed."""
    return {"jax": ["jax", "jaxlib"]}


@hookimpl
def opruntime_devices() -> list:
    if importlib.util.find_spec("jax") is None:
        raise BackendUnavailable("jax not installed", kinds=["jax"])
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with the other backends
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
    return [k for family in FAMILIES for k in family.kernels()]
