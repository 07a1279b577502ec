"""A softmax kernel in Pallas for the ``jax`` devices that the built-in JAX backend provides.

The kernel body is written once; ``pallas_call`` runs it interpreted on the CPU, compiled through
Triton on GPUs and through Mosaic on TPUs. Each program of the grid owns ``block_rows`` whole
rows: rows are padded to a multiple of it, columns to a power of two (at least 128, a TPU lane
tile) with -inf, which adds nothing to the sums.
"""

from __future__ import annotations

import math
from typing import Any

from opruntime import Kernel, Problem, hookimpl

NAME = "pallas_softmax.softmax.rows"  # <plugin name>.<op>.<variant>
MAX_COLUMNS = 16384  # a block holds whole rows in registers / VMEM


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [
        #      op         name  kind   dtypes
        Kernel("softmax", NAME, "jax", {"float32"}, prepare=prepare, supports=supports, cost=cost,
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


def prepare(problem: Problem, config: Any) -> Any:
    """One jitted function per problem and config (JAX traces and compiles it on the first call);
    the runtime keeps it in its one bounded launch cache, so nothing is cached here."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    shape, block_rows = problem.shapes[0], config["block_rows"]
    platform = problem.device.provider.platform  # "gpu" for jax:gpu:0
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
