"""scaled_dot_product_attention on the CPU: blocked over queries and keys with an online softmax.

For each block of query rows, the key / value blocks are visited once, keeping per row the running
maximum ``m``, the running sum ``l`` of ``exp(s - m)`` and the unnormalised output ``acc``; a new
block rescales them by ``exp(m_old - m_new)``. Memory stays O(rows x keys of one block) per head
(:data:`TILE` elements of scores across the heads), never L x S. Causal blocks past a query
block's last row are skipped. Batches and heads are NumPy broadcasting: GQA groups are a
dimension of their own (q as (B, Hk, G, L, E) against k as (B, Hk, 1, S, E)), so no key or value is
copied per group. float16 is computed in float32; float32 and float64 in their own precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, roofline

from .matmul import CPU_BYTES, CPU_FLOPS

#: score elements (across the heads) of one (query block, key block) step: a few MB in cache
TILE = 1 << 19
KEY_BLOCK = 256


def _grouped(x: np.ndarray, hk: int, g: int) -> np.ndarray:
    """(B, Hx, R, C) as (B, Hk, G, R, C): heads of the output h = hk_index * G + g."""
    b, hx, r, c = x.shape
    if hx == hk * g:
        return x.reshape(b, hk, g, r, c)
    if hx == hk:
        return x.reshape(b, hk, 1, r, c)
    return x.reshape(b, 1, 1, r, c)  # one head for all (hx == 1)


@np.errstate(invalid="ignore", over="ignore", divide="ignore")
def attention(problem: Problem, config: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray,
              mask: np.ndarray | None = None) -> np.ndarray:
    acc_t = np.dtype(np.float32 if problem.dtype == "float16" else problem.dtype)
    B, H, L, Ev = problem.out_shape
    S = k.shape[2]
    scale = problem.attrs["scale"]
    causal = problem.attrs["causal"]
    hk = max(k.shape[1], v.shape[1])  # H, a GQA group count, or 1 (both broadcast)
    g = H // hk
    # q scaled once (in the computation dtype), the keys transposed once
    qg = _grouped(q.astype(acc_t, copy=False) * acc_t.type(scale), hk, g)
    kt = _grouped(k.astype(acc_t, copy=False), hk, g).swapaxes(-1, -2)
    vg = _grouped(v.astype(acc_t, copy=False), hk, g)
    mg = None
    if mask is not None:
        mg = _grouped(mask if mask.dtype == np.bool_ else mask.astype(acc_t, copy=False), hk, g)
    out = np.empty((B, hk, g, L, Ev), acc_t)
    kb = min(S, KEY_BLOCK)
    qb = max(1, min(L, max(16, TILE // max(1, B * H * kb))))
    for i0 in range(0, L, qb):
        i1 = min(L, i0 + qb)
        qi = qg[..., i0:i1, :]
        shape = (B, hk, g, i1 - i0)
        m = np.full(shape, -np.inf, acc_t)
        lsum = np.zeros(shape, acc_t)
        acc = np.zeros((*shape, Ev), acc_t)
        stop = min(S, i1) if causal else S  # causal: row i sees keys 0..i
        for j0 in range(0, stop, kb):
            j1 = min(stop, j0 + kb)
            s = qi @ kt[..., j0:j1]
            if mg is not None:
                mi = mg[..., i0:i1, :] if mg.shape[-2] > 1 else mg
                mj = mi[..., j0:j1] if mi.shape[-1] > 1 else mi
                s = np.where(mj, s, -np.inf) if mj.dtype == np.bool_ else s + mj
            if causal and j1 - 1 > i0:  # the block reaches past the diagonal of some rows
                rows = np.arange(i0, i1)[:, None]
                s = np.where(np.arange(j0, j1)[None, :] <= rows, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))
            base = np.where(np.isneginf(m_new), 0.0, m_new).astype(acc_t, copy=False)
            p = np.exp(s - base[..., None])
            alpha = np.exp(m - base)  # 0 for a row's first finite block (m = -inf)
            lsum = lsum * alpha + p.sum(axis=-1)
            acc = acc * alpha[..., None] + p @ vg[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / np.where(lsum == 0, 1.0, lsum)[..., None]  # every key masked: zeros
    return out.reshape(B, H, L, Ev).astype(problem.dtype, copy=False)


def cost(problem: Problem, config: Any) -> float:
    from opruntime.ops import OPS

    op = OPS["scaled_dot_product_attention"]
    return roofline(op.flops(problem), op.bytes(problem), CPU_FLOPS, CPU_BYTES, 2e-5)


def kernels() -> list[Kernel]:
    return [Kernel("scaled_dot_product_attention", "numpy.scaled_dot_product_attention.blocked", "cpu", FLOATS,
                   attention, cost=cost)]
