"""A blocked matmul in Pallas: each program computes one (bm, bn) tile of one batch entry,
looping over K in steps of bk with a float32 accumulator.

The same code on every platform; :func:`~.compile.pallas_mode` interprets it on the CPU and
compiles it (Triton on GPUs, Mosaic on TPUs) elsewhere. Dims that are not multiples of the
blocks are zero-padded (zeros add nothing to a dot product) and the padding is sliced off.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Problem

from .compile import matmul_precision, next_pow2, pallas_mode, platform, round_up

#: smallest (bm, bn, bk) per platform: Triton's dot needs 16 in every dim; a TPU tile is
#: 8 x 128 (sublanes x lanes).
MIN_BLOCK = {"tpu": (8, 128, 128)}
DEFAULT_MIN = (16, 16, 16)
#: Each operand block holds all of K (bm x K and K x bn); a TPU keeps blocks in VMEM, so K
#: is bounded there. On GPUs the blocks stay in global memory and only bk-wide slices are loaded.
TPU_VMEM_BYTES = 24 * 2**20


def _kernel(a_ref: Any, b_ref: Any, o_ref: Any, *, bk: int, nk: int, precision: Any) -> None:
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    def step(k: Any, acc: Any) -> Any:
        start = pl.multiple_of(k * bk, bk)
        a = a_ref[:, pl.ds(start, bk)]
        b = b_ref[pl.ds(start, bk), :]
        return acc + jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, nk, step, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def blocks(problem: Problem, config: Mapping[str, Any]) -> tuple[int, int, int]:
    """The config's (bm, bn, bk), shrunk to the problem (never below the platform's minimum)."""
    (*_, m, k), (*_, n) = problem.shapes[0], problem.shapes[1]
    mins = MIN_BLOCK.get(platform(problem), DEFAULT_MIN)
    return tuple(min(config[b], max(lo, next_pow2(d))) for b, lo, d in zip(("bm", "bn", "bk"), mins, (m, n, k)))


def supports(problem: Problem) -> bool:
    if platform(problem) != "tpu":
        return True
    bm, bn, bk = blocks(problem, {"bm": 128, "bn": 128, "bk": 128})
    kp = round_up(problem.shapes[0][-1], bk)
    return 2 * (bm + bn) * kp * 4 <= TPU_VMEM_BYTES


def build(problem: Problem, config: Mapping[str, Any]) -> Any:
    """The traceable function ``(a, b) -> a @ b`` for this problem and config."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    sa, sb = problem.shapes
    out_shape, dtype = problem.out_shape, jnp.dtype(problem.dtype)
    batch, (m, k), n = out_shape[:-2], sa[-2:], sb[-1]
    nb = math.prod(batch)
    bm, bn, bk = blocks(problem, config)
    mp, np_, kp = round_up(m, bm), round_up(n, bn), round_up(k, bk)
    kernel = functools.partial(_kernel, bk=bk, nk=kp // bk, precision=matmul_precision(problem.dtype))
    mode = pallas_mode(platform(problem), config.get("num_warps"), config.get("num_stages"))

    def operand(x: Any, shape: tuple[int, ...], rows: int, cols: int) -> tuple[Any, bool]:
        """x as (batch or 1, rows, cols) zero-padded; True when it has the full batch."""
        own = math.prod(shape[:-2])
        if own not in (1, nb):  # partly broadcast batch dims: materialise the broadcast
            x, own = jnp.broadcast_to(x, (*batch, *shape[-2:])), nb
        x = x.reshape(own, *shape[-2:])
        if x.shape[1:] != (rows, cols):
            x = jnp.pad(x, ((0, 0), (0, rows - x.shape[1]), (0, cols - x.shape[2])))
        return x, own == nb and nb > 1

    def matmul(a: Any, b: Any) -> Any:
        a, a_batched = operand(a, sa, mp, kp)
        b, b_batched = operand(b, sb, kp, np_)
        call = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((nb, mp, np_), dtype),
            grid=(nb, mp // bm, np_ // bn),
            in_specs=[pl.BlockSpec((None, bm, kp), (lambda z, i, j: (z, i, 0)) if a_batched else (lambda z, i, j: (0, i, 0))),
                      pl.BlockSpec((None, kp, bn), (lambda z, i, j: (z, 0, j)) if b_batched else (lambda z, i, j: (0, 0, j)))],
            out_specs=pl.BlockSpec((None, bm, bn), lambda z, i, j: (z, i, j)),
            name="opruntime_matmul",
            **mode,
        )
        out = call(a, b)
        if (mp, np_) != (m, n):
            out = out[:, :m, :n]
        return out.reshape(out_shape)

    return matmul
