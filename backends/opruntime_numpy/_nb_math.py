"""Scalar building blocks of the numba kernels (imported only through :mod:`.jit`, which sets up
numba's disk cache first): functions the loops call per element, written so that LLVM
vectorizes the loops around them.

numba calls libm for ``math.exp`` and ``math.erfc``, one element at a time: numba uses SVML only
with an llvmlite built with Intel's SVML patch, and PyPI's llvmlite is not (``llvmlite.binding.
has_svml`` is False; installing ``intel-cmplr-lib-rt``, which ships ``libsvml.so``, changes
nothing). It vectorizes no floating-point reduction unless the whole function is compiled with
fast-math, whose ``nnan`` / ``ninf`` flags would break the NaN and infinity semantics the
conformance suite checks. So instead:

* :func:`exp64` is Cephes' ``exp`` (a Cody-Waite reduction and a Padé form) with the power of
  two built from its bits: branch-free, vectorizable, within 1 ulp, exact at 0, with IEEE
  results at the edges (``exp(-inf) == 0``, overflow to ``inf``, subnormal results, NaN kept).
  :func:`exp32_fast` is float32's, for the activations and softmax (rounding by a magic sum, a
  degree-5 fit, one power of two; within 3 ulp, results below float32's normal range flush to 0).
* :func:`tanh32` is a rational fit (one division, no exp). :func:`gelu32` is accurate relative to
  each result in the tail too (an ``erf``'s absolute accuracy, torch's, is not).
* :func:`radd` is an addition that alone carries LLVM's ``reassoc`` flag: a sum accumulated with
  it is vectorized (partial sums per lane), nothing else in the function may be reordered.
* :func:`maxnum` is ``llvm.maxnum`` (the larger of two, ignoring a NaN operand), which LLVM
  vectorizes as a reduction. The kernels that reduce with it get NaN from the sums that follow.
  :func:`maximum` (``llvm.maximum``) propagates NaN and also vectorizes as a reduction (an
  integer NaN count or a NaN-probing sum beside ``maxnum`` in the same loop does not: 12x slower).
* :func:`fma` is ``llvm.fmuladd`` (fused where the CPU has FMA) for the polynomials.
* :func:`stream_add` and its kin compute one vector of :data:`VECTOR_BYTES` and store it
  *non-temporally* (``!nontemporal``: ``vmovntps``), past the caches. A result larger than the
  caches is then written once; a plain store first reads each line of the result it writes
  (the read for ownership), a third of a binary operator's traffic. LLVM's loop vectorizer keeps
  no non-temporal store it cannot prove aligned, hence intrinsics on whole vectors; the caller
  (:func:`._nb_elementwise._streamed`) does the unaligned head and the tail in scalars.
* :func:`prefetch_read` / :func:`prefetch_write` ask for one line ahead of its use
  (``prefetcht0`` / ``prefetchw``): the row kernels fetch the next row (and its output row, for
  ownership) while they compute on the current one in L1, so memory and arithmetic overlap.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

F32 = np.float32


def _vector_bytes() -> int:
    """64 where numba compiles for AVX-512 (32 vector registers), else 32 (AVX2: 16 registers):
    the target's features as numba sets them (``NUMBA_CPU_FEATURES``, :func:`.jit._wide_vectors`),
    else the host's."""
    try:
        import numba

        features = numba.config.CPU_FEATURES
        if features:
            return 64 if "+avx512f" in features.split(",") else 32
        import llvmlite.binding as ll

        return 64 if ll.get_host_cpu_features().get("avx512f") else 32
    except Exception:  # another layout: the narrower vectors, correct everywhere
        return 32


#: bytes of one vector register the kernels' explicit vector code uses (:func:`_vector_bytes`)
VECTOR_BYTES = _vector_bytes()


# -- explicit vector IR: helpers of the intrinsics here and in :mod:`._nb_conv` --------------------

def vector_type(context, dtype):
    """(element type, lanes, vector type) of a vector of :data:`VECTOR_BYTES` of ``dtype``."""
    ft = context.get_data_type(dtype)
    lanes = VECTOR_BYTES // context.get_abi_sizeof(ft)
    return ft, lanes, ir.VectorType(ft, lanes)


def element_ptr(context, builder, aryty, ary, off):
    """A pointer to element ``off`` (counted flat) of a C-contiguous (or unit-stride 1-D) array."""
    return cgutils.gep(builder, context.make_array(aryty)(context, builder, ary).data, off)


def splat(builder, value, vt):
    """``value`` (a scalar of ``vt``'s element type) in every lane of a ``vt``."""
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vt.count), [0] * vt.count))


def relu_where(builder, v, on, vt):
    """``v < 0 ? 0 : v`` in every lane where the integer ``on`` is not 0, else ``v`` (NaN kept:
    the comparison is ordered)."""
    flag = builder.icmp_unsigned("!=", on, ir.Constant(on.type, 0))
    bits = ir.VectorType(ir.IntType(1), vt.count)
    flags = builder.select(flag, ir.Constant(bits, [1] * vt.count), ir.Constant(bits, [0] * vt.count))
    zero = ir.Constant(vt, None)
    return builder.select(builder.and_(builder.fcmp_ordered("<", v, zero), flags), zero, v)


def _streaming(name: str, fn, unary: bool = False):
    """An intrinsic ``name(y, a, b, i, relu)``: ``y[i:i + n] = fn(a[i:i + n], b[i:i + n])``, then
    ReLU where ``relu``, for one vector of n = :data:`VECTOR_BYTES` / itemsize elements of 1-D
    unit-stride arrays, stored non-temporally; ``y``'s element ``i`` must be
    :data:`VECTOR_BYTES`-aligned (``b`` is not read when ``unary``). ``fn(builder, va, vb)``
    builds the vector result."""

    def impl(typingctx, y, a, b, i, relu):
        sig = types.void(y, a, b, types.intp, relu)

        def codegen(context, builder, signature, args):
            ft, _, vt = vector_type(context, signature.args[0].dtype)
            size = context.get_abi_sizeof(ft)

            def at(k: int):  # a vector pointer to element i of argument k
                return builder.bitcast(element_ptr(context, builder, signature.args[k], args[k], args[3]),
                                       ir.PointerType(vt))

            va = builder.load(at(1), align=size)
            vb = None if unary else builder.load(at(2), align=size)
            v = relu_where(builder, fn(builder, va, vb), args[4], vt)
            store = builder.store(v, at(0), align=VECTOR_BYTES)
            store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = name
    return intrinsic(impl)


stream_add = _streaming("stream_add", lambda b, x, y: b.fadd(x, y))
stream_sub = _streaming("stream_sub", lambda b, x, y: b.fsub(x, y))
stream_mul = _streaming("stream_mul", lambda b, x, y: b.fmul(x, y))
stream_div = _streaming("stream_div", lambda b, x, y: b.fdiv(x, y))
stream_neg = _streaming("stream_neg", lambda b, x, y: b.fneg(x), unary=True)
stream_copy = _streaming("stream_copy", lambda b, x, y: x, unary=True)


def _prefetching(name: str, write: int):
    """An intrinsic ``name(a, i)``: ``llvm.prefetch`` of the cache line holding element ``i`` of the
    1-D array ``a`` (any stride) into L1 (``prefetcht0``; ``write``: ``prefetchw``, the line fetched
    for ownership, so that the store that follows does not wait for its read). A hint: it never
    faults, whatever the address."""

    def impl(typingctx, a, i):
        if not isinstance(a, types.Array) or a.ndim != 1:
            return None
        sig = types.void(a, types.intp)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])
            i8p = ir.PointerType(ir.IntType(8))
            i32 = ir.IntType(32)
            fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p],
                                                  ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, write), ir.Constant(i32, 3),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = name
    return intrinsic(impl)


prefetch_read = _prefetching("prefetch_read", 0)
prefetch_write = _prefetching("prefetch_write", 1)


def _binary_intrinsic(name: str):
    @intrinsic
    def call(typingctx, a, b):
        if not isinstance(a, types.Float) or a != b:
            return None

        def codegen(context, builder, signature, args):
            t = args[0].type
            fn = builder.module.declare_intrinsic(name, [t], ir.FunctionType(t, [t, t]))
            return builder.call(fn, args)

        return a(a, a), codegen

    return call


maxnum = _binary_intrinsic("llvm.maxnum")
minnum = _binary_intrinsic("llvm.minnum")
#: IEEE 754-2019 ``maximum``: NaN if either is NaN, ``-0.0 < 0.0``; LLVM vectorizes it as a reduction
maximum = _binary_intrinsic("llvm.maximum")


@intrinsic
def radd(typingctx, a, b):
    """``a + b`` that LLVM may reassociate (for vectorized sums only)."""
    if not isinstance(a, types.Float) or a != b:
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1], flags=("reassoc",))

    return a(a, a), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c``, fused where the CPU has FMA (``llvm.fmuladd``)."""
    if not isinstance(a, types.Float) or not a == b == c:
        return None

    def codegen(context, builder, signature, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fmuladd", [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(fn, args)

    return a(a, a, a), codegen


@intrinsic
def _pow2_f64(typingctx, n):
    """``2.0 ** n`` as a float64 for an integer ``n`` in [-1022, 1023]."""
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        k = builder.sext(args[0], i64) if n.bitwidth < 64 else args[0]
        bits = builder.shl(builder.add(k, ir.Constant(i64, 1023)), ir.Constant(i64, 52))
        return builder.bitcast(bits, ir.DoubleType())

    return types.float64(n), codegen


@njit(error_model="numpy")
def exp64(x):
    """Cephes ``exp``: float64 ``e ** x`` within 1 ulp (a Padé form in ``r * r``)."""
    xc = minnum(maxnum(x, -746.0), 710.0)
    n = np.floor(fma(xc, 1.4426950408889634073599, 0.5))
    r = fma(n, -6.93145751953125e-1, xc)
    r = fma(n, -1.42860682030941723212e-6, r)
    rr = r * r
    px = r * fma(fma(1.26177193074810590878e-4, rr, 3.02994407707441961300e-2), rr, 9.99999999999999999910e-1)
    qx = fma(fma(fma(3.00198505138664455042e-6, rr, 2.52448340349684104192e-3), rr, 2.27265548208155028766e-1),
             rr, 2.0)
    p = 1.0 + 2.0 * (px / (qx - px))
    k = np.int64(n)
    h = k >> np.int64(1)
    y = p * _pow2_f64(h) * _pow2_f64(k - h)
    return x if x != x else y


@intrinsic
def _scale_f32(typingctx, p, k):
    """``p * 2.0 ** n`` from ``k = n + 1.5 * 2 ** 23`` (a float32 whose low mantissa bits hold the
    integer ``n``) by adding ``n << 23`` to ``p``'s bits (the high bits of ``k`` shift out): one
    integer addition, exact where ``p`` and the result are normal. ``p = 1`` builds ``2.0 ** n``
    itself: ``n = -127`` gives 0.0 and ``n = 128`` inf."""
    if p != types.float32 or k != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        n = builder.shl(builder.bitcast(args[1], i32), ir.Constant(i32, 23))
        return builder.bitcast(builder.add(bits, n), ir.FloatType())

    return types.float32(p, k), codegen


@njit(error_model="numpy")
def exp32_fast(x):
    """float32 ``e ** x`` in about half the instructions of Cephes' ``expf``, for the activations:
    the argument clamped to [-88, 89] by compares (a NaN passes through), rounded to ``n * ln 2 +
    r`` by adding ``1.5 * 2 ** 23`` (no floor or conversion), a degree-5 fit of ``e ** r`` (relative
    error 1.2e-7) and one power of two built from the sum's bits. Within 3 ulp for results in
    float32's normal range; results below it are 0 (``exp(-inf) == 0``), above it inf (``exp(88.5)``
    is inf rather than 2.7e38: in ``1 / (1 + e)`` forms that is a difference below 4e-39)."""
    xc = F32(-88.0) if x < F32(-88.0) else x
    xc = F32(89.0) if xc > F32(89.0) else xc
    k = fma(xc, F32(1.44269504088896341), F32(12582912.0))
    n = k - F32(12582912.0)
    r = fma(n, F32(-0.693359375), xc)
    r = fma(n, F32(2.12194440e-4), r)
    p = fma(F32(0.008333842270076275), r, F32(0.04189859703183174))
    p = fma(p, r, F32(0.1666688621044159))
    p = fma(p, r, F32(0.49999141693115234))
    p = fma(p, r * r, r) + F32(1.0)
    return p * _scale_f32(F32(1.0), k)


@njit(error_model="numpy")
def tanh32(x):
    """float32 ``tanh``: Eigen's rational fit (an odd degree-13 over an even degree-6 polynomial)
    on ``x`` clamped to +-7.9988, where tanh rounds to +-1; relative error below 2.7e-7 (4 ulp) for
    every x, odd, ``tanh(-0.0) == -0.0``, NaN kept (the clamps are compares a NaN passes). No exp:
    one division, about 2x the throughput of ``1 - 2 / (exp(2x) + 1)`` with its small-x branch."""
    c = F32(7.99881172180175781)
    x = c if x > c else x
    x = -c if x < -c else x
    x2 = x * x
    p = fma(x2, F32(-2.76076847742355e-16), F32(2.00018790482477e-13))
    p = fma(x2, p, F32(-8.60467152213735e-11))
    p = fma(x2, p, F32(5.12229709037114e-08))
    p = fma(x2, p, F32(1.48572235717979e-05))
    p = fma(x2, p, F32(6.37261928875436e-04))
    p = fma(x2, p, F32(4.89352455891786e-03))
    q = fma(x2, F32(1.19825839466702e-06), F32(1.18534705686654e-04))
    q = fma(x2, q, F32(2.26843463243900e-03))
    q = fma(x2, q, F32(4.89352518554385e-03))
    return (x * p) / q


#: gelu32's fit: ``Phi(-x) = t exp(-(x^2 + Q(t)) / 2)``, ``t = 1 / (4 + 1.32 x)``; Q's coefficients,
#: highest power first (a degree-7 least-squares fit of ``-2 ln(Phi(-x) / t) - x^2`` over x in
#: [0, 13.15], t scaled by 4 so that the exponent's power of two stays normal; 2.4e-7 relative)
_GELU_Q = (6398.98291015625, -7159.29345703125, 2839.75830078125, -406.41552734375,
           26.363113403320312, -14.808964729309082, -7.930944442749023, 1.2817487716674805)


@njit(error_model="numpy")
def gelu32(v):
    """float32 ``gelu(v) = v P(N(0, 1) < v)``, accurate relative to each result, the tail included:
    every result in float32's normal range is within 1e-6 of gelu at ``v`` or at one of its float32
    neighbours (measured over 28M points in [-14, 14]: 8.6e-7 of the exact value for |v| < 4, 4.5e-6
    at most near v = -13, where gelu's own condition number is about v^2 = 170). Below -13.15, where
    the exact result is a float32 subnormal or 0, it is gelu(-13.15) = -1.1e-38 (the smallest normal
    magnitude). NaN, +-inf and -0.0 as the float64 reference (gelu(-inf) = -inf * 0 is NaN).

    The normal tail ``Phi(-x) = t exp(-(x^2 + Q(t)) / 2)`` of x = |v| (v held to +-13.15), an erfc
    fit with the polynomial in the exponent (Numerical Recipes' ``erfcc`` form). The exp is reduced
    as :func:`exp32_fast`'s, with its power of two added to the exponent bits of the reduced result
    (normal: t's factor 1/4 keeps n >= -125), so the whole costs 19 multiply-adds and one division:
    21-24 cycles a 16-lane vector on Zen 4, against 15 for ``0.5 + 0.5 erf(v / sqrt 2)`` by a
    rational erf (torch's way), whose absolute error of 1e-7 is the whole result for v < -5.3 (a
    linear's output whose every value lay there came out 0)."""
    vc = F32(13.15) if v > F32(13.15) else v  # NaN passes
    vc = F32(-13.15) if vc < F32(-13.15) else vc
    x = abs(vc)
    t = F32(1.0) / fma(x, F32(1.32), F32(4.0))
    q = fma(t, F32(_GELU_Q[0]), F32(_GELU_Q[1]))
    q = fma(t, q, F32(_GELU_Q[2]))
    q = fma(t, q, F32(_GELU_Q[3]))
    q = fma(t, q, F32(_GELU_Q[4]))
    q = fma(t, q, F32(_GELU_Q[5]))
    q = fma(t, q, F32(_GELU_Q[6]))
    q = fma(t, q, F32(_GELU_Q[7]))
    b = fma(x, x, q)  # the tail is t exp(-b / 2)
    k = fma(b, F32(-0.72134752044448170368), F32(12582912.0))  # n = round(-b / (2 ln 2)) in k's low bits
    n = k - F32(12582912.0)
    r = fma(n, F32(1.38629436111989061883), b)  # exp(-b / 2) = 2^n exp(-r / 2), |r| <= ln 2
    p = fma(F32(-0.008333842270076275 / 32), r, F32(0.04189859703183174 / 16))  # exp32_fast's fit in -r / 2
    p = fma(p, r, F32(-0.1666688621044159 / 8))
    p = fma(p, r, F32(0.49999141693115234 / 4))
    p = fma(p, r, F32(-0.5))
    p = fma(p, r, F32(1.0))
    c = (vc * t) * _scale_f32(p, k)  # v * tail
    return c - (v - v) if v <= F32(0.0) else v - c  # v - v: NaN for -inf (-inf * 0), -0.0 kept


# the float64 forms: libm where a vectorizable form of full float64 accuracy would be long
@njit(error_model="numpy")
def erfc64(z):
    return math.erfc(z)


@njit(error_model="numpy")
def tanh64(x):
    return math.tanh(x)
