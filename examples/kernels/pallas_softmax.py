"""A softmax kernel in Pallas for the ``jax`` devices that the built-in JAX backend provides.

The kernel body is written once; ``pallas_call`` runs it interpreted on the CPU, compiled through
Triton on GPUs and through Mosaic on TPUs. Each program of the grid owns ``block_rows`` whole
rows: rows are padded to a multiple of it, columns to a power of two (at least 128, a TPU lane
tile) with -inf, which adds nothing to the sums.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from opruntime import Kernel, Problem, hookimpl

NAME = "example.softmax.pallas_rows"
MAX_COLUMNS = 16384  # a block holds whole rows in registers / VMEM


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [
        #      op         name  kind   dtypes        run
        Kernel("softmax", NAME, "jax", {"float32"}, run, supports=supports, cost=cost,
               configs=({"block_rows": 8}, {"block_rows": 16}, {"block_rows": 32})),
    ]


def _geometry(problem: Problem) -> tuple[int, int, int]:
    cols = problem.shapes[0][-1]
    return math.prod(problem.shapes[0]) // cols, cols, max(128, 1 << (cols - 1).bit_length())


def supports(problem: Problem) -> bool:
    return problem.attrs["axis"] == len(problem.shapes[0]) - 1 and _geometry(problem)[2] <= MAX_COLUMNS


def cost(problem: Problem, config: Any) -> float:
    rows, _, padded = _geometry(problem)
    return 2 * rows * padded * 4 / 1e12 + 10e-6  # a rough GPU figure: one read, one write


def _body(x_ref: Any, o_ref: Any) -> None:
    import jax.numpy as jnp

    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)


@functools.cache
def _compiled(shape: tuple[int, ...], block_rows: int, platform: str) -> Any:
    """One jitted function per (shape, config, platform): JAX traces and compiles it on first use."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    cols = shape[-1]
    rows, padded = math.prod(shape) // cols, max(128, 1 << (cols - 1).bit_length())
    rp = -(-rows // block_rows) * block_rows
    call = pl.pallas_call(
        _body,
        out_shape=jax.ShapeDtypeStruct((rp, padded), jnp.float32),
        grid=(rp // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, padded), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_rows, padded), lambda i: (i, 0)),
        interpret=platform == "cpu",  # no Pallas compiler for CPUs: the interpreter runs the same body
    )

    def softmax(x: Any) -> Any:
        x = jnp.pad(x.reshape(rows, cols), ((0, rp - rows), (0, padded - cols)), constant_values=-jnp.inf)
        return call(x)[:rows, :cols].reshape(shape)

    return jax.jit(softmax)


def run(problem: Problem, config: Any, x: Any) -> Any:
    platform = problem.device.split(":")[1]  # "jax:gpu:0" -> "gpu"
    return _compiled(problem.shapes[0], config["block_rows"], platform)(x)
