"""scaled_dot_product_attention on JAX devices: three kernels, ranked by cost.

* ``jax.scaled_dot_product_attention.xla``: ``jax.nn.dot_product_attention`` (XLA; the vendor
  baseline). It takes (B, T, N, H) operands of one batch, one head dim and one key / value head
  count, so the kernel moves the heads next to the rows, broadcasts batches and heads (``q`` to
  H heads, ``k`` and ``v`` to a common count: its GQA does the rest), zero-pads the smaller of E
  and Ev (zeros add nothing to ``q . k``; the scale is passed explicitly) and slices the output
  back. Its causal mask is ``tril(ones((T, S)))``, top-left as the contract's. It fills masked
  scores with a large finite negative, so a row whose every key is masked comes back as the mean
  of the values (and an all ``-inf`` additive row as NaN): those rows are set to zero from the
  mask itself (``any`` of a boolean row, ``all(-inf)`` of an additive one), as the contract
  wants; a NaN in the mask still gives NaN. It materialises the L x S scores (and takes its
  softmax in float32, hence no float64 here): :func:`xla_supports` refuses problems whose
  float32 scores would pass :data:`XLA_SCORE_BYTES`.
* ``jax.scaled_dot_product_attention.blocked``: pure ``jnp`` / ``lax``, memory O(L x block).
  ``lax.map`` over query blocks; inside, ``lax.fori_loop`` over key blocks with an online softmax
  (running max ``m``, sum ``l`` and unnormalised output per row, rescaled by ``exp(m_old - m_new)``
  per block). The loop runs in two parts, the key blocks every row of the query block sees
  whole (no mask work) and the edge ones (the causal diagonal or the end of the keys, padded to a
  whole block, cross them); causal query blocks stop at the diagonal, so about half the work is
  skipped. GQA groups are a dim of their own (q as (B, Hkv, G, L, E) against k as (B, Hkv, S, E)),
  so no key or value is copied per group. float16 / bfloat16 are computed in float32 (on the
  CPU the operands are converted once; on accelerators the dots take them as they are, with
  float32 accumulation), float32 at ``Precision.HIGHEST``, float64 in float64. This is the kernel
  for long sequences (S = 32768, B = 1, H = 8, E = 128 runs on the CPU).
* ``jax.scaled_dot_product_attention.pallas``: a Pallas flash kernel (:mod:`.pallas_attention`):
  compiled through Triton on GPUs and Mosaic on TPUs, interpreted (slowly) on the CPU.

Every kernel takes the contract's 4-D operands (``opruntime/ops/attention.py``): batch ``b % Bx``,
head ``h // (H // Hx)``, mask rows 1 or L and columns 1 or S, a boolean mask as ``bool``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem, Refusal, itemsize

from . import pallas_attention
from .compile import JitKernel, accumulator, device_cost, io_bytes, matmul_precision, platform, round_up
from .matmul import FLOATS, PALLAS_FLOATS, _source

OP = "scaled_dot_product_attention"
XLA_FLOATS = frozenset({"float16", "bfloat16", "float32"})  # its softmax is float32 whatever the input


# -- shared ------------------------------------------------------------------------------------------
def _sizes(problem: Problem) -> tuple[int, int, int, int, int, int, int]:
    """(B, H, L, S, E, Ev, Hkv): Hkv is the head count k and v are brought to (the larger of theirs)."""
    B, H, L, Ev = problem.out_shape
    (_, _, _, E), (_, Hk, S, _), (_, Hv, _, _) = problem.shapes[:3]
    return B, H, L, S, E, Ev, max(Hk, Hv)


def _expand(x: Any, batch: int, heads: int) -> Any:
    """``x`` (Bx, Hx, R, C) as (batch, heads, R, C): batch broadcast (Bx is 1 or batch), head h
    reading ``h // (heads // Hx)`` (each head repeated, as the contract's index)."""
    import jax.numpy as jnp

    if x.shape[1] != heads:
        x = jnp.repeat(x, heads // x.shape[1], axis=1)
    if x.shape[0] != batch:
        x = jnp.broadcast_to(x, (batch, *x.shape[1:]))
    return x


def _flops(problem: Problem) -> float:
    from opruntime.ops import OPS

    return OPS[OP].flops(problem)


# -- jax.nn.dot_product_attention ------------------------------------------------------------------
#: The XLA kernel materialises the float32 scores (and a few more L x S temporaries of the same
#: size): it declines a problem whose B * H * L * S * 4 bytes pass this.
XLA_SCORE_BYTES = 1 << 30


def xla_supports(problem: Problem) -> bool | Refusal:
    B, H, L, S, *_ = _sizes(problem)
    if B * H * L * S * 4 > XLA_SCORE_BYTES:
        return Refusal(f"its float32 scores would take {B * H * L * S * 4 / 2**30:.1f} GiB")
    if min(L, S) == 1 and problem.dtype in ("float16", "bfloat16") and platform(problem) == "gpu":
        # seen on an H100 (jax 0.11.2): "Unsupported dot precision algorithm" at L = 1 (S = 1 and 37)
        return Refusal("XLA's GPU dot rejects the half-precision algorithm of a one-row score (L or S = 1)")
    return True


def build_xla(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax
    import jax.numpy as jnp

    B, H, L, S, E, Ev, hkv = _sizes(problem)
    width = max(E, Ev)
    mask, causal, scale = problem.attrs["mask"], problem.attrs["causal"], problem.attrs["scale"]
    highest = matmul_precision(problem.dtype) is not None
    # jax asks for F16_F16_F32 / BF16_BF16_F32 dots, which the CPU lacks (and TPUs for float16):
    # there the operands go in as float32 (the CPU has no fast half-precision dot anyway)
    plat = platform(problem)
    widen = problem.dtype in ("float16", "bfloat16") and (plat == "cpu" or plat == "tpu" and problem.dtype == "float16")

    def btnh(x: Any, batch: int, heads: int) -> Any:
        x = _expand(x, batch, heads)
        if widen:
            x = x.astype(jnp.float32)
        if x.shape[3] != width:
            x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - x.shape[3])))
        return x.swapaxes(1, 2)

    def attention(q: Any, k: Any, v: Any, m: Any = None) -> Any:
        bias = (m.astype(jnp.float32) if widen else m) if mask == "float" else None
        keep = m if mask == "bool" else None
        with jax.default_matmul_precision("highest") if highest else _nothing():
            out = jax.nn.dot_product_attention(btnh(q, B, H), btnh(k, B, hkv), btnh(v, B, hkv), bias=bias, mask=keep,
                                               scale=scale, is_causal=causal)
        out = out.swapaxes(1, 2)[..., :Ev].astype(q.dtype)
        if mask is not None:  # rows with every key masked: zeros (jax gives their mean, or NaN)
            dead = ~jnp.any(m, axis=-1, keepdims=True) if mask == "bool" else \
                jnp.all(jnp.isneginf(m), axis=-1, keepdims=True)
            out = jnp.where(dead, jnp.zeros((), out.dtype), out)
        return out

    return attention


def _nothing() -> Any:
    import contextlib

    return contextlib.nullcontext()


#: Efficiency of XLA's materialising attention against the platform figures (FLOPs, bytes of the
#: score passes). CPU: fitted on this 2-core host (float32, jax 0.10.2), where the dots ran at
#: ~80-100 GFLOP/s (1.6-2x the figure) and the score passes at ~4 GB/s: jax.nn took 0.026 ms at
#: 1 x 1 x 16 x 16 (the blocked kernel 0.032), 0.10 ms at 1 x 4 x 64 x 64 (blocked 0.077), 1.3 ms at
#: 2 x 8 x 128 x 128 (1.1), 56 ms at 1 x 8 x 1024 x 1024 (23) and 85 ms causal (24): the blocked
#: kernel is the CPU's choice except for the tiniest problems. GPU / TPU: not measured; the score
#: passes are memory-bound there too, against Pallas' one pass.
XLA_EFF = {"cpu": (1.6, 0.4), "gpu": (0.6, 0.8), "tpu": (0.6, 0.8)}


def xla_cost(problem: Problem, config: Mapping[str, Any]) -> float:
    """Every L x S score (causal ones too) through a few float32 passes: the scores, the masked
    scores, the softmax and its half-precision copy, each written and read once."""
    B, H, L, S, E, Ev, _ = _sizes(problem)
    flop_eff, byte_eff = XLA_EFF.get(platform(problem), (0.5, 0.5))
    pairs = B * H * L * S
    passes = 4 * 4 + (2 * itemsize(problem.dtype) if problem.dtype != "float32" else 0)
    return device_cost(problem, 2.0 * pairs * (E + Ev), io_bytes(problem) + pairs * passes,
                       flop_eff=flop_eff, byte_eff=byte_eff, launch_mult=2.0)


# -- blocked jnp / lax ---------------------------------------------------------------------------------
#: score elements (across the batches and heads) of one (query block, key block) step, and the
#: keys of one block: on this 2-core host (float32, H = 8, L = S = 1024-2048) 256 keys and 2^20
#: scores (4 MB) ran 1.1-1.7x faster than 128 or 512 keys and 2^16-2^19 or 2^21-2^22 scores
#: (the smaller the steps, the more XLA's per-iteration overhead shows; the larger, the less
#: stays in cache)
TILE = 1 << 20
KEY_BLOCK = 256


def blocked_blocks(problem: Problem, config: Mapping[str, Any]) -> tuple[int, int]:
    """(block_q, block_k): key blocks of ``block_k`` (all of S when shorter), query blocks so a
    step holds about ``tile`` scores across the batches and heads (at least 16 rows)."""
    B, H, L, S, *_ = _sizes(problem)
    bk = min(S, config.get("block_k", KEY_BLOCK))
    bq = min(L, max(16, config.get("tile", TILE) // (B * H * bk)))
    return bq, bk


def build_blocked(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax.numpy as jnp
    from jax import lax

    B, H, L, S, E, Ev, hkv = _sizes(problem)
    G = H // hkv
    mask, causal, scale = problem.attrs["mask"], problem.attrs["causal"], problem.attrs["scale"]
    bq, bk = blocked_blocks(problem, config)
    lp, sp = round_up(L, bq), round_up(S, bk)
    nq, nk = lp // bq, sp // bk
    dtype = jnp.dtype(problem.dtype)
    acc_t = accumulator(problem.dtype)
    on_cpu = platform(problem) == "cpu"
    dot_t = acc_t if on_cpu else dtype  # the CPU has no fast half-precision dot: convert once
    precision = matmul_precision(problem.dtype)

    def grouped_mask(m: Any) -> Any:
        """(Bm, Hm, Lm, Sm) as (Bm, Hkv or 1, G or 1, Lm, Sm), rows and keys padded to blocks."""
        bm, hm, lm, sm = m.shape
        m = m.reshape(bm, hkv, G, lm, sm) if hm == H else m.reshape(bm, 1, 1, lm, sm)
        if mask == "float":
            m = m.astype(acc_t)
        pads = ((0, 0),) * 3 + ((0, lp - L if lm > 1 else 0), (0, sp - S if sm > 1 else 0))
        return jnp.pad(m, pads) if any(p[1] for p in pads) else m

    def attention(q: Any, k: Any, v: Any, m: Any = None) -> Any:
        neg_inf = jnp.array(-jnp.inf, acc_t)  # made at trace time: float64 exists there (x64 scope)
        q = _expand(q, B, H).astype(acc_t)
        q = (q * jnp.array(scale, acc_t)).astype(dot_t) if on_cpu else q  # scaled once, exactly
        q = q.reshape(B, hkv, G, L, E)
        k = _expand(k, B, hkv).astype(dot_t)
        v = _expand(v, B, hkv).astype(dot_t)
        if lp != L:
            q = jnp.pad(q, ((0, 0),) * 3 + ((0, lp - L), (0, 0)))
        if sp != S:
            k = jnp.pad(k, ((0, 0), (0, 0), (0, sp - S), (0, 0)))
            v = jnp.pad(v, ((0, 0), (0, 0), (0, sp - S), (0, 0)))
        mg = grouped_mask(m) if m is not None else None

        def query_block(i: Any) -> Any:
            row0 = i * bq
            qi = lax.dynamic_slice_in_dim(q, row0, bq, axis=3)
            mi = mg
            if mg is not None and mg.shape[3] > 1:
                mi = lax.dynamic_slice_in_dim(mg, row0, bq, axis=3)

            def step(j: Any, carry: tuple[Any, Any, Any], edge: bool) -> tuple[Any, Any, Any]:
                mx, lsum, acc = carry
                col0 = j * bk
                kj = lax.dynamic_slice_in_dim(k, col0, bk, axis=2)
                s = jnp.einsum("bhgqe,bhke->bhgqk", qi, kj, precision=precision, preferred_element_type=acc_t)
                if not on_cpu:
                    s = s * jnp.array(scale, acc_t)
                if mi is not None:
                    mj = lax.dynamic_slice_in_dim(mi, col0, bk, axis=4) if mi.shape[4] > 1 else mi
                    s = jnp.where(mj, s, neg_inf) if mask == "bool" else s + mj
                if edge:  # the causal diagonal or the end of the keys crosses this block
                    cols = col0 + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
                    keep = cols < S
                    if causal:
                        keep = keep & (cols <= row0 + lax.broadcasted_iota(jnp.int32, (bq, bk), 0))
                    s = jnp.where(keep, s, neg_inf)
                m_new = jnp.maximum(mx, s.max(axis=-1))
                base = jnp.where(jnp.isneginf(m_new), jnp.zeros((), acc_t), m_new)  # no key yet: exp(-inf) = 0
                p = jnp.exp(s - base[..., None])
                alpha = jnp.exp(mx - base)
                vj = lax.dynamic_slice_in_dim(v, col0, bk, axis=2)
                pv = jnp.einsum("bhgqk,bhke->bhgqe", p.astype(dot_t), vj, precision=precision,
                                preferred_element_type=acc_t)
                return m_new, lsum * alpha + p.sum(axis=-1), acc * alpha[..., None] + pv

            shape = (B, hkv, G, bq)
            carry = (jnp.full(shape, -jnp.inf, acc_t), jnp.zeros(shape, acc_t), jnp.zeros((*shape, Ev), acc_t))
            if causal:  # key blocks whole at or below the first row's diagonal, then the edge ones
                full = jnp.minimum(row0 + 1, S) // bk
                end = jnp.minimum((row0 + bq + bk - 1) // bk, nk)
            else:
                full, end = S // bk, nk
            carry = lax.fori_loop(0, full, lambda j, c: step(j, c, False), carry)
            _, lsum, acc = lax.fori_loop(full, end, lambda j, c: step(j, c, True), carry)
            return acc / jnp.where(lsum == 0, jnp.ones((), acc_t), lsum)[..., None]  # every key masked: zeros

        out = lax.map(query_block, jnp.arange(nq))  # (nq, B, Hkv, G, bq, Ev)
        out = jnp.moveaxis(out, 0, 3).reshape(B, H, lp, Ev)
        return out[:, :, :L].astype(dtype)

    return attention


#: (FLOP efficiency, seconds per loop step) of the blocked kernel: its dots are one key block
#: wide and every step is an XLA while-loop iteration. CPU: fitted on this host (see XLA_EFF);
#: GPU / TPU: guesses (small dots; a while-loop step per block, whose condition the host reads),
#: ranking it below Pallas and, for small problems, below XLA.
BLOCKED_EFF = {"cpu": (1.6, 2e-5), "gpu": (0.25, 2e-5), "tpu": (0.25, 2e-5)}


def blocked_steps(problem: Problem, config: Mapping[str, Any]) -> int:
    """(query block, key block) steps the blocked kernel runs: causal blocks skip whole key blocks
    past the diagonal only."""
    import numpy as np

    B, H, L, S, *_ = _sizes(problem)
    bq, bk = blocked_blocks(problem, config)
    nq, nk = -(-L // bq), -(-S // bk)
    if not problem.attrs["causal"]:
        return nq * nk
    last = np.minimum(S, (np.arange(nq, dtype=np.int64) + 1) * bq)
    return int(np.minimum(nk, -(-last // bk)).sum())


def blocked_cost(problem: Problem, config: Mapping[str, Any]) -> float:
    """The estimate of the heuristic's (first) config, whatever ``config``: this model (fewer,
    larger steps are cheaper) cannot see the cache effects that made 256-key blocks of 2^20 scores
    the fastest measured; the other configs are for the autotuner to time."""
    B, H, L, S, E, Ev, _ = _sizes(problem)
    eff, per_step = BLOCKED_EFF.get(platform(problem), (0.25, 1e-5))
    config = blocked_configs(problem)[0]
    bq, bk = blocked_blocks(problem, config)
    steps = blocked_steps(problem, config)
    flops = 2.0 * steps * bq * bk * B * H * (E + Ev)
    reads = io_bytes(problem) + steps * bk * B * H * (E + Ev) * itemsize(problem.dtype)  # k, v per query block
    return device_cost(problem, flops, reads, flop_eff=eff, launch_mult=3.0) + steps * per_step


def blocked_configs(problem: Problem) -> list[dict[str, Any]]:
    return [{"block_k": KEY_BLOCK, "tile": TILE}, {"block_k": 512, "tile": TILE},
            {"block_k": 128, "tile": TILE // 2}]


# -- Pallas ------------------------------------------------------------------------------------------
#: Pallas flash efficiency against the platform figures (FLOPs, launch multiplier). The GPU row
#: is Triton flash attention's usual ~half of the fp16 tensor-core peak (not yet measured here);
#: untested on TPU; interpreted on the CPU it is orders of magnitude slower than XLA.
PALLAS_EFF = {"cpu": (0.002, 100.0), "gpu": (0.45, 1.5), "tpu": (0.4, 1.5)}


def pallas_cost(problem: Problem, config: Mapping[str, Any]) -> float:
    B, H, L, S, E, Ev, _ = _sizes(problem)
    eff, launch = PALLAS_EFF.get(platform(problem), (0.3, 1.5))
    bq, bk = pallas_attention.blocks(problem, config)
    ep, evp = pallas_attention.head_dims(problem)
    lp, sp = round_up(L, bq), round_up(S, bk)
    padded = (lp * sp * (ep + evp)) / (L * S * (E + Ev))  # work on padding rows, keys and head dims
    nq = lp // bq
    reads = io_bytes(problem) + nq * B * H * sp * (ep + evp) * itemsize(problem.dtype) / 8  # k, v per q block; L2
    return device_cost(problem, _flops(problem) * padded, reads, flop_eff=eff, launch_mult=launch)


def kernels() -> list[Kernel]:
    xla, blocked, pallas = (f"jax.{OP}.{v}" for v in ("xla", "blocked", "pallas"))
    return [
        Kernel(OP, xla, "jax", XLA_FLOATS, prepare=JitKernel(xla, build_xla).prepare, supports=xla_supports,
               cost=xla_cost, vendor=True, source="jax.nn.dot_product_attention; fully masked rows zeroed"),
        Kernel(OP, blocked, "jax", FLOATS, prepare=JitKernel(blocked, build_blocked).prepare, cost=blocked_cost,
               config_for=blocked_configs, configs=({"block_k": KEY_BLOCK, "tile": TILE},),
               source=_source(sys.modules[__name__])),
        Kernel(OP, pallas, "jax", PALLAS_FLOATS, prepare=JitKernel(pallas, pallas_attention.build).prepare,
               supports=pallas_attention.supports, cost=pallas_cost, config_for=pallas_attention.configs,
               configs=({"block_q": 128, "block_k": 64},), source=_source(pallas_attention)),
    ]
