// The elementwise family: out = ACTIVATE(OP(a, b)) (binary) or ACTIVATE(OP(a)) (unary), computed
// in the accumulator type ACC (float for float16 / bfloat16). One source for every operator; the
// build's defines pick it:
//   DTYPE  the element type T (dtype.cuh)
//   ARITY  1 (unary: b is not read) or 2
//   OP     binary: 1 add, 2 sub, 3 mul, 4 div; unary: 0 identity, 5 neg
//   ACT    the activation applied last (epilogue.cuh, opruntime_cupy.epilogue.ACT; 0 none)
//   KIND   which kernel the build holds:
//          1 ew_contig:  a (and b) C-contiguous in the output's shape; grid-stride over 128-bit words
//          2 ew_bcast:   f C-contiguous in the output's shape, g repeated: element i reads
//                        g[(i / div) % mod] (a scalar, a row, a column, an NCHW channel bias);
//                        SWAP 1 when g is the first operand (b - a order kept)
//          3 ew_strided: any strides (0 for broadcast dims), dims collapsed on the host to 6
//   VEC    1: 128-bit loads and stores (the launcher checks the addresses), 0: one element at a time
//   BMODE  ew_bcast with VEC: 1 one g value per 128-bit word (div a multiple of the word, or
//          mod 1), 2 a 128-bit word of g per word (div 1, mod a multiple of the word)
// Every kernel writes a new C-contiguous output; indices are 64-bit.
#include "dtype.cuh"
#include "epilogue.cuh"
#ifndef ARITY
#define ARITY 2
#endif
#ifndef OP
#define OP 1
#endif
#ifndef ACT
#define ACT 0
#endif
#ifndef KIND
#define KIND 1
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef SWAP
#define SWAP 0
#endif
#ifndef BMODE
#define BMODE 1
#endif

__device__ __forceinline__ ACC op2(ACC a, ACC b) {
#if OP == 1
    return a + b;
#elif OP == 2
    return a - b;
#elif OP == 3
    return a * b;
#else
    return a / b;  // IEEE: x / 0 is +-inf, 0 / 0 NaN
#endif
}

// one output element from the operands' elements (for ARITY 1, b is ignored)
__device__ __forceinline__ T apply(T a, T b) {
#if ARITY == 2
    const ACC r = op2(to_acc(a), to_acc(b));
#elif OP == 5
    const ACC r = -to_acc(a);
#else
    const ACC r = to_acc(a);
#endif
    return from_acc(activate<ACT>(r));
}

constexpr int W = 16 / sizeof(T);  // elements per 128-bit word

#if KIND == 1
extern "C" __global__ void ew_contig(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                     const i64 n) {
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 done = 0;
#if VEC
    const i64 words = n / W;
    const uint4* __restrict__ av = reinterpret_cast<const uint4*>(a);
    uint4* __restrict__ ov = reinterpret_cast<uint4*>(out);
#if ARITY == 2
    const uint4* __restrict__ bv = reinterpret_cast<const uint4*>(b);
#endif
    for (i64 w = first; w < words; w += stride) {
        uint4 ua = av[w];
        T* ea = reinterpret_cast<T*>(&ua);
#if ARITY == 2
        uint4 ub = bv[w];
        const T* eb = reinterpret_cast<const T*>(&ub);
#pragma unroll
        for (int k = 0; k < W; ++k) ea[k] = apply(ea[k], eb[k]);
#else
#pragma unroll
        for (int k = 0; k < W; ++k) ea[k] = apply(ea[k], ea[k]);
#endif
        ov[w] = ua;
    }
    done = words * W;
#endif
    for (i64 j = done + first; j < n; j += stride) {
#if ARITY == 2
        out[j] = apply(a[j], b[j]);
#else
        out[j] = apply(a[j], a[j]);
#endif
    }
}
#endif

#if KIND == 2
__device__ __forceinline__ T apply_fg(T fv, T gv) {
#if SWAP
    return apply(gv, fv);
#else
    return apply(fv, gv);
#endif
}

// f: the full operand; g: the repeated one. Each thread walks units (words with VEC, else
// elements) with a grid stride of S = gridDim * blockDim units, keeping r = i % div and
// qm = (i / div) % mod up to date by addition: s_r = (S * unit) % div, s_qm = ((S * unit) / div) % mod
// (no division in the loop).
extern "C" __global__ void ew_bcast(const T* __restrict__ f, const T* __restrict__ g, T* __restrict__ out,
                                    const i64 n, const i64 div, const i64 mod, const i64 s_r, const i64 s_qm) {
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 stride = (i64)gridDim.x * blockDim.x;
#if VEC
    constexpr int U = W;
    const uint4* __restrict__ fv = reinterpret_cast<const uint4*>(f);
    uint4* __restrict__ ov = reinterpret_cast<uint4*>(out);
#else
    constexpr int U = 1;
#endif
    const i64 units = n / U;
    const i64 i0 = first * U;
    i64 r = i0 % div;
    i64 qm = (i0 / div) % mod;
    for (i64 u = first; u < units; u += stride) {
#if VEC
        uint4 uf = fv[u];
        T* ef = reinterpret_cast<T*>(&uf);
#if BMODE == 2
        const uint4 ug = *reinterpret_cast<const uint4*>(g + qm);
        const T* eg = reinterpret_cast<const T*>(&ug);
#pragma unroll
        for (int k = 0; k < W; ++k) ef[k] = apply_fg(ef[k], eg[k]);
#else
        const T gv = g[qm];
#pragma unroll
        for (int k = 0; k < W; ++k) ef[k] = apply_fg(ef[k], gv);
#endif
        ov[u] = uf;
#else
        out[u] = apply_fg(f[u], g[qm]);
#endif
        r += s_r;
        const i64 carry = r >= div ? 1 : 0;
        r -= carry * div;
        qm += s_qm + carry;
        if (qm >= mod) qm -= mod;
    }
#if VEC
    for (i64 j = units * U + first; j < n; j += stride) out[j] = apply_fg(f[j], g[(j / div) % mod]);
#endif
}
#endif

#if KIND == 3
// Dims 0-4 make the rows, dim 5 the columns (threadIdx.x, coalesced on the output); each thread
// finds its row's operand offsets once and walks the columns with the last strides.
extern "C" __global__ void ew_strided(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                      const i64 n0, const i64 n1, const i64 n2, const i64 n3, const i64 n4,
                                      const i64 n5, const i64 a0, const i64 a1, const i64 a2, const i64 a3,
                                      const i64 a4, const i64 a5, const i64 b0, const i64 b1, const i64 b2,
                                      const i64 b3, const i64 b4, const i64 b5) {
    const i64 rows = n0 * n1 * n2 * n3 * n4;
    const i64 cfirst = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 cstep = (i64)gridDim.x * blockDim.x;
    for (i64 row = (i64)blockIdx.y * blockDim.y + threadIdx.y; row < rows; row += (i64)gridDim.y * blockDim.y) {
        i64 t = row, oa = 0, ob = 0, k;
        k = t % n4; t /= n4; oa += k * a4; ob += k * b4;
        k = t % n3; t /= n3; oa += k * a3; ob += k * b3;
        k = t % n2; t /= n2; oa += k * a2; ob += k * b2;
        k = t % n1; t /= n1; oa += k * a1; ob += k * b1;
        oa += t * a0; ob += t * b0;
        T* o = out + row * n5;
        for (i64 c = cfirst; c < n5; c += cstep) {
#if ARITY == 2
            o[c] = apply(a[oa + c * a5], b[ob + c * b5]);
#else
            const T v = a[oa + c * a5];
            o[c] = apply(v, v);
#endif
        }
    }
}
#endif
