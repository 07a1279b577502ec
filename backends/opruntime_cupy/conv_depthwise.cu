// conv2d when every group has one input channel (groups == C): each output channel reads one
// input channel (channel multiplier p.mult = K / C). One thread per output element, threads
// along q (coalesced stores, neighbouring input reads shared through L1), taps unrolled when
// KH / KW are given (0: the loop bounds come from p.r / p.s at run time).
// Defines: DTYPE, THREADS, IDX (int, or long long past 2**31 elements), KH, KW.
#include "conv_types.cuh"

#ifndef THREADS
#define THREADS 256
#endif
#ifndef IDX
#define IDX int
#endif
#ifndef KH
#define KH 0
#define KW 0
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
conv_depthwise(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias, T* __restrict__ y,
               const ConvParams p, long long total) {
#if KH > 0
    const int R = KH, S = KW;
#else
    const int R = p.r, S = p.s;
#endif
    for (IDX idx = (IDX)blockIdx.x * THREADS + threadIdx.x; idx < total; idx += (IDX)gridDim.x * THREADS) {
        const int oq = (int)(idx % p.q);
        IDX rest = idx / p.q;
        const int op = (int)(rest % (p.pq / p.q));
        rest /= (p.pq / p.q);
        const int oc = (int)(rest % p.k);
        const int img = (int)(rest / p.k);
        const int c = oc / p.mult;
        const int ih0 = op * p.str_h - p.pad_t, iw0 = oq * p.str_w - p.pad_l;
        const T* xc = x + (long long)img * p.sx_n + (long long)c * p.sx_c;
        const T* wc = wt + (long long)oc * R * S;
        ACC acc = 0;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int ih = ih0 + r * p.dil_h;
            const bool row_in = (unsigned)ih < (unsigned)p.h;
#pragma unroll
            for (int s = 0; s < S; s++) {
                const int iw = iw0 + s * p.dil_w;
                // a padded tap is 0 times the weight, not skipped: 0 * inf gives NaN, as the reference
                const ACC v = row_in && (unsigned)iw < (unsigned)p.w
                                  ? to_acc(xc[(long long)ih * p.sx_h + (long long)iw * p.sx_w]) : ACC(0);
                acc += v * to_acc(wc[r * S + s]);
            }
        }
        if (p.has_bias) acc += to_acc(bias[oc]);
        y[idx] = from_acc(activate<ACT>(acc));
    }
}
