// The column buffer of the vendor path (im2col + cuBLAS): cols[n][g][rows][pq] (pq fastest, so
// one GEMM per (n, g) writes y[n, g*kg:(g+1)*kg] in place). One thread per element; the offset
// table (conv_types.cuh) turns crs into an input offset and row / column shifts. With a bias,
// rows = crs + 1 and the last row is ones: the GEMM adds bias x 1 in its fp32 accumulator, so a
// 16-bit result is rounded once (adding the bias to the rounded product rounds twice).
// Defines: DTYPE, THREADS, IDX (int, or long long past 2**31 elements).
#include "conv_types.cuh"

#ifndef THREADS
#define THREADS 256
#endif
#ifndef IDX
#define IDX int
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
conv_im2col(const T* __restrict__ x, T* __restrict__ cols, const int4* __restrict__ tab, const ConvParams p,
            long long total, long long groups, long long rows) {
    for (IDX idx = (IDX)blockIdx.x * THREADS + threadIdx.x; idx < total; idx += (IDX)gridDim.x * THREADS) {
        const int pq = (int)(idx % p.pq);
        IDX rest = idx / p.pq;
        const int crs = (int)(rest % rows);
        rest /= rows;
        const int g = (int)(rest % groups);
        const int img = (int)(rest / groups);
        if (crs == p.crs) {  // the bias row
            cols[idx] = from_acc((ACC)1);
            continue;
        }
        const int op = pq / p.q, oq = pq - op * p.q;
        const int4 t = tab[crs];  // t.x already holds c, r and s as an offset: add the tile corner only
        const int ih0 = op * p.str_h - p.pad_t, iw0 = oq * p.str_w - p.pad_l;
        const int ih = ih0 + t.y, iw = iw0 + t.z;
        T v = (T)0;
        if ((unsigned)ih < (unsigned)p.h && (unsigned)iw < (unsigned)p.w)
            v = x[(long long)img * p.sx_n + (long long)g * p.cg * p.sx_c + (long long)ih0 * p.sx_h +
                  (long long)iw0 * p.sx_w + t.x];
        cols[idx] = v;
    }
}
