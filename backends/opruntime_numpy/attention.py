"""scaled_dot_product_attention on the CPU: blocked over queries and keys with an online softmax.

For each block of query rows, the key / value blocks are visited once, keeping per row the running
maximum ``m``, the running sum ``l`` of ``exp(s - m)`` and the unnormalised output ``acc``; a new
block rescales them by ``exp(m_old - m_new)``. Memory stays O(rows x keys of one block) per head
(:data:`TILE` elements of scores across the heads), never L x S. Causal blocks past a query
block's last row are skipped. Batches and heads are NumPy broadcasting: GQA groups are a
dimension of their own (q as (B, Hk, G, L, E) against k as (B, Hk, 1, S, E)), so no key or value is
copied per group. float16 is computed in float32; float32 and float64 in their own precision.

With numba (:mod:`.jit`), ``numpy.scaled_dot_product_attention.numba`` runs the same algorithm as
compiled loops (:mod:`._nb_attention`): one parallel task per (batch, head, block of
:data:`NUMBA_QUERY_BLOCK` query rows), the scores of one row against a block of
:data:`NUMBA_KEY_BLOCK` keys at a time, operands read in place through their strides (no
broadcast copies, no Python loop over blocks): it wins where the NumPy kernel's per-block Python
steps and small matmuls dominate, and the NumPy kernel (BLAS) where the blocks are large.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, roofline

from . import jit
from .matmul import CPU_BYTES, CPU_FLOPS

#: query rows per parallel task and keys per score block of the numba kernel
NUMBA_QUERY_BLOCK = 32
NUMBA_KEY_BLOCK = 128

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
    """BLAS for the products, plus NumPy's exp (libm, about 6 ns a score) and the Python steps of
    the block loops (about 150 us each, small batched matmuls included)."""
    from opruntime.ops import OPS

    op = OPS["scaled_dot_product_attention"]
    B, H, L, _ = problem.out_shape
    S, E = problem.shapes[1][-2:]
    scores = op.flops(problem) / (2.0 * (E + problem.out_shape[-1]))
    kb = min(S, KEY_BLOCK)
    qb = max(1, min(L, max(16, TILE // max(1, B * H * kb))))
    steps = -(-L // qb) * -(-S // kb)
    return roofline(op.flops(problem), op.bytes(problem), CPU_FLOPS, CPU_BYTES, 2e-5) + scores * 6e-9 + steps * 1.5e-4


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.scaled_dot_product_attention.numba``."""
    nb = jit.loops("_nb_attention")
    acc_t = np.dtype(np.float32 if problem.dtype == "float16" else problem.dtype)
    kind = {None: 0, "bool": 1, "float": 2}[problem.attrs["mask"]]
    scale, causal = problem.attrs["scale"], problem.attrs["causal"]
    absent = np.zeros((1, 1, 1, 1), acc_t)

    @np.errstate(invalid="ignore", over="ignore", divide="ignore")
    def launch(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        q, k, v = (a.astype(acc_t, copy=False) for a in (q, k, v))
        if mask is None:
            mask = absent
        elif mask.dtype != np.bool_:
            mask = mask.astype(acc_t, copy=False)
        out = np.empty(problem.out_shape, acc_t)
        jit.call(nb.attention, q, k, v, mask, out, scale, causal, kind, NUMBA_QUERY_BLOCK, NUMBA_KEY_BLOCK)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.scaled_dot_product_attention.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """Compiled loops at about 24 GFLOP/s on this 2-core machine (half of BLAS), with a
    vectorized exp and no per-block Python step: measured faster than the NumPy kernel up to
    about 512 x 512 per head and for decode steps (L = 1), slower from 2048 x 2048."""
    from opruntime.ops import OPS

    op = OPS["scaled_dot_product_attention"]
    return roofline(op.flops(problem), op.bytes(problem), 24e9, CPU_BYTES, 1e-5)


def kernels() -> list[Kernel]:
    out = [Kernel("scaled_dot_product_attention", "numpy.scaled_dot_product_attention.blocked", "cpu", FLOATS,
                  attention, cost=cost)]
    if jit.available():
        out.append(Kernel("scaled_dot_product_attention", "numpy.scaled_dot_product_attention.numba", "cpu", FLOATS,
                          prepare=prepare_numba, cost=numba_cost, source=jit.source("_nb_rows", "_nb_attention"),
                          notes=jit.notes("numpy.scaled_dot_product_attention.numba")))
    return out
