// conv2d 3x3, stride 1, dilation 1, one group, by Winograd F(MxM, 3x3) (WINO_M 2 or 4): each MxM
// output tile comes from an ALPHA x ALPHA input tile (ALPHA = M + 2) with ALPHA^2 multiplies per
// (input channel, output channel) instead of 9 M^2: 2.25x fewer for M = 2, 4x for M = 4. Three
// transforms here; the ALPHA^2 products in between are one grouped GEMM (conv_simt.cu with
// groups = ALPHA^2):
//   wino_filter: U[xi][k][c] = (G g G^T)[xi]        g = w[k, c] (3x3), computed in double
//   wino_input:  V[xi][c][t] = (B^T d B)[xi]        d = the input patch of tile t, zero-padded
//   GEMM:        M[xi][k][t] = sum_c U[xi][k][c] V[xi][c][t]
//   wino_output: y[n, k, M ty + i, M tx + j] = act((A^T M A)[i][j] + bias[k])   (ACT, conv_types.cuh)
// Tiles t = (n * th + ty) * tw + tx with th = ceil(P/M), tw = ceil(Q/M); U, V, M hold ACC.
// The matrices are Lavin & Gray's (points 0, -1, 1 for M = 2; 0, +-1, +-2 and infinity for M = 4).
// Defines: DTYPE (0 float32, 3 float64), WINO_M, THREADS.
#include "conv_types.cuh"

#ifndef THREADS
#define THREADS 256
#endif
#ifndef WINO_M
#define WINO_M 2
#endif
#define ALPHA (WINO_M + 2)

#if WINO_M == 2
#define MATRICES                                                                                    \
    constexpr ACC BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};             \
    constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};              \
    constexpr ACC AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
#else
#define MATRICES                                                                                    \
    constexpr ACC BT[6][6] = {{4, 0, -5, 0, 1, 0}, {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},        \
                              {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};         \
    constexpr double G[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6},            \
                                {-1.0 / 6, 1.0 / 6, -1.0 / 6}, {1.0 / 24, 1.0 / 12, 1.0 / 6},          \
                                {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};                           \
    constexpr ACC AT[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
wino_filter(const T* __restrict__ w, ACC* __restrict__ u, long long kc) {
    MATRICES
    const long long i = (long long)blockIdx.x * THREADS + threadIdx.x;  // i = k * C + c
    if (i >= kc) return;
    double g[3][3], t[ALPHA][3];
#pragma unroll
    for (int r = 0; r < 3; r++)
#pragma unroll
        for (int s = 0; s < 3; s++) g[r][s] = (double)to_acc(w[i * 9 + r * 3 + s]);
#pragma unroll
    for (int a = 0; a < ALPHA; a++)  // G g
#pragma unroll
        for (int s = 0; s < 3; s++) t[a][s] = G[a][0] * g[0][s] + G[a][1] * g[1][s] + G[a][2] * g[2][s];
#pragma unroll
    for (int a = 0; a < ALPHA; a++)  // (G g) G^T
#pragma unroll
        for (int b = 0; b < ALPHA; b++)
            u[(a * ALPHA + b) * kc + i] = (ACC)(t[a][0] * G[b][0] + t[a][1] * G[b][1] + t[a][2] * G[b][2]);
}

// One thread per (c, t); consecutive threads take consecutive tiles (coalesced stores of V).
extern "C" __global__ void __launch_bounds__(THREADS)
wino_input(const T* __restrict__ x, ACC* __restrict__ v, const ConvParams p, long long tiles, int th, int tw,
           int channels) {
    MATRICES
    const long long i = (long long)blockIdx.x * THREADS + threadIdx.x;  // i = c * tiles + t
    if (i >= (long long)channels * tiles) return;
    const int c = (int)(i / tiles);
    const int t = (int)(i - (long long)c * tiles);
    const int img = t / (th * tw), rest = t - img * (th * tw), ty = rest / tw, tx = rest - ty * tw;
    const int h0 = WINO_M * ty - p.pad_t, w0 = WINO_M * tx - p.pad_l;
    const T* xc = x + (long long)img * p.sx_n + (long long)c * p.sx_c;
    ACC d[ALPHA][ALPHA], e[ALPHA][ALPHA];
#pragma unroll
    for (int a = 0; a < ALPHA; a++)
#pragma unroll
        for (int b = 0; b < ALPHA; b++) {
            const int ih = h0 + a, iw = w0 + b;
            d[a][b] = ((unsigned)ih < (unsigned)p.h && (unsigned)iw < (unsigned)p.w)
                          ? to_acc(xc[(long long)ih * p.sx_h + (long long)iw * p.sx_w]) : (ACC)0;
        }
#pragma unroll
    for (int a = 0; a < ALPHA; a++)  // B^T d
#pragma unroll
        for (int b = 0; b < ALPHA; b++) {
            ACC s = 0;
#pragma unroll
            for (int j = 0; j < ALPHA; j++) s += BT[a][j] * d[j][b];
            e[a][b] = s;
        }
    const long long plane = (long long)channels * tiles;
#pragma unroll
    for (int a = 0; a < ALPHA; a++)  // (B^T d) B
#pragma unroll
        for (int b = 0; b < ALPHA; b++) {
            ACC s = 0;
#pragma unroll
            for (int j = 0; j < ALPHA; j++) s += e[a][j] * BT[b][j];
            v[(a * ALPHA + b) * plane + i] = s;
        }
}

// One thread per (k, t).
extern "C" __global__ void __launch_bounds__(THREADS)
wino_output(const ACC* __restrict__ m, const T* __restrict__ bias, T* __restrict__ y, const ConvParams p,
            long long tiles, int th, int tw) {
    MATRICES
    const long long i = (long long)blockIdx.x * THREADS + threadIdx.x;  // i = k * tiles + t
    if (i >= (long long)p.k * tiles) return;
    const int k = (int)(i / tiles);
    const int t = (int)(i - (long long)k * tiles);
    const int img = t / (th * tw), rest = t - img * (th * tw), ty = rest / tw, tx = rest - ty * tw;
    const long long plane = (long long)p.k * tiles;
    ACC mm[ALPHA][ALPHA], s[WINO_M][ALPHA];
#pragma unroll
    for (int a = 0; a < ALPHA; a++)
#pragma unroll
        for (int b = 0; b < ALPHA; b++) mm[a][b] = m[(a * ALPHA + b) * plane + i];
#pragma unroll
    for (int a = 0; a < WINO_M; a++)  // A^T M
#pragma unroll
        for (int b = 0; b < ALPHA; b++) {
            ACC r = 0;
#pragma unroll
            for (int j = 0; j < ALPHA; j++) r += AT[a][j] * mm[j][b];
            s[a][b] = r;
        }
    const ACC add = p.has_bias ? to_acc(bias[k]) : (ACC)0;
    const int q = p.q, prow = p.pq / p.q;
    T* yk = y + ((long long)img * p.k + k) * p.pq;
#pragma unroll
    for (int a = 0; a < WINO_M; a++) {  // (A^T M) A
        const int oy = WINO_M * ty + a;
        if (oy >= prow) continue;
#pragma unroll
        for (int b = 0; b < WINO_M; b++) {
            const int ox = WINO_M * tx + b;
            ACC r = add;
#pragma unroll
            for (int j = 0; j < ALPHA; j++) r += s[a][j] * AT[b][j];
            if (ox < q) yk[oy * q + ox] = from_acc(activate<ACT>(r));
        }
    }
}
