"""max_pool2d, avg_pool2d and adaptive_avg_pool2d on JAX devices, through XLA.

* max / avg: ``lax.reduce_window`` (max from -inf, NaN propagating; add from 0) over the input
  padded by ``padding`` before it and, after it, as far as the last window reaches (``ceil_mode``
  may take a window past the right padding). avg divides by torch's divisor, a constant (oh, ow)
  table, float16 / bfloat16 summed in float32.
* adaptive avg: a mean over H and W for the 1x1 (global) pool, a reshape-mean when the windows
  tile the input, else separable means over the computed windows (oh + ow static slices).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem

from .compile import JitKernel, device_cost, io_bytes
from .matmul import FLOATS

HALF = ("float16", "bfloat16")


def _window(problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...], tuple[int, ...]]:
    """reduce_window's dims, strides, padding and dilation for the 4-D input."""
    a = problem.attrs
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel_size"], a["stride"], a["padding"], a["dilation"]
    _, _, h, w = problem.shapes[0]
    oh, ow = problem.out_shape[2:]
    # after the input: the padding, or further where ceil_mode's last window reaches past it
    bh = max(ph, (oh - 1) * sh + dh * (kh - 1) + 1 - h - ph)
    bw = max(pw, (ow - 1) * sw + dw * (kw - 1) + 1 - w - pw)
    return (1, 1, kh, kw), (1, 1, sh, sw), ((0, 0), (0, 0), (ph, bh), (pw, bw)), (1, 1, dh, dw)


def _divisor(problem: Problem) -> np.ndarray:
    """torch's avg_pool2d divisor per output, (oh, ow)."""
    a = problem.attrs
    out = []
    for size, o, k, p, s in zip(problem.shapes[0][2:], problem.out_shape[2:], a["kernel_size"], a["padding"],
                                a["stride"]):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        out.append(end - start if a["count_include_pad"] else np.minimum(end, size) - np.maximum(start, 0))
    return np.outer(*out)


def build_max(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax
    import jax.numpy as jnp

    dims, strides, pads, dil = _window(problem)
    oh, ow = problem.out_shape[2:]

    def run(x: Any) -> Any:
        y = jax.lax.reduce_window(x, jnp.array(-jnp.inf, x.dtype), jax.lax.max, dims, strides, pads,
                                  window_dilation=dil)
        return y[:, :, :oh, :ow]  # the padding gives exactly (oh, ow) windows: a no-op kept as a guard

    return run


def build_avg(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax
    import jax.numpy as jnp

    dims, strides, pads, _ = _window(problem)
    div = _divisor(problem)
    oh, ow = problem.out_shape[2:]
    acc = jnp.float32 if problem.dtype in HALF else None

    def run(x: Any) -> Any:
        xa = x if acc is None else x.astype(acc)
        y = jax.lax.reduce_window(xa, jnp.array(0, xa.dtype), jax.lax.add, dims, strides, pads)
        return (y[:, :, :oh, :ow] / jnp.asarray(div, xa.dtype)).astype(x.dtype)

    return run


def build_adaptive(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax.numpy as jnp

    n, c, h, w = problem.shapes[0]
    oh, ow = problem.out_shape[2:]
    acc = jnp.float32 if problem.dtype in HALF else None
    i, j = np.arange(oh), np.arange(ow)
    hs, he = (i * h) // oh, -((-(i + 1) * h) // oh)
    ws, we = (j * w) // ow, -((-(j + 1) * w) // ow)

    def run(x: Any) -> Any:
        if oh == 1 and ow == 1:
            y = jnp.mean(x, axis=(2, 3), keepdims=True, dtype=acc)
        elif h % oh == 0 and w % ow == 0:
            y = jnp.mean(x.reshape(n, c, oh, h // oh, ow, w // ow), axis=(3, 5), dtype=acc)
        else:
            rows = jnp.stack([jnp.mean(x[:, :, a:b], axis=2, dtype=acc) for a, b in zip(hs, he)], axis=2)
            y = jnp.stack([jnp.mean(rows[..., a:b], axis=3) for a, b in zip(ws, we)], axis=3)
        return y.astype(x.dtype)

    return run


def pool_cost(problem: Problem, config: Any) -> float:
    kh, kw = problem.attrs.get("kernel_size", (1, 1))
    return device_cost(problem, float(math.prod(problem.out_shape) * kh * kw), io_bytes(problem), byte_eff=0.7)


def adaptive_cost(problem: Problem, config: Any) -> float:
    return device_cost(problem, float(math.prod(problem.shapes[0])), io_bytes(problem), byte_eff=0.7)


def kernels() -> list[Kernel]:
    table = []
    for op, build, cost, how in (
        ("max_pool2d", build_max, pool_cost, "lax.reduce_window max from -inf"),
        ("avg_pool2d", build_avg, pool_cost, "lax.reduce_window add, torch's divisor, half types in float32"),
        ("adaptive_avg_pool2d", build_adaptive, adaptive_cost, "means over the windows (global, reshape, separable)"),
    ):
        name = f"jax.{op}.xla"
        table.append(Kernel(op, name, "jax", FLOATS, prepare=JitKernel(name, build).prepare, cost=cost, vendor=True,
                            source=how))
    return table
