"""numba loops of scaled_dot_product_attention (imported through :mod:`.jit` only): blocked over
queries and keys with an online softmax, one parallel task per (batch, head, block of query
rows), never more than a (query block x key block) tile of scores.

Per key block: the block's keys transposed once into a (E, keys) tile, so that each query row's
scores are one vectorized multiply-add per head dim across the keys (no horizontal sums); the
mask, causal cut and online softmax per row (running max ``m``, sum ``l``, unnormalised output
``acc`` rescaled by ``exp(m_old - m_new)``, the max taken NaN-propagating as NumPy's
``maximum`` does); then ``acc += p @ v`` as one vectorized multiply-add per key across the value
dims. Causal tasks stop at their last row's key. A row with every key masked gives zeros, a NaN
in an additive mask a NaN row, as the operator's contract says. Operands are read through their
strides (batch and head broadcasting and GQA by index: ``b % Bx``, ``h // (H // Hx)``). float32
and float64 natively; the launcher widens float16.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._nb_math import radd
from ._nb_rows import fexp

#: below this many query rows in a task, scores are dot products over the head dim (no transposed
#: key tile: for a decode step, transposing each key block would cost as much as the scores)
FEW_ROWS = 8

OPTIONS = dict(cache=True, nogil=True, error_model="numpy")


@njit(parallel=True, **OPTIONS)
def attention(q, k, v, mask, out, scale, causal, mask_kind, qblock, kblock):
    """``out`` (B, H, L, Ev) from ``q`` (Bq, Hq, L, E), ``k`` (Bk, Hk, S, E), ``v`` (Bv, Hv, S, Ev)
    and ``mask`` (Bm, Hm, Lm, Sm): ``mask_kind`` 0 none, 1 boolean (True takes part), 2 additive."""
    n_b, n_h, n_l, ev = out.shape
    bq, hq, _, e_dim = q.shape
    bk, hk, n_s, _ = k.shape
    bv, hv = v.shape[0], v.shape[1]
    bm, hm, lm, sm = mask.shape
    ninf = out.dtype.type(-np.inf)
    zero = out.dtype.type(0.0)
    nqb = (n_l + qblock - 1) // qblock
    for t in prange(n_b * n_h * nqb):
        bh = t // nqb
        i0 = (t % nqb) * qblock
        b = bh // n_h
        h = bh % n_h
        i1 = min(n_l, i0 + qblock)
        rows = i1 - i0
        qh = q[b % bq, h // (n_h // hq)]
        kh = k[b % bk, h // (n_h // hk)]
        vh = v[b % bv, h // (n_h // hv)]
        mh = mask[b % bm, h // (n_h // hm)]
        m = np.full(rows, ninf, out.dtype)
        lsum = np.zeros(rows, out.dtype)
        acc = np.zeros((rows, ev), out.dtype)
        qs = np.empty((rows, e_dim), out.dtype)
        for r in range(rows):
            qr = qh[i0 + r]
            for e in range(e_dim):
                qs[r, e] = qr[e] * scale
        kt = np.empty((e_dim, kblock), out.dtype)
        s = np.empty(kblock, out.dtype)
        stop = min(n_s, i1) if causal else n_s
        for j0 in range(0, stop, kblock):
            nk = min(stop, j0 + kblock) - j0
            few = rows < FEW_ROWS
            if not few:
                for jj in range(nk):
                    kj = kh[j0 + jj]
                    for e in range(e_dim):
                        kt[e, jj] = kj[e]
            for r in range(rows):
                i = i0 + r
                sr = s[:nk]
                qr = qs[r]
                if few:
                    for jj in range(nk):
                        kj = kh[j0 + jj]
                        d = zero
                        for e in range(e_dim):
                            d = radd(d, qr[e] * kj[e])
                        sr[jj] = d
                else:
                    sr[:] = 0
                    for e in range(e_dim):
                        qe = qr[e]
                        ke = kt[e, :nk]
                        for jj in range(nk):
                            sr[jj] += qe * ke[jj]
                if mask_kind == 1:
                    mrow = mh[i % lm]
                    for jj in range(nk):
                        if not mrow[(j0 + jj) % sm]:
                            sr[jj] = ninf
                elif mask_kind == 2:
                    mrow = mh[i % lm]
                    for jj in range(nk):
                        sr[jj] += mrow[(j0 + jj) % sm]
                if causal and j0 + nk - 1 > i:
                    for jj in range(max(0, i + 1 - j0), nk):
                        sr[jj] = ninf
                mx = m[r]
                for jj in range(nk):
                    val = sr[jj]
                    mx = val if (val > mx or val != val) else mx
                base = zero if mx == ninf else mx
                alpha = fexp(m[r] - base)  # 0 for a row's first finite block (m = -inf)
                ps = zero
                for jj in range(nk):
                    p = fexp(sr[jj] - base)
                    sr[jj] = p
                    ps += p
                lsum[r] = lsum[r] * alpha + ps
                ar = acc[r]
                for c in range(ev):
                    ar[c] *= alpha
                for jj in range(nk):
                    p = sr[jj]
                    vj = vh[j0 + jj]
                    for c in range(ev):
                        ar[c] += p * vj[c]
                m[r] = mx
        oh = out[b, h]
        for r in range(rows):
            d = lsum[r] if lsum[r] != zero else out.dtype.type(1.0)  # every key masked: zeros
            orow = oh[i0 + r]
            ar = acc[r]
            for c in range(ev):
                orow[c] = ar[c] / d
