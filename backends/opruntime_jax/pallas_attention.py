"""scaled_dot_product_attention as a Pallas flash kernel: no L x S buffer, one pass over the keys.

The grid is (query blocks, batch, heads). A program owns ``block_q`` query rows of one (batch,
head): it loads its q block once, then loops over the keys in blocks of ``block_k`` (sliced out
of the whole (S, E) key / value matrices of its head, which stay in global memory on GPUs),
keeping per row in float32 the running maximum ``m``, the running sum ``l`` of the
exponentials and the unnormalised output ``acc`` (the online softmax of FlashAttention); a new
block rescales them by ``exp(m_old - m_new)``. The output block is written once, ``acc / l``.
Scores are taken as ``q . k * scale * log2(e)`` and exponentiated with ``exp2`` (an additive mask
is scaled by ``log2(e)`` too), which is the same softmax. float16 / bfloat16 operands go into the
dots as they are (float32 accumulation) and the probabilities are rounded to the operand dtype
for the ``p @ v`` dot, as flash kernels (and ``jax.nn.dot_product_attention``) do; float32 dots
are true float32 (``Precision.HIGHEST``: no TF32).

The key loop runs in two parts: the blocks every row of the program sees whole (no mask work
at all) and the *edge* blocks, where the causal diagonal crosses the block or the keys end
before it (padding): only those compute the column / row indices. Causal programs stop at the
last block a row of theirs can see (blocks past the diagonal are skipped, about half the work)
and are launched longest first (the query-block index is reversed), so the short ones fill the
tail. A row whose every key is masked ends with ``l = 0`` and gives zeros; a NaN in the mask
gives a NaN row (``max`` propagates it).

Operands keep the contract's 4-D layout (B_x, H_x, rows, cols): broadcast batches and heads and
grouped-query attention are the block index maps (q head ``h // (H // Hq)``, batch ``b`` or 0),
so no operand is repeated. A boolean mask is passed as int8 (Triton and Mosaic load no ``i1``
blocks); an additive mask in the computation dtype. Rows and keys are zero-padded to whole blocks
and the head dims to a power of two (at least 16: Triton's dot; a multiple of 128 on TPUs, the
lane width); padded keys are masked, padded rows and columns sliced off.

Platforms (:func:`~.compile.pallas_mode`): interpreted on the CPU (slow: :func:`supports` keeps
it to small problems there), Triton on GPUs (``num_warps`` / ``num_stages`` from the config),
Mosaic on TPUs (blocks TPU-legal: ``block_q`` a multiple of 32, ``block_k`` of 128; the key and
value matrices of a head must fit VMEM, which :func:`supports` checks).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Problem

from .compile import matmul_precision, next_pow2, pallas_mode, platform, round_up

LOG2E = math.log2(math.e)

#: smallest (block_q, block_k) and head-dim multiple per platform: Triton's dot takes 16 or more
#: in every dim and power-of-two shapes; a TPU tile is 8 x 128 (int8: 32 x 128), so a boolean
#: mask block (block_q, block_k) wants block_q % 32 == 0 and keys along the 128 lanes.
MIN_BLOCK = {"tpu": (32, 128)}
DEFAULT_MIN = (16, 16)
#: head dims (E, Ev) past this do not fit a program's registers on GPUs
MAX_HEAD_DIM = 256
#: On a TPU, a program's whole (S, E) key and value blocks are in VMEM (double-buffered).
TPU_VMEM_BYTES = 24 * 2**20
#: Interpreted on the CPU, every program is a step of an XLA loop: keep it to small problems
#: (the conformance cases); the blocked jnp kernel does the rest there.
CPU_MAX_STEPS = 4096
CPU_MAX_SCORES = 1 << 22


def _kernel(q_ref: Any, k_ref: Any, v_ref: Any, *refs: Any, scale: float, causal: bool, mask: str | None,
            S: int, nq: int, bq: int, bk: int, mask_rows: bool, mask_cols: bool, precision: Any,
            interpreted: bool = False) -> None:
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    m_ref, o_ref = refs if mask else (None, refs[0])
    f32 = jnp.float32
    qi = pl.program_id(0)
    if causal:  # the longest programs (last query blocks) first
        qi = nq - 1 - qi
    row0 = qi * bq
    nk = -(-S // bk)
    q = q_ref[...]
    qk_scale = scale * LOG2E
    if interpreted:
        # XLA on the CPU recomputes an elementwise ``s * scale`` inside each consumer's fusion and
        # contracts it into an FMA in one of them: the row max and the exponent's argument then
        # differed by an ulp (a one-key softmax gave 1 - 2^-24). The scale goes into q, so s is the
        # product's own result, computed once.
        q = q.astype(f32) * qk_scale

    def step(j: Any, carry: tuple[Any, Any, Any], edge: bool) -> tuple[Any, Any, Any]:
        m, lsum, acc = carry
        start = pl.multiple_of(j * bk, bk)
        k = k_ref[pl.ds(start, bk), :]
        s = lax.dot_general(q, k.astype(f32) if interpreted else k, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=f32)
        if not interpreted:  # (interpreted: the scale is in q)
            s = s * qk_scale
        if m_ref is not None:
            mk = m_ref[:, pl.ds(start, bk)] if mask_cols else m_ref[...]
            if mask == "bool":
                s = jnp.where(mk != 0, s, -jnp.inf)
            else:
                s = s + mk.astype(f32) * LOG2E
        if edge:  # the causal diagonal or the end of the keys crosses this block
            cols = start + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
            keep = cols < S
            if causal:
                keep = jnp.logical_and(keep, cols <= row0 + lax.broadcasted_iota(jnp.int32, (bq, bk), 0))
            s = jnp.where(keep, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        base = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row with no key yet: exp2(-inf) = 0
        p = jnp.exp2(s - base)
        alpha = jnp.exp2(m - base)
        lsum = lsum * alpha + jnp.sum(p, axis=1, keepdims=True)
        v = v_ref[pl.ds(start, bk), :]
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                             preferred_element_type=f32)
        return m_new, lsum, acc * alpha + pv

    carry = (jnp.full((bq, 1), -jnp.inf, f32), jnp.zeros((bq, 1), f32), jnp.zeros(o_ref.shape, f32))
    if causal:  # blocks wholly at or below the diagonal of the first row, then the edge ones
        full = lax.div(jnp.minimum(row0 + 1, S), bk)
        end = jnp.minimum(lax.div(row0 + bq + bk - 1, bk), nk)
    else:
        full, end = S // bk, nk
    carry = lax.fori_loop(0, full, functools.partial(_swap, step, edge=False), carry)
    carry = lax.fori_loop(full, end, functools.partial(_swap, step, edge=True), carry)
    _, lsum, acc = carry
    o_ref[...] = (acc / jnp.where(lsum == 0.0, 1.0, lsum)).astype(o_ref.dtype)  # every key masked: zeros


def _swap(step: Any, j: Any, carry: Any, edge: bool) -> Any:
    return step(j, carry, edge)


# -- blocks ------------------------------------------------------------------------------------------
def head_dims(problem: Problem) -> tuple[int, int]:
    """E and Ev padded: a power of two (at least 16) for Triton, a multiple of 128 on TPUs."""
    E, Ev = problem.shapes[0][-1], problem.shapes[2][-1]
    if platform(problem) == "tpu":
        return round_up(E, 128), round_up(Ev, 128)
    return max(16, next_pow2(E)), max(16, next_pow2(Ev))


def blocks(problem: Problem, config: Mapping[str, Any]) -> tuple[int, int]:
    """The config's (block_q, block_k), shrunk to the problem, never below the platform's minimum."""
    L, S = problem.out_shape[2], problem.shapes[1][2]
    lo_q, lo_k = MIN_BLOCK.get(platform(problem), DEFAULT_MIN)
    return (min(config["block_q"], max(lo_q, next_pow2(L))), min(config["block_k"], max(lo_k, next_pow2(S))))


def supports(problem: Problem) -> bool:
    plat = platform(problem)
    E, Ev = problem.shapes[0][-1], problem.shapes[2][-1]
    if max(E, Ev) > MAX_HEAD_DIM:
        return False
    B, H, L, _ = problem.out_shape
    S = problem.shapes[1][2]
    if plat == "cpu":
        bq, bk = blocks(problem, configs(problem)[0])
        steps = B * H * -(-L // bq) * -(-S // bk)
        return steps <= CPU_MAX_STEPS and B * H * L * S <= CPU_MAX_SCORES
    if plat == "tpu":
        bq, bk = blocks(problem, configs(problem)[0])
        ep, evp = head_dims(problem)
        sp, item = round_up(S, bk), 2 if problem.dtype != "float32" else 4
        need = 2 * (sp * (ep + evp) * item + bq * (ep + evp) * item)
        if problem.attrs["mask"] is not None:
            need += 2 * bq * sp * (1 if problem.attrs["mask"] == "bool" else item)
        return need <= TPU_VMEM_BYTES
    return True


#: (block_q, block_k, num_warps, num_stages); the first of each list is the heuristic's choice,
#: the autotuner times them all. GPU rows follow Triton's fused-attention tutorial and JAX's own
#: Pallas attention (128 x 64 blocks, 4 warps up to E = 64 and 8 above); not yet measured here.
CONFIGS = {
    ("gpu", "half", 64): [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)],
    ("gpu", "half", 128): [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)],
    ("gpu", "half", 256): [(64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 2)],
    ("gpu", "float32", 64): [(64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3)],
    ("gpu", "float32", 128): [(64, 32, 4, 3), (64, 64, 8, 2), (32, 32, 4, 3)],
    ("gpu", "float32", 256): [(32, 32, 4, 2), (64, 32, 8, 2)],
    ("tpu", "any", 256): [(128, 128, None, None), (256, 128, None, None), (128, 256, None, None)],
    ("cpu", "any", 256): [(128, 128, None, None), (64, 64, None, None)],
}


def configs(problem: Problem) -> list[dict[str, Any]]:
    plat = platform(problem)
    fam = "float32" if problem.dtype == "float32" else "half"
    width = max(problem.shapes[0][-1], problem.shapes[2][-1])
    band = 64 if width <= 64 else 128 if width <= 128 else 256
    rows = (CONFIGS.get((plat, fam, band)) or CONFIGS.get((plat, "any", 256))
            or CONFIGS[("gpu", fam, band)])
    keys = ("block_q", "block_k", "num_warps", "num_stages")
    out = [{k: v for k, v in zip(keys, r) if v is not None} for r in rows]
    seen, unique = set(), []
    for c in out:  # configs that shrink to the same blocks on a small problem are one config
        key = (blocks(problem, c), c.get("num_warps"), c.get("num_stages"))
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


# -- the traceable function ------------------------------------------------------------------------
def build(problem: Problem, config: Mapping[str, Any]) -> Any:
    """The traceable function ``(q, k, v[, mask]) -> attention`` for this problem and config."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    B, H, L, Ev = problem.out_shape
    (Bq, Hq, _, E), (Bk, Hk, S, _), (Bv, Hv, _, _) = problem.shapes[:3]
    mask, causal, scale = problem.attrs["mask"], problem.attrs["causal"], problem.attrs["scale"]
    bq, bk = blocks(problem, config)
    ep, evp = head_dims(problem)
    lp, sp = round_up(L, bq), round_up(S, bk)
    nq = lp // bq
    dtype = jnp.dtype(problem.dtype)

    def index(bx: int, hx: int) -> Any:
        """The block index map of an operand with ``bx`` batches and ``hx`` heads: (batch, head)."""
        group = H // hx

        def at(b: Any, h: Any) -> tuple[Any, Any]:
            return (b if bx > 1 else 0), (h if hx == H else 0 if hx == 1 else jax.lax.div(h, group))

        return at

    def qblock(i: Any) -> Any:
        return nq - 1 - i if causal else i

    q_at, k_at, v_at = index(Bq, Hq), index(Bk, Hk), index(Bv, Hv)
    in_specs = [
        pl.BlockSpec((None, None, bq, ep), lambda i, b, h: (*q_at(b, h), qblock(i), 0)),
        pl.BlockSpec((None, None, sp, ep), lambda i, b, h: (*k_at(b, h), 0, 0)),
        pl.BlockSpec((None, None, sp, evp), lambda i, b, h: (*v_at(b, h), 0, 0)),
    ]
    mask_rows = mask_cols = False
    if mask is not None:
        Bm, Hm, Lm, Sm = problem.shapes[3]
        mask_rows, mask_cols = Lm > 1, Sm > 1
        m_at = index(Bm, Hm)
        in_specs.append(pl.BlockSpec((None, None, bq if mask_rows else 1, sp if mask_cols else 1),
                                     lambda i, b, h: (*m_at(b, h), qblock(i) if mask_rows else 0, 0)))
    kernel = functools.partial(_kernel, scale=scale, causal=causal, mask=mask, S=S, nq=nq, bq=bq, bk=bk,
                               mask_rows=mask_rows, mask_cols=mask_cols,
                               precision=matmul_precision(problem.dtype), interpreted=platform(problem) == "cpu")
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((B, H, lp, evp), dtype),
        grid=(nq, B, H),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, None, bq, evp), lambda i, b, h: (b, h, qblock(i), 0)),
        name="opruntime_flash_attention",
        **pallas_mode(platform(problem), config.get("num_warps"), config.get("num_stages")),
    )

    def pad(x: Any, rows: int, cols: int) -> Any:
        if x.shape[2:] == (rows, cols):
            return x
        return jnp.pad(x, ((0, 0), (0, 0), (0, rows - x.shape[2]), (0, cols - x.shape[3])))

    def attention(q: Any, k: Any, v: Any, m: Any = None) -> Any:
        args = [pad(q, lp, ep), pad(k, sp, ep), pad(v, sp, evp)]
        if m is not None:
            if mask == "bool":
                m = m.astype(jnp.int8)
            args.append(pad(m, lp if mask_rows else 1, sp if mask_cols else 1))
        out = call(*args)
        if (lp, evp) != (L, Ev):
            out = out[:, :, :L, :Ev]
        return out

    return attention
