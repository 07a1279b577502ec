// What the conv2d kernels share: the element type T of DTYPE, its accumulator type ACC, and the
// problem description passed by value (one kernel argument, filled by conv.py).
//   DTYPE 0 float32, 1 float16, 2 bfloat16 (both accumulated in float32), 3 float64
#pragma once
#include "dtype.cuh"
#include "epilogue.cuh"

// ACT: the activation (epilogue.cuh's codes) every conv kernel applies after the bias, on the
// accumulator, before the one rounding to T; 0 none.
#ifndef ACT
#define ACT 0
#endif

// One convolution as the implicit GEMM sees it, per group g:
//   y[n, g*kg + m, p, q] = sum_{crs} w[g*kg + m, crs] * x[n, g*cg + c, p*str_h - pad_t + r*dil_h, q*str_w - pad_l + s*dil_w]
// GEMM M = kg output channels, N = npq output pixels, K = crs = cg*R*S. All offsets in elements;
// the input may be strided (sx_*), the weight and the output are C-contiguous.
struct ConvParams {
    int npq, pq, q;            // output pixels: N*P*Q, P*Q, Q
    int h, w;                  // input height, width
    int sx_n, sx_c, sx_h, sx_w;  // input strides
    int str_h, str_w, pad_t, pad_l, dil_h, dil_w;
    int k, kg, cg, crs;        // output channels, per group; input channels per group; cg*R*S
    int r, s;                  // kernel height, width
    int has_bias;
    int mult;                  // depthwise: output channels per input channel
};

// The reduction index crs = (c*R + r)*S + s as (input offset, row shift, column shift):
// tab[crs] = {c*sx_c + r*dil_h*sx_h + s*dil_w*sx_w, r*dil_h, s*dil_w, 0}; rows past crs hold
// a huge row shift so that every tap of theirs is out of bounds (reads nothing, adds zero).
#define TAB_INVALID (1 << 29)
#define PIX_INVALID (-(1 << 30))
