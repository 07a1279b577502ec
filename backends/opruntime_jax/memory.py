"""The ``jax`` devices: one per JAX device of every platform (``jax:cpu:0``, ``jax:gpu:0``,
``jax:tpu:0``...); memory is a ``jax.Array`` committed to that device with ``jax.device_put``.

float64 data is made inside :func:`~.compile.x64_scope` (``jax_enable_x64`` for this thread
only), so the user's own JAX code keeps its global setting.

JAX runs computations asynchronously: a result whose allocation failed comes back as an array and
fails when it is waited on (and exporting it through DLPack aborts the process). So everything
here that reads device data waits on it first and raises JAX's out-of-memory errors as
:class:`~opruntime.errors.OutOfMemoryError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from opruntime import DeviceProvider

from .compile import raise_if_oom, x64_scope

#: default-device order: a TPU or GPU reached through JAX ranks high; JAX on the host ranks
#: below the NumPy ``cpu`` device, so that stays the default on CPU-only machines.
PRIORITY = {"tpu": 90, "gpu": 80, "cpu": 10}


def discover() -> list[JaxDevice]:
    """One provider per local JAX device of every platform JAX can initialise here."""
    import jax

    try:
        from jax.extend import backend as jax_backend

        names = list(jax_backend.backends())
    except Exception:  # older or newer JAX: ask for each platform by name
        names = ["tpu", "gpu", "cpu"]
    found: dict[str, list[Any]] = {}
    for name in names:
        try:
            devs = jax.local_devices(backend=name)
        except Exception:  # that platform cannot start here
            continue
        for d in devs:
            plat = found.setdefault(d.platform, [])
            if all(d is not e for e in plat):
                plat.append(d)
    return [JaxDevice(d, plat, i) for plat, devs in found.items() for i, d in enumerate(devs)]


class JaxDevice(DeviceProvider):
    """One JAX device. ``jdev`` is the ``jax.Device``; ``platform`` is ``cpu``, ``gpu`` or ``tpu``:
    kernels read both from ``problem.device.provider``."""

    kind = "jax"

    def __init__(self, jdev: Any, platform: str, index: int) -> None:
        import jax

        self.jdev, self.platform = jdev, platform
        self.name = f"jax:{platform}:{index}"
        self.aliases = (f"jax:{platform}",) if index == 0 else ()
        self.priority = PRIORITY.get(platform, 5)
        self.description = str(getattr(jdev, "device_kind", platform))
        self.accelerator = platform in ("gpu", "tpu")
        self.array_types = (jax.Array,)
        self._sync: Any = None

    # -- memory -----------------------------------------------------------------------------------
    def from_host(self, array: np.ndarray) -> Any:
        return self._put(array)

    def _put(self, array: Any) -> Any:
        import jax

        if not array.dtype.isnative:  # JAX refuses big-endian dtypes: same values, native order
            array = array.astype(array.dtype.newbyteorder("="))
        elif isinstance(array, np.ndarray):
            # XLA's CPU client adopts an aligned host buffer without copying (may_alias=False does
            # not stop it), and a GPU client reads it after device_put returns (the copy is
            # asynchronous: seen on an H100, jax 0.11.2): the caller could then change the device
            # array. Hand it a private copy.
            array = np.array(array, copy=True)
        try:
            if np.dtype(array.dtype) == np.float64:
                with x64_scope():
                    return jax.device_put(array, self.jdev)
            return jax.device_put(array, self.jdev)
        except Exception as exc:
            raise_if_oom(exc, f"{self.name}: out of memory placing a {tuple(array.shape)} {array.dtype} array")
            raise

    def to_host(self, data: Any) -> np.ndarray:
        self.wait(data)  # an allocation that failed is raised typed here, not as an abort in np.array
        return np.array(data, copy=True)  # a writable host copy (np.asarray may alias on the CPU)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.zeros(shape, dtype)  # XLA has no uninitialised buffers

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        import jax.numpy as jnp

        try:  # wait for it: on a GPU the allocation fails asynchronously, and must fail here
            if np.dtype(dtype) == np.float64:
                with x64_scope():
                    return jnp.zeros(shape, dtype, device=self.jdev).block_until_ready()
            return jnp.zeros(shape, dtype, device=self.jdev).block_until_ready()
        except Exception as exc:
            raise_if_oom(exc, f"{self.name}: out of memory allocating a {tuple(shape)} {dtype} array")
            raise

    def copy(self, data: Any) -> Any:
        return data.copy()  # on the device (JAX arrays are immutable, but a Tensor owns its array)

    def astype(self, data: Any, dtype: np.dtype) -> Any:
        try:
            if np.dtype(dtype) == np.float64 or data.dtype == np.float64:
                with x64_scope():
                    return data.astype(dtype)
            return data.astype(dtype)
        except Exception as exc:
            raise_if_oom(exc, f"{self.name}: out of memory converting a {tuple(data.shape)} {data.dtype} array "
                              f"to {dtype}")
            raise

    def owns(self, data: Any) -> bool:
        """A ``jax.Array`` that lives on this device alone."""
        if not isinstance(data, self.array_types):
            return False
        try:
            devs = data.devices()
        except Exception:  # a tracer or a deleted array
            return False
        return len(devs) == 1 and self.jdev in devs

    # -- views: new arrays (XLA buffers are immutable and have no strides) -------------------------
    def reshape(self, data: Any, shape: tuple[int, ...]) -> Any:
        return self._jnp("reshape", data, lambda: data.reshape(shape))

    def permute(self, data: Any, axes: tuple[int, ...]) -> Any:
        return self._jnp("permute", data, lambda: data.transpose(axes))

    def getitem(self, data: Any, index: tuple[int | slice, ...]) -> Any:
        return self._jnp("getitem", data, lambda: data[index])

    def concat(self, datas: Any, axis: int) -> Any:
        import jax.numpy as jnp

        return self._jnp("concat", datas[0], lambda: jnp.concatenate(list(datas), axis=axis))

    def _jnp(self, what: str, data: Any, fn: Callable[[], Any]) -> Any:
        """``fn()`` with float64 kept (``x64_scope``) and out-of-memory raised typed."""
        try:
            if np.dtype(data.dtype) == np.float64:
                with x64_scope():
                    return fn()
            return fn()
        except Exception as exc:
            raise_if_oom(exc, f"{self.name}: out of memory in {what} of a {tuple(data.shape)} {data.dtype} array")
            raise

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Identity only: JAX arrays are immutable, so distinct arrays never alias observably."""
        return a is b

    def free_memory(self) -> int | None:
        """``bytes_limit - bytes_in_use`` where the device reports them (GPU, TPU); on the CPU the
        host's available memory (``MemAvailable`` of ``/proc/meminfo``; it knows nothing of a
        cgroup or ``ulimit`` limit); else None."""
        try:
            stats = self.jdev.memory_stats() or {}
        except Exception:  # not every platform reports memory
            stats = {}
        if "bytes_limit" in stats:
            return max(0, int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
        return host_available() if self.platform == "cpu" else None

    # -- DLPack -----------------------------------------------------------------------------------
    def holds_dlpack(self, device_type: int, device_id: int) -> bool:
        """A GPU's memory (kDLCUDA, managed, kDLROCM) with this device's hardware ordinal; the
        CUDA backend, ranked higher, takes such arrays first when it is present."""
        ordinal = getattr(self.jdev, "local_hardware_id", None)
        return self.platform == "gpu" and device_type in (2, 10, 13) and device_id == ordinal

    def from_dlpack(self, obj: Any) -> Any:
        """Zero-copy when the producer is on this device; else through JAX's own transfer, and
        through the host for producers JAX cannot read (an OpenCL buffer)."""
        import jax

        try:
            with x64_scope():
                arr = jax.dlpack.from_dlpack(obj)
                return arr if self.owns(arr) else jax.device_put(arr, self.jdev)
        except Exception:
            return self._put(np.from_dlpack(obj))

    def to_dlpack(self, data: Any, **kwargs: Any) -> Any:
        self.wait(data)  # exporting a buffer whose computation failed aborts the process: fail typed first
        return data.__dlpack__(**kwargs)

    # -- execution --------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for the work queued on this device: a tiny jitted computation queued behind it is
        waited for (GPU and TPU run one compute stream per device in order). On the CPU, XLA may
        run independent computations concurrently, so :meth:`time` waits on the result itself.
        (A jitted tick: 3x cheaper than an op-by-op ``x + 1``.)"""
        import jax

        if self._sync is None:
            self._sync = (jax.jit(lambda x: x + 1), jax.device_put(np.zeros((), np.float32), self.jdev))
        tick, scalar = self._sync
        tick(scalar).block_until_ready()

    def wait(self, data: Any) -> None:
        """Wait for ``data``; a computation that ran out of memory raises ``OutOfMemoryError``."""
        try:
            data.block_until_ready()
        except Exception as exc:
            raise_if_oom(exc, f"{self.name}: out of memory computing a {tuple(data.shape)} {data.dtype} result")
            raise

    def time(self, fn: Callable[[], Any], *, repeats: int = 20, warmup: int = 3) -> list[float]:
        """Seconds per run, host clock around ``fn()`` and ``block_until_ready`` on its result."""
        import jax

        for _ in range(warmup):
            jax.block_until_ready(fn())
        self.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            if out is None:
                self.synchronize()
            else:
                jax.block_until_ready(out)
            times.append(time.perf_counter() - t0)
        return times

    def roofline(self) -> None:
        """None: have the bench measure the roofs. ``compile.FIGURES`` are rough per-platform
        figures for ranking kernels, not this device's."""
        return None

    def fingerprint(self) -> dict[str, str]:
        import jax
        import jaxlib

        return {"name": self.name, "platform": self.platform, "device_kind": self.description,
                "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                "platform_version": str(getattr(self.jdev.client, "platform_version", ""))}

    def mesh_engine(self, members: Any) -> Any:
        """XLA's collectives over a ``jax.sharding.Mesh`` of the members (``mesh.JaxMesh``)."""
        from .mesh import JaxMesh

        return JaxMesh(members)

    def info(self) -> dict[str, str]:
        import jax

        facts = {"jax": jax.__version__, "platform": self.platform, "device": str(self.jdev),
                 "platform_version": str(getattr(self.jdev.client, "platform_version", ""))}
        cc = getattr(self.jdev, "compute_capability", None)
        if cc:
            facts["compute_capability"] = str(cc)
        try:
            stats = self.jdev.memory_stats() or {}
            if "bytes_limit" in stats:
                facts["memory"] = f"{stats['bytes_limit'] / 2**30:.1f} GiB"
        except Exception:  # not every platform reports memory
            pass
        return facts


def host_available() -> int | None:
    """The host's available memory in bytes (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return None
