"""numba loops of scaled_dot_product_attention (imported through :mod:`.jit` only): flash attention
with the products by BLAS. A task is one (batch, head, pair of query blocks); per block of
``qblock`` query rows the keys are visited in blocks of ``kblock`` with an online softmax, so that
no more than one (query block x key block) tile of scores exists per task (it stays in L2):

* the scores ``qs @ k[j0:j1].T`` (``qs`` the block's queries, scaled once) and the block's
  contribution ``p @ v[j0:j1]`` are ``np.dot`` calls on contiguous blocks: numba hands them to
  scipy's BLAS (sgemm / dgemm), about 120 GFLOP/s a core on 64-row blocks where loops written
  here reached 24 (the earlier kernel of this module);
* between them, per row: the mask, the causal cut, the running max ``m`` (``maxnum``: a NaN score
  is not the max, its exp makes the row NaN as the reference's), the exps (the vectorized
  :func:`._nb_rows.fexp`) summed with a reassociable add, and when the max grew the running sum
  ``l`` and output ``acc`` rescaled by ``exp(m_old - m_new)``.

Causal tasks stop at their last row's key and pair query block ``p`` with block ``nqb - 1 - p``,
so every task has the same number of key blocks. A row with every key masked gives zeros, a NaN in
an additive mask a NaN row, as the operator's contract says. Batches and heads are read by index
(``b % Bx``, ``h // (H // Hx)``: broadcasting and GQA without copies); q, k and v come
C-contiguous (a head's key and value blocks are BLAS operands). A GPT-2 block's q, k and v are
strided views of one qkv projection (a head's rows 9 KB apart): read in place, one row per 4 KB
page, out of the prefetchers' reach, they cost 15 ms more than contiguous ones on the block's
8x12x1024x64 attention (with each head's keys and values copied once per task range), so the
launcher first gathers them with :func:`gather`, in parallel and in their own memory order
(each position's heads are adjacent there: 8 ms for the three); NumPy's copies took 17-40. The
output is written through ``out`` as given (the launcher passes a (B, L, H, Ev) array seen as
(B, H, L, Ev), so that joining the heads after is a view, as torch's layout). float32 and float64
natively; the launcher widens float16.

**No ``parallel=True``.** The loops are ``nogil`` and the launcher runs ranges of tasks on Python
threads: a ``prange`` region would compile a second copy of these loops (measured: 1.7 s more on
the first use), and BLAS called from numba's OpenMP threads spins up its own threads inside them.
The code is kept to one function of loops with no array expressions (each costs compile time).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._nb_math import maxnum, radd
from ._nb_rows import fexp

OPTIONS = dict(cache=True, nogil=True, error_model="numpy")


@njit(**OPTIONS)
def gather(src, dst, first, last):
    """``dst`` (B, H, S, E), C-contiguous, = ``src`` (any strides) for the tasks ``first:last`` of
    (batch, block of 64 positions): per position its heads one after another, which in a qkv
    projection's layout is one contiguous run (reads that the prefetchers follow, writes to H
    streams)."""
    n_b, n_h, n_s, n_e = src.shape
    blocks = (n_s + 63) // 64
    for t in range(first, last):
        b = t // blocks
        s0 = (t % blocks) * 64
        for i in range(s0, min(n_s, s0 + 64)):
            for h in range(n_h):
                a = src[b, h, i]
                d = dst[b, h, i]
                for e in range(n_e):
                    d[e] = a[e]


@njit(**OPTIONS)
def flash(q, k, v, mask, out, scale, causal, mask_kind, qblock, kblock, first, last):
    """``out`` (B, H, L, Ev; any strides) from ``q`` (Bq, Hq, L, E), ``k`` (Bk, Hk, S, E), ``v``
    (Bv, Hv, S, Ev) (C-contiguous) and ``mask`` (Bm, Hm, Lm, Sm; ``mask_kind`` 0 none, 1 boolean: True takes part,
    2 additive), for the tasks ``first:last`` (a task: (b, h, pair of query blocks))."""
    n_b, n_h, n_l, ev = out.shape
    bq, hq, _, e_dim = q.shape
    bk, hk, n_s, _ = k.shape
    bv, hv = v.shape[0], v.shape[1]
    bm, hm, lm, sm = mask.shape
    dt = out.dtype
    ninf = dt.type(-np.inf)
    zero = dt.type(0.0)
    nqb = (n_l + qblock - 1) // qblock
    per = (nqb + 1) // 2 if causal else nqb
    qfull = np.empty((qblock, e_dim), dt)
    afull = np.empty((qblock, ev), dt)
    pfull = np.empty((qblock, ev), dt)
    m = np.empty(qblock, dt)
    lsum = np.empty(qblock, dt)
    sfull = np.empty((qblock, min(kblock, n_s)), dt)
    for t in range(first, last):
        bh = t // per
        p = t % per
        b = bh // n_h
        h = bh % n_h
        qh = q[b % bq, h // (n_h // hq)]
        kh = k[b % bk, h // (n_h // hk)]
        vh = v[b % bv, h // (n_h // hv)]
        mh = mask[b % bm, h // (n_h // hm)]
        oh = out[b, h]
        for side in range(2 if causal and nqb - 1 - p != p else 1):
            i0 = (p if side == 0 else nqb - 1 - p) * qblock
            i1 = min(n_l, i0 + qblock)
            rows = i1 - i0
            full = rows == qblock  # else the last block: buffers of its own size (BLAS operands are whole arrays)
            qs = qfull if full else np.empty((rows, e_dim), dt)
            acc = afull if full else np.empty((rows, ev), dt)
            pv = pfull if full else np.empty((rows, ev), dt)
            for r in range(rows):
                qr = qh[i0 + r]
                qsr = qs[r]
                for e in range(e_dim):
                    qsr[e] = qr[e] * scale
                m[r] = ninf
                lsum[r] = zero
                ar = acc[r]
                for c in range(ev):
                    ar[c] = zero
            stop = min(n_s, i1) if causal else n_s
            for j0 in range(0, stop, kblock):
                nk = min(stop, j0 + kblock) - j0
                s = sfull if (full and nk == sfull.shape[1]) else np.empty((rows, nk), dt)
                np.dot(qs, kh[j0:j0 + nk].T, s)
                for r in range(rows):
                    i = i0 + r
                    sr = s[r]
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
                        mx = maxnum(mx, sr[jj])
                    base = zero if mx == ninf else mx
                    ps = zero
                    for jj in range(nk):
                        e_ = fexp(sr[jj] - base)
                        sr[jj] = e_
                        ps = radd(ps, e_)
                    if mx != m[r]:  # 0 for a row's first finite block (m = -inf)
                        alpha = dt.type(math.exp(m[r] - base))
                        lsum[r] = lsum[r] * alpha
                        ar = acc[r]
                        for c in range(ev):
                            ar[c] *= alpha
                        m[r] = mx
                    lsum[r] += ps
                np.dot(s, vh[j0:j0 + nk], pv)
                for r in range(rows):
                    ar = acc[r]
                    pr = pv[r]
                    for c in range(ev):
                        ar[c] += pr[c]
            for r in range(rows):
                d = lsum[r] if lsum[r] != zero else dt.type(1.0)  # every key masked: zeros
                orow = oh[i0 + r]
                ar = acc[r]
                for c in range(ev):
                    orow[c] = ar[c] / d
