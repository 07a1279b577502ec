"""layer_norm, rms_norm and batch_norm on JAX devices: jax.numpy through XLA (mean and variance
fused into one reduction kernel and the normalisation into its epilogue). float16 / bfloat16 are
computed in float32 inside the fused kernel (no extra memory traffic). batch_norm computes
``(x - mean) * scale + bias`` per channel (``scale = weight / sqrt(var + eps)``), the centring
first: see :func:`build_batch`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from .compile import JitKernel, accumulator, device_cost, io_bytes
from .matmul import FLOATS

DEFAULT_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def _split(problem: Problem, vecs: tuple[Any, ...]) -> tuple[Any, Any]:
    w = vecs[0] if problem.attrs["weight"] else None
    b = vecs[-1] if problem.attrs["bias"] else None
    return w, b


def build_rows(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax.numpy as jnp

    rms = problem.op == "rms_norm"
    axes = tuple(range(len(problem.shapes[0]) - problem.attrs["dims"], len(problem.shapes[0])))
    eps = problem.attrs["eps"]
    eps = DEFAULT_EPS[problem.dtype] if eps is None else eps
    acc = accumulator(problem.dtype)

    def rows(x: Any, *vecs: Any) -> Any:
        w, b = _split(problem, vecs)
        t = x.astype(acc)
        if not rms:
            t = t - jnp.mean(t, axis=axes, keepdims=True)
        y = t * jnp.reciprocal(jnp.sqrt(jnp.mean(t * t, axis=axes, keepdims=True) + eps))
        if w is not None:
            y = y * w.astype(acc)
        if b is not None:
            y = y + b.astype(acc)
        return y.astype(x.dtype)

    return rows


def build_batch(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax.numpy as jnp

    eps = problem.attrs["eps"]
    acc = accumulator(problem.dtype)

    def batch(x: Any, mean: Any, var: Any, *vecs: Any) -> Any:
        w, b = _split(problem, vecs)
        per_channel = (-1,) + (1,) * (x.ndim - 2)
        scale = jnp.reciprocal(jnp.sqrt(var.astype(acc) + eps))
        if w is not None:
            scale = scale * w.astype(acc)
        # the centring first: folded into x * scale + (bias - mean * scale), the two terms are
        # rounded before they cancel where the output is near zero (an error of an ulp of
        # |mean * scale|, 2e-4 relative in float32 with mean ~ 100 and outputs ~ 0.01)
        y = (x.astype(acc) - mean.astype(acc).reshape(per_channel)) * scale.reshape(per_channel)
        if b is not None:
            y = y + b.astype(acc).reshape(per_channel)
        return y.astype(x.dtype)

    return batch


def xla_cost(problem: Problem, config: Any) -> float:
    return device_cost(problem, 6.0 * math.prod(problem.out_shape), io_bytes(problem), byte_eff=0.85)


def kernels() -> list[Kernel]:
    table = []
    for op, build, src in (("layer_norm", build_rows, "jnp mean / var, half types in float32"),
                           ("rms_norm", build_rows, "jnp mean of squares, half types in float32"),
                           ("batch_norm", build_batch, "(x - mean) * scale + bias per channel, half types in float32")):
        name = f"jax.{op}.xla"
        table.append(Kernel(op, name, "jax", FLOATS, prepare=JitKernel(name, build).prepare, cost=xla_cost,
                            vendor=True, source=src))
    return table
