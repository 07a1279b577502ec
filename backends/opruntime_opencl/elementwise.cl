// The elementwise family: out = ACTIVATE(OP(a, b)) (binary) or ACTIVATE(OP(a)) (unary), computed
// in ACC (float for half), built after epilogue.cl (compile.source("elementwise.cl", "epilogue.cl")).
// Build options:
//   T, ACC  the element and accumulator types;  VW  elements per work-item (1, 2, 4, 8, 16)
//   ARITY   1 (unary: b is not read) or 2;  OP  binary 1 add, 2 sub, 3 mul, 4 div; unary 0 none, 5 neg
//   ACT     the activation (epilogue.cl; 0 none);  SWAP  ew_bcast: g is the first operand
// Kernels (each operand a buffer and an element offset; the output new and C-contiguous):
//   ew_contig   every operand C-contiguous in the output's shape: vloadn / vstoren (element
//               alignment is enough), a scalar tail
//   ew_bcast    f C-contiguous in the output's shape, element i of g at (i / div) % mod
//   ew_strided  any element strides (0 where an operand repeats) over 6 dims

#define VEC_(t, n) t##n
#define VEC(t, n) VEC_(t, n)
#define CONV_(t, n) convert_##t##n
#define CONV(t, n) CONV_(t, n)
#define LOADN_(n) vload##n
#define LOADN(n) LOADN_(n)
#define STOREN_(n) vstore##n
#define STOREN(n) STOREN_(n)

#if ARITY == 2
#if OP == 1
#define OPF(x, y) ((x) + (y))
#elif OP == 2
#define OPF(x, y) ((x) - (y))
#elif OP == 3
#define OPF(x, y) ((x) * (y))
#else
#define OPF(x, y) ((x) / (y))
#endif
#elif OP == 5
#define OPF(x, y) (-(x))
#else
#define OPF(x, y) (x)
#endif

#if SWAP
#define FG(f, g) OPF(g, f)
#else
#define FG(f, g) OPF(f, g)
#endif

// one element: the arithmetic and the activation in ACC, one rounding to T
inline T apply1(const ACC x, const ACC y) {
    const ACC r = OPF(x, y);
    return (T)(ACTIVATE(r));
}

__kernel void ew_contig(__global const T* a, const long a_off, __global const T* b, const long b_off,
                        __global T* out, const long n) {
    const long i = (long)get_global_id(0) * VW;
    __global const T* as = a + a_off;
    __global const T* bs = b + b_off;
#if VW > 1
    if (i + VW <= n) {
        const VEC(ACC, VW) x = CONV(ACC, VW)(LOADN(VW)(0, as + i));
#if ARITY == 2
        const VEC(ACC, VW) y = CONV(ACC, VW)(LOADN(VW)(0, bs + i));
#else
        const VEC(ACC, VW) y = x;
#endif
        const VEC(ACC, VW) r = OPF(x, y);
        STOREN(VW)(CONV(T, VW)(ACTIVATE(r)), 0, out + i);
        return;
    }
#endif
    for (long j = i; j < n && j < i + VW; ++j) {
#if ARITY == 2
        out[j] = apply1((ACC)as[j], (ACC)bs[j]);
#else
        out[j] = apply1((ACC)as[j], (ACC)as[j]);
#endif
    }
}

__kernel void ew_bcast(__global const T* f, const long f_off, __global const T* g, const long g_off,
                       __global T* out, const long n, const long div, const long mod) {
    const long i = (long)get_global_id(0) * VW;
    if (i >= n) return;
    __global const T* fs = f + f_off;
    __global const T* gs = g + g_off;
    long r = i % div, q = (i / div) % mod;  // element i reads gs[q]; r counts to the next q
#if VW > 1
    if (i + VW <= n) {
        T gv[VW];
        for (int k = 0; k < VW; ++k) {
            gv[k] = gs[q];
            if (++r == div) {
                r = 0;
                if (++q == mod) q = 0;
            }
        }
        const VEC(ACC, VW) x = CONV(ACC, VW)(LOADN(VW)(0, fs + i));
        const VEC(ACC, VW) y = CONV(ACC, VW)(LOADN(VW)(0, gv));
        const VEC(ACC, VW) res = FG(x, y);
        STOREN(VW)(CONV(T, VW)(ACTIVATE(res)), 0, out + i);
        return;
    }
#endif
    for (long j = i; j < n && j < i + VW; ++j) {
        const ACC x = (ACC)fs[j], y = (ACC)gs[q];
        const ACC res = FG(x, y);
        out[j] = (T)(ACTIVATE(res));
        if (++r == div) {
            r = 0;
            if (++q == mod) q = 0;
        }
    }
}

__kernel void ew_strided(__global const T* a, const long a_off, __global const T* b, const long b_off,
                         __global T* out, const long n, const long n0, const long n1, const long n2, const long n3,
                         const long n4, const long n5, const long a0, const long a1, const long a2, const long a3,
                         const long a4, const long a5, const long b0, const long b1, const long b2, const long b3,
                         const long b4, const long b5) {
    const long i = get_global_id(0);
    if (i >= n) return;
    long t = i, oa = a_off, ob = b_off, k;
    k = t % n5; t /= n5; oa += k * a5; ob += k * b5;
    k = t % n4; t /= n4; oa += k * a4; ob += k * b4;
    k = t % n3; t /= n3; oa += k * a3; ob += k * b3;
    k = t % n2; t /= n2; oa += k * a2; ob += k * b2;
    k = t % n1; t /= n1; oa += k * a1; ob += k * b1;
    oa += t * a0; ob += t * b0;
#if ARITY == 2
    out[i] = apply1((ACC)a[oa], (ACC)b[ob]);
#else
    out[i] = apply1((ACC)a[oa], (ACC)a[oa]);
#endif
}
