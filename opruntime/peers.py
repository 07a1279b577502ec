"""The peers ``opruntime bench`` compares against, per device kind: the same problem through
NumPy, torch, JAX and CuPy (cuBLAS), when they are installed. Imported only by the bench.

A peer is ``make(case, host_arrays, device) -> (fn, sync) | None``: ``fn()`` runs the problem once
on already-placed inputs, ``sync()`` waits for the device; ``None`` when the peer cannot run
this case here (not installed, wrong device, op not offered).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

Peer = Callable[[Any, list[np.ndarray], Any], tuple[Callable[[], Any], Callable[[], None]] | None]


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def _noop() -> None:
    return None


# -- numpy ------------------------------------------------------------------------------------
def numpy_peer(case: Any, arrays: list[np.ndarray], device: Any):
    if device.kind != "cpu" or case.op not in ("matmul", "softmax", "log_softmax") or case.dtype == "bfloat16":
        return None
    if case.op == "matmul":
        a, b = arrays
        return (lambda: np.matmul(a, b)), _noop
    (x,) = arrays
    axis = dict(case.attrs).get("axis", -1)

    def softmax() -> np.ndarray:  # the plain five-operation version
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        out = e / e.sum(axis=axis, keepdims=True)
        return np.log(out) if case.op == "log_softmax" else out

    return softmax, _noop


# -- torch --------------------------------------------------------------------------------------
def torch_peer(case: Any, arrays: list[np.ndarray], device: Any):
    if not _has("torch") or device.kind not in ("cpu", "cuda"):
        return None
    import torch
    import torch.nn.functional as F

    if device.kind == "cuda":
        if not torch.cuda.is_available():
            return None
        dev = f"cuda:{device.name.split(':')[1]}"
        torch.backends.cuda.matmul.allow_tf32 = False  # compare float32 with float32
        torch.backends.cudnn.allow_tf32 = False
        sync = torch.cuda.synchronize
    else:
        dev, sync = "cpu", _noop
    ts = [torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in arrays]
    if case.dtype == "bfloat16":  # the bench hands bfloat16 cases over as float32 host data
        ts = [t.to(torch.bfloat16) for t in ts]
    if case.op == "matmul":
        return (lambda: torch.matmul(*ts)), sync
    if case.op in ("softmax", "log_softmax"):
        fn = torch.softmax if case.op == "softmax" else torch.log_softmax
        axis = dict(case.attrs).get("axis", -1)
        return (lambda: fn(ts[0], axis)), sync
    if case.op == "conv2d":
        a = dict(case.attrs)
        return (lambda: F.conv2d(*ts, stride=a.get("stride", 1), padding=a.get("padding", 0),
                                 dilation=a.get("dilation", 1), groups=a.get("groups", 1))), sync
    return None


# -- jax ----------------------------------------------------------------------------------------
def jax_peer(case: Any, arrays: list[np.ndarray], device: Any):
    if not _has("jax"):
        return None
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as the JAX backend: leave the others memory
    import jax
    import jax.numpy as jnp
    from jax import lax

    platform = {"cpu": "cpu", "cuda": "gpu"}.get(device.kind, device.name.split(":")[1] if device.kind == "jax" else None)
    try:
        jdev = jax.devices(platform)[0]
    except Exception:
        return None
    if any(a.dtype == np.float64 for a in arrays) and not jax.config.jax_enable_x64:
        return None
    xs = [jax.device_put(a, jdev) for a in arrays]
    if case.dtype == "bfloat16":
        xs = [x.astype(jnp.bfloat16) for x in xs]
    if case.op == "matmul":
        f = jax.jit(lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST))
    elif case.op in ("softmax", "log_softmax"):
        axis = dict(case.attrs).get("axis", -1)
        g = jax.nn.softmax if case.op == "softmax" else jax.nn.log_softmax
        f = jax.jit(lambda x: g(x, axis=axis))
    elif case.op == "conv2d":
        a = dict(case.attrs)
        s = _pair(a.get("stride", 1))
        p = _pair(a.get("padding", 0))
        d = _pair(a.get("dilation", 1))
        f = jax.jit(lambda x, w: lax.conv_general_dilated(
            x, w, s, [(p[0], p[0]), (p[1], p[1])], rhs_dilation=d, feature_group_count=a.get("groups", 1),
            dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=lax.Precision.HIGHEST))
    else:
        return None
    last: list[Any] = [None]

    def run() -> None:
        last[0] = f(*xs)

    def sync() -> None:
        if last[0] is not None:
            last[0].block_until_ready()

    return run, sync


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


# -- cupy (cuBLAS) ------------------------------------------------------------------------------
def cupy_peer(case: Any, arrays: list[np.ndarray], device: Any):
    if device.kind != "cuda" or not _has("cupy"):
        return None
    import cupy as cp

    with cp.cuda.Device(int(device.name.split(":")[1])):
        xs = [cp.asarray(a) for a in arrays]
        if case.dtype == "bfloat16":
            import ml_dtypes

            xs = [x.astype(ml_dtypes.bfloat16) for x in xs]
    sync = cp.cuda.Device(int(device.name.split(":")[1])).synchronize
    if case.op == "matmul":
        return (lambda: cp.matmul(*xs)), sync
    if case.op == "softmax" and xs[0].size <= 4096:  # tiny inputs: the bare launch cost of one CuPy kernel
        x = xs[0]
        return (lambda: cp.exp(x)), sync
    return None


def triton_peer(case: Any, arrays: list[np.ndarray], device: Any):
    """A plain one-row-per-program Triton softmax (the usual tutorial kernel), last axis only."""
    if device.kind != "cuda" or case.op != "softmax" or case.dtype != "float32" or not _has("triton"):
        return None
    if arrays[0].ndim != 2 or dict(case.attrs).get("axis", -1) not in (-1, 1) or arrays[0].shape[1] > 65536:
        return None
    from ._triton_softmax import make

    return make(arrays[0], int(device.name.split(":")[1]))


#: name -> peer. "cupy" is cuBLAS for matmul, and a bare elementwise launch for tiny softmax.
PEERS: dict[str, Peer] = {
    "numpy": numpy_peer,
    "torch": torch_peer,
    "jax": jax_peer,
    "cupy": cupy_peer,
    "triton": triton_peer,
}
