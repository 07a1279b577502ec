"""numba loops of the elementwise family and the activation epilogues (imported through :mod:`.jit`
only). Operands come as 2-D arrays (rows, cols) of any strides (0 where an operand broadcasts),
or (``binary_cycle``) flat with a repeated operand; blocks of :data:`CHUNK` elements run in
parallel, each a vectorized loop. float32 and
float64 are computed natively (the launchers widen float16 to float32).

The activations are those of ``opruntime.ops.base.ACTIVATIONS``, by the codes of :data:`CODES`,
each the formula the NumPy epilogue (``epilogue.activate``) and the float64 reference use:
``gelu`` is ``0.5 x erfc(-x / sqrt 2)`` (float32: :func:`._nb_math.gelu32`, relatively
accurate in the tail), ``gelu_tanh`` ``x / (1 + exp(-2u))``, ``silu`` ``x / (1 + exp(-x))``, ``sigmoid``
``1 / (1 + exp(-x))``; NaN stays NaN, ``relu`` keeps it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ._nb_math import (
    VECTOR_BYTES,
    erfc64,
    exp32_fast,
    exp64,
    gelu32,
    stream_add,
    stream_copy,
    stream_div,
    stream_mul,
    stream_neg,
    stream_sub,
    tanh32,
    tanh64,
)

OPTIONS = dict(cache=True, nogil=True, error_model="numpy")  # IEEE results: no fast-math, no division checks
#: elements of a row per parallel task
CHUNK = 1 << 14
#: activation name -> the code the loops take (``None``: no activation; ``"neg"``: unary minus)
CODES = {None: 0, "neg": 1, "relu": 2, "gelu": 3, "gelu_tanh": 4, "silu": 5, "sigmoid": 6, "tanh": 7}
#: binary operator -> code
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3}


def _scalar(body):
    """A generic scalar function of the loops: ``body(F, exp, gelu, tanh)`` gives its implementation
    for the float type ``F`` (float32: the vectorizable forms of :mod:`._nb_math`, ``exp32_fast``,
    ``gelu32`` and ``tanh32``; float64: exp, ``0.5 v erfc(-v / sqrt 2)`` and tanh). Each is small,
    so that LLVM inlines it into the loop and vectorizes the loop."""

    def stub(v):  # pragma: no cover - replaced by the overload inside compiled code
        raise NotImplementedError

    @overload(stub)
    def _typed(v):
        if v == types.float32:
            return body(np.float32, exp32_fast, gelu32, tanh32)
        if v == types.float64:
            return body(np.float64, exp64, _gelu64, tanh64)
        return None

    return stub


@njit(error_model="numpy")
def _gelu64(v):
    return v * (0.5 * erfc64(v * -0.70710678118654752440))


relu = _scalar(lambda F, exp, gelu, tanh: lambda v: F(0.0) if v < F(0.0) else v)  # NaN stays NaN
gelu = _scalar(lambda F, exp, gelu, tanh: lambda v: gelu(v))
gelu_tanh = _scalar(lambda F, exp, gelu, tanh: lambda v: v / (
    exp((v * v * F(0.044715) + F(1.0)) * v * F(-1.5957691216057307118)) + F(1.0)))
silu = _scalar(lambda F, exp, gelu, tanh: lambda v: v / (exp(-v) + F(1.0)))
sigmoid = _scalar(lambda F, exp, gelu, tanh: lambda v: F(1.0) / (exp(-v) + F(1.0)))
tanh_ = _scalar(lambda F, exp, gelu, tanh: lambda v: tanh(v))


@njit(parallel=True, **OPTIONS)
def unary(x, out, code, stream):
    """``out = act(code, x)`` over 2-D arrays; ``stream``: rows of unit stride, neg and relu stored
    past the caches (:func:`_streamed_unary`)."""
    rows, cols = x.shape
    blocks = (cols + CHUNK - 1) // CHUNK
    for t in prange(rows * blocks):
        r = t // blocks
        c0 = (t % blocks) * CHUNK
        c1 = min(cols, c0 + CHUNK)
        xr = x[r, c0:c1]  # slices: loops from 0 index without negative-index checks, and vectorize
        yr = out[r, c0:c1]
        # one loop per code: the branch is taken once per block, each loop vectorizes on its own
        if stream and (code == 1 or code == 2):
            _streamed_unary(xr, yr, code)
        elif code == 1:
            for j in range(c1 - c0):
                yr[j] = -xr[j]
        elif code == 2:
            for j in range(c1 - c0):
                yr[j] = relu(xr[j])
        elif code == 3:
            for j in range(c1 - c0):
                yr[j] = gelu(xr[j])
        elif code == 4:
            for j in range(c1 - c0):
                yr[j] = gelu_tanh(xr[j])
        elif code == 5:
            for j in range(c1 - c0):
                yr[j] = silu(xr[j])
        elif code == 6:
            for j in range(c1 - c0):
                yr[j] = sigmoid(xr[j])
        elif code == 7:
            for j in range(c1 - c0):
                yr[j] = tanh_(xr[j])
        else:
            for j in range(c1 - c0):
                yr[j] = xr[j]


@njit(parallel=True, **OPTIONS)
def binary(a, b, out, code, stream):
    """``out = a <op> b`` over 2-D arrays: ``out`` (rows, cols); ``a`` and ``b`` (rows, cols) or
    (1, cols) (a row repeated: a bias), or of ``out``'s shape with stride 0 where they broadcast.
    A task is a block of :data:`CHUNK` elements of a row, or as many short rows as make one.
    ``stream``: every row of unit stride, the result stored past the caches (:func:`_streamed`)."""
    rows, cols = out.shape
    ra, rb = a.shape[0], b.shape[0]
    blocks = (cols + CHUNK - 1) // CHUNK
    per = max(1, CHUNK // cols)  # rows per task
    for t in prange(((rows + per - 1) // per) * blocks):
        r0 = (t // blocks) * per
        c0 = (t % blocks) * CHUNK
        c1 = min(cols, c0 + CHUNK)
        for r in range(r0, min(rows, r0 + per)):
            if stream:
                _streamed(a[r if ra > 1 else 0, c0:c1], b[r if rb > 1 else 0, c0:c1], out[r, c0:c1], code, 0)
            else:
                _plain(a[r if ra > 1 else 0, c0:c1], b[r if rb > 1 else 0, c0:c1], out[r, c0:c1], code)


@njit(parallel=True, **OPTIONS)
def binary_act(a, b, out, code, act, stream):
    """``out = act(a <op> b)``: :func:`binary` with the activation ``act`` (a code of :data:`CODES`:
    relu, gelu, gelu_tanh, silu) applied to each element as it is made, in the same vectorized
    loop (one pass over the data, no second sweep). Apart from :func:`binary` so that a plain
    operator compiles (cold, once per machine) without the activations' loops. ``stream``: as
    :func:`binary`'s, for relu (the other activations are bound by their arithmetic)."""
    rows, cols = out.shape
    ra, rb = a.shape[0], b.shape[0]
    blocks = (cols + CHUNK - 1) // CHUNK
    per = max(1, CHUNK // cols)
    for t in prange(((rows + per - 1) // per) * blocks):
        r0 = (t // blocks) * per
        c0 = (t % blocks) * CHUNK
        c1 = min(cols, c0 + CHUNK)
        for r in range(r0, min(rows, r0 + per)):
            if stream and act == 2:
                _streamed(a[r if ra > 1 else 0, c0:c1], b[r if rb > 1 else 0, c0:c1], out[r, c0:c1], code, act)
            else:
                _activated(a[r if ra > 1 else 0, c0:c1], b[r if rb > 1 else 0, c0:c1], out[r, c0:c1], code, act)


@njit(parallel=True, **OPTIONS)
def binary_cycle(f, g, out, code, div, mod, swap):
    """``out = f <op> g'`` (``g' <op> f`` with ``swap``) over 1-D C-contiguous arrays of n elements,
    where ``g'[i] = g[(i // div) % mod]``: ``g`` repeated through the output (an NCHW channel
    bias: div H * W, mod C; a column: div the row's length; a scalar: mod 1). Each task spreads
    its block's values of ``g`` into a block buffer (:func:`_spread`, in cache) and runs one
    vectorized loop on unit-stride blocks per :data:`CHUNK` elements, whatever ``div`` is (short
    rows cost no call each)."""
    n = out.shape[0]
    for t in prange((n + CHUNK - 1) // CHUNK):
        i0 = t * CHUNK
        m = min(n, i0 + CHUNK) - i0
        fill = _spread(g, i0, m, div, mod, out.dtype)
        if swap:
            _plain(fill, f[i0:i0 + m], out[i0:i0 + m], code)
        else:
            _plain(f[i0:i0 + m], fill, out[i0:i0 + m], code)


@njit(parallel=True, **OPTIONS)
def binary_cycle_act(f, g, out, code, act, div, mod, swap):
    """``out = act(f <op> g')``: :func:`binary_cycle` with the activation (as :func:`binary_act`)."""
    n = out.shape[0]
    for t in prange((n + CHUNK - 1) // CHUNK):
        i0 = t * CHUNK
        m = min(n, i0 + CHUNK) - i0
        fill = _spread(g, i0, m, div, mod, out.dtype)
        if swap:
            _activated(fill, f[i0:i0 + m], out[i0:i0 + m], code, act)
        else:
            _activated(f[i0:i0 + m], fill, out[i0:i0 + m], code, act)


@njit(**OPTIONS)
def _spread(g, i0, m, div, mod, dtype):
    """A new block of ``m`` elements: ``g[(i // div) % mod]`` for i from ``i0``, in runs of ``div``."""
    fill = np.empty(m, dtype)
    q = (i0 // div) % mod
    r = i0 % div
    j = 0
    while j < m:
        run = min(div - r, m - j)
        fill[j:j + run] = g[q]
        j += run
        r = 0
        q += 1
        if q == mod:
            q = 0
    return fill


@njit(**OPTIONS)
def _plain(a, b, y, code):
    """``y = a <op> b`` on 1-D blocks of one length, one vectorized loop per operator."""
    n = y.shape[0]
    if code == 0:
        for j in range(n):
            y[j] = a[j] + b[j]
    elif code == 1:
        for j in range(n):
            y[j] = a[j] - b[j]
    elif code == 2:
        for j in range(n):
            y[j] = a[j] * b[j]
    else:
        for j in range(n):
            y[j] = a[j] / b[j]


@njit(inline="always", **OPTIONS)
def _aligned_part(y):
    """(head, body) of the 1-D ``y``: its elements from ``head`` to ``body`` are whole vectors of
    :data:`VECTOR_BYTES` starting at an aligned address (the non-temporal stores' part)."""
    n = y.shape[0]
    lanes = VECTOR_BYTES // y.itemsize
    head = min(n, (-(y.ctypes.data // y.itemsize)) % lanes)
    return head, head + (n - head) // lanes * lanes


@njit(**OPTIONS)
def _streamed(a, b, y, code, act):
    """``y = act(a <op> b)`` (``act``: none or relu) on 1-D blocks of unit stride, ``y`` stored
    past the caches by whole vectors (:func:`._nb_math.stream_add` and kin) from its first
    :data:`VECTOR_BYTES`-aligned element; the elements before and after in scalars."""
    head, body = _aligned_part(y)
    lanes = VECTOR_BYTES // y.itemsize
    relu = act == 2
    for lo, hi in ((0, head), (body, y.shape[0])):
        if relu:
            _relu_of(a[lo:hi], b[lo:hi], y[lo:hi], code)
        else:
            _plain(a[lo:hi], b[lo:hi], y[lo:hi], code)
    if code == 0:
        for i in range(head, body, lanes):
            stream_add(y, a, b, i, relu)
    elif code == 1:
        for i in range(head, body, lanes):
            stream_sub(y, a, b, i, relu)
    elif code == 2:
        for i in range(head, body, lanes):
            stream_mul(y, a, b, i, relu)
    else:
        for i in range(head, body, lanes):
            stream_div(y, a, b, i, relu)


@njit(**OPTIONS)
def _streamed_unary(x, y, code):
    """``y = -x`` (code 1) or ``relu(x)`` (code 2) as :func:`_streamed` does a binary operator."""
    head, body = _aligned_part(y)
    lanes = VECTOR_BYTES // y.itemsize
    for lo, hi in ((0, head), (body, y.shape[0])):
        for j in range(lo, hi):
            y[j] = -x[j] if code == 1 else relu(x[j])
    if code == 1:
        for i in range(head, body, lanes):
            stream_neg(y, x, x, i, False)
    else:
        for i in range(head, body, lanes):
            stream_copy(y, x, x, i, True)


@njit(**OPTIONS)
def _activated(a, b, y, code, act):
    """``y = act(a <op> b)`` on 1-D blocks of one length: the loop for the operator and activation."""
    if act == 2:
        _relu_of(a, b, y, code)
    elif act == 3:
        _gelu_of(a, b, y, code)
    elif act == 4:
        _gelu_tanh_of(a, b, y, code)
    else:
        _silu_of(a, b, y, code)


# The fused blocks of ``_activated``: ``y = act(a <op> b)`` on 1-D blocks, one loop per operator (the
# branch taken once per block; each loop vectorizes with the activation inlined).

@njit(**OPTIONS)
def _relu_of(a, b, y, code):
    n = y.shape[0]
    if code == 0:
        for j in range(n):
            y[j] = relu(a[j] + b[j])
    elif code == 1:
        for j in range(n):
            y[j] = relu(a[j] - b[j])
    elif code == 2:
        for j in range(n):
            y[j] = relu(a[j] * b[j])
    else:
        for j in range(n):
            y[j] = relu(a[j] / b[j])


@njit(**OPTIONS)
def _gelu_of(a, b, y, code):
    n = y.shape[0]
    if code == 0:
        for j in range(n):
            y[j] = gelu(a[j] + b[j])
    elif code == 1:
        for j in range(n):
            y[j] = gelu(a[j] - b[j])
    elif code == 2:
        for j in range(n):
            y[j] = gelu(a[j] * b[j])
    else:
        for j in range(n):
            y[j] = gelu(a[j] / b[j])


@njit(**OPTIONS)
def _gelu_tanh_of(a, b, y, code):
    n = y.shape[0]
    if code == 0:
        for j in range(n):
            y[j] = gelu_tanh(a[j] + b[j])
    elif code == 1:
        for j in range(n):
            y[j] = gelu_tanh(a[j] - b[j])
    elif code == 2:
        for j in range(n):
            y[j] = gelu_tanh(a[j] * b[j])
    else:
        for j in range(n):
            y[j] = gelu_tanh(a[j] / b[j])


@njit(**OPTIONS)
def _silu_of(a, b, y, code):
    n = y.shape[0]
    if code == 0:
        for j in range(n):
            y[j] = silu(a[j] + b[j])
    elif code == 1:
        for j in range(n):
            y[j] = silu(a[j] - b[j])
    elif code == 2:
        for j in range(n):
            y[j] = silu(a[j] * b[j])
    else:
        for j in range(n):
            y[j] = silu(a[j] / b[j])


@njit(parallel=True, **OPTIONS)
def bias_act(y, bias, code):
    """In place on the 3-D ``y`` (outer, channels, inner): ``y = act(code, y + bias[channel])``
    (``bias`` of size 0: none): the epilogue of a GEMM or a convolution, in one pass."""
    outer, ch, inner = y.shape
    has_bias = bias.shape[0] > 0
    for t in prange(outer * ch):
        o = t // ch
        c = t % ch
        yr = y[o, c]
        bv = bias[c] if has_bias else y.dtype.type(0.0)
        if code == 0:
            for j in range(inner):
                yr[j] = yr[j] + bv
        elif code == 2:
            for j in range(inner):
                yr[j] = relu(yr[j] + bv)
        elif code == 3:
            for j in range(inner):
                yr[j] = gelu(yr[j] + bv)
        elif code == 4:
            for j in range(inner):
                yr[j] = gelu_tanh(yr[j] + bv)
        elif code == 5:
            for j in range(inner):
                yr[j] = silu(yr[j] + bv)
        elif code == 6:
            for j in range(inner):
                yr[j] = sigmoid(yr[j] + bv)
        else:
            for j in range(inner):
                yr[j] = tanh_(yr[j] + bv)


@njit(**OPTIONS)
def act_row(y, b, code):
    """In place on the 1-D ``y``: ``y = act(code, y + b)``: the epilogue of a convolution's output
    row (codes of :data:`CODES`: none, relu, gelu, gelu_tanh, silu)."""
    n = y.shape[0]
    if code == 0:
        for j in range(n):
            y[j] = y[j] + b
    elif code == 2:
        for j in range(n):
            y[j] = relu(y[j] + b)
    elif code == 3:
        for j in range(n):
            y[j] = gelu(y[j] + b)
    elif code == 4:
        for j in range(n):
            y[j] = gelu_tanh(y[j] + b)
    else:
        for j in range(n):
            y[j] = silu(y[j] + b)


@njit(**OPTIONS)
def bias_act_row(y, bias, code):
    """In place on the 1-D ``y`` (n,): ``y = act(code, y + bias)`` with ``bias`` (n,) (size 0:
    none, then ``act(code, y + 0)``), one vectorized loop: a GEMM's epilogue on a row in cache."""
    n = y.shape[0]
    if bias.shape[0] == 0:
        if code != 0:
            act_row(y, y.dtype.type(0.0), code)
    elif code == 0:
        for j in range(n):
            y[j] = y[j] + bias[j]
    elif code == 2:
        for j in range(n):
            y[j] = relu(y[j] + bias[j])
    elif code == 3:
        for j in range(n):
            y[j] = gelu(y[j] + bias[j])
    elif code == 4:
        for j in range(n):
            y[j] = gelu_tanh(y[j] + bias[j])
    else:
        for j in range(n):
            y[j] = silu(y[j] + bias[j])


@njit(parallel=True, **OPTIONS)
def bias_act_rows(y, bias, code):
    """In place on the 2-D ``y`` (rows, n): ``y = act(code, y + bias)`` with ``bias`` (n,) per
    column (size 0: none): a GEMM's epilogue, rows in parallel (:func:`bias_act_row`)."""
    for r in prange(y.shape[0]):
        bias_act_row(y[r], bias, code)
