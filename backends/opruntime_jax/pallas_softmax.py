"""A row-blocked softmax / log_softmax in Pallas: each program owns ``block_rows`` whole rows
(padded to a power-of-two length), takes the row max, the exponentials and their sum in
float32 registers / VMEM, and writes the result once: one read and one write of the data.

The softmax axis is moved last and the rest flattened to rows. Padding columns hold -inf
(exp gives 0, so sums are unchanged); padding rows are sliced off. The same code runs on every
platform; :func:`~.compile.pallas_mode` picks interpret (CPU) or compile (Triton / Mosaic).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Problem

from .compile import next_pow2, pallas_mode, platform, round_up

#: (rows, columns) a block is at least: a TPU tile is 8 x 128; Triton wants powers of two.
MIN_BLOCK = {"tpu": (8, 128)}
DEFAULT_MIN = (1, 16)
#: A row lives in registers (GPU) or VMEM (TPU) whole: longer rows are left to XLA.
MAX_COLUMNS = 32768


def _kernel(x_ref: Any, o_ref: Any, *, log: bool) -> None:
    import jax.numpy as jnp

    x = x_ref[...].astype(jnp.float32)
    shifted = x - jnp.max(x, axis=1, keepdims=True)
    e = jnp.exp(shifted)
    total = jnp.sum(e, axis=1, keepdims=True)
    out = shifted - jnp.log(total) if log else e / total
    o_ref[...] = out.astype(o_ref.dtype)


def rows_cols(problem: Problem) -> tuple[int, int]:
    shape, axis = problem.shapes[0], problem.attrs["axis"]
    return math.prod(shape) // shape[axis], shape[axis]


def padded_cols(problem: Problem) -> int:
    return max(MIN_BLOCK.get(platform(problem), DEFAULT_MIN)[1], next_pow2(rows_cols(problem)[1]))


def supports(problem: Problem) -> bool:
    return padded_cols(problem) <= MAX_COLUMNS


def configs(problem: Problem) -> list[dict[str, Any]]:
    """Rows per program so a program holds ~4K elements (whole rows), and Triton warps to match;
    the first is the heuristic's choice, then half and double the rows."""
    rows, _ = rows_cols(problem)
    cols = padded_cols(problem)
    min_rows = MIN_BLOCK.get(platform(problem), DEFAULT_MIN)[0]
    top = max(min_rows, next_pow2(rows))
    best = min(top, max(min_rows, 4096 // cols))
    out = []
    for br in dict.fromkeys((best, max(min_rows, best // 2), min(top, best * 2))):
        elems = br * cols
        warps = 4 if elems <= 2048 else 8 if elems <= 8192 else 16
        out.append({"block_rows": br, "num_warps": warps} if platform(problem) == "gpu" else {"block_rows": br})
    return out


def build(problem: Problem, config: Mapping[str, Any], log: bool) -> Any:
    """The traceable function ``x -> softmax(x)`` (or log_softmax) for this problem and config."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    axis, last = problem.attrs["axis"], len(problem.shapes[0]) - 1
    rows, cols = rows_cols(problem)
    br, cp = config["block_rows"], padded_cols(problem)
    rp = round_up(rows, br)
    dtype = jnp.dtype(problem.dtype)
    call = pl.pallas_call(
        functools.partial(_kernel, log=log),
        out_shape=jax.ShapeDtypeStruct((rp, cp), dtype),
        grid=(rp // br,),
        in_specs=[pl.BlockSpec((br, cp), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, cp), lambda i: (i, 0)),
        name="opruntime_log_softmax" if log else "opruntime_softmax",
        **pallas_mode(platform(problem), config.get("num_warps"), config.get("num_stages")),
    )

    def softmax(x: Any) -> Any:
        if axis != last:
            x = jnp.moveaxis(x, axis, -1)
        moved = x.shape
        x = x.reshape(rows, cols)
        if (rp, cp) != (rows, cols):
            x = jnp.pad(x, ((0, rp - rows), (0, cp - cols)), constant_values=-jnp.inf)
        out = call(x)
        if (rp, cp) != (rows, cols):
            out = out[:rows, :cols]
        out = out.reshape(moved)
        return jnp.moveaxis(out, -1, axis) if axis != last else out

    return softmax
