// conv2d 3x3, stride 1, dilation 1, one group, by Winograd F(2x2, 3x3): each 2x2 output tile
// comes from a 4x4 input tile with 16 multiplies per (input channel, output channel) instead of
// 36. Three transforms here; the 16 products in between are one grouped GEMM (conv_simt.cu
// with groups = 16):
//   wino_filter: U[xi][k][c] = (G g G^T)[xi]        g = w[k, c] (3x3)
//   wino_input:  V[xi][c][t] = (B^T d B)[xi]        d = the 4x4 input patch of tile t, zero-padded
//   GEMM:        M[xi][k][t] = sum_c U[xi][k][c] V[xi][c][t]
//   wino_output: y[n, k, 2ty+i, 2tx+j] = (A^T M A)[i][j] + bias[k]
// Tiles t = (n * th + ty) * tw + tx with th = ceil(P/2), tw = ceil(Q/2). U, V, M hold ACC.
// Defines: DTYPE (0 float32, 3 float64), THREADS.
#include "conv_types.cuh"

#ifndef THREADS
#define THREADS 256
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
wino_filter(const T* __restrict__ w, ACC* __restrict__ u, long long kc) {
    const long long i = (long long)blockIdx.x * THREADS + threadIdx.x;  // i = k * C + c
    if (i >= kc) return;
    const T* g = w + i * 9;
    ACC t[4][3];
#pragma unroll
    for (int j = 0; j < 3; j++) {  // G g: rows
        const ACC g0 = to_acc(g[j]), g1 = to_acc(g[3 + j]), g2 = to_acc(g[6 + j]);
        t[0][j] = g0;
        t[1][j] = (ACC)0.5 * (g0 + g1 + g2);
        t[2][j] = (ACC)0.5 * (g0 - g1 + g2);
        t[3][j] = g2;
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {  // (G g) G^T: columns
        const ACC a = t[r][0], b = t[r][1], c = t[r][2];
        u[(4 * r + 0) * kc + i] = a;
        u[(4 * r + 1) * kc + i] = (ACC)0.5 * (a + b + c);
        u[(4 * r + 2) * kc + i] = (ACC)0.5 * (a - b + c);
        u[(4 * r + 3) * kc + i] = c;
    }
}

// One thread per (c, t); consecutive threads take consecutive tiles (coalesced stores of V).
extern "C" __global__ void __launch_bounds__(THREADS)
wino_input(const T* __restrict__ x, ACC* __restrict__ v, const ConvParams p, long long tiles, int th, int tw,
           int channels) {
    const long long i = (long long)blockIdx.x * THREADS + threadIdx.x;  // i = c * tiles + t
    if (i >= (long long)channels * tiles) return;
    const int c = (int)(i / tiles);
    const int t = (int)(i - (long long)c * tiles);
    const int img = t / (th * tw), rest = t - img * (th * tw), ty = rest / tw, tx = rest - ty * tw;
    const int h0 = 2 * ty - p.pad_t, w0 = 2 * tx - p.pad_l;
    const T* xc = x + (long long)img * p.sx_n + (long long)c * p.sx_c;
    ACC d[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int ih = h0 + a, iw = w0 + b;
            d[a][b] = ((unsigned)ih < (unsigned)p.h && (unsigned)iw < (unsigned)p.w)
                          ? to_acc(xc[(long long)ih * p.sx_h + (long long)iw * p.sx_w]) : (ACC)0;
        }
    ACC e[4][4];
#pragma unroll
    for (int b = 0; b < 4; b++) {  // B^T d: rows
        e[0][b] = d[0][b] - d[2][b];
        e[1][b] = d[1][b] + d[2][b];
        e[2][b] = d[2][b] - d[1][b];
        e[3][b] = d[1][b] - d[3][b];
    }
    const long long plane = (long long)channels * tiles;
#pragma unroll
    for (int a = 0; a < 4; a++) {  // (B^T d) B: columns
        v[(4 * a + 0) * plane + i] = e[a][0] - e[a][2];
        v[(4 * a + 1) * plane + i] = e[a][1] + e[a][2];
        v[(4 * a + 2) * plane + i] = e[a][2] - e[a][1];
        v[(4 * a + 3) * plane + i] = e[a][1] - e[a][3];
    }
}

// One thread per (k, t).
extern "C" __global__ void __launch_bounds__(THREADS)
wino_output(const ACC* __restrict__ m, const T* __restrict__ bias, T* __restrict__ y, const ConvParams p,
            long long tiles, int th, int tw) {
    const long long i = (long long)blockIdx.x * THREADS + threadIdx.x;  // i = k * tiles + t
    if (i >= (long long)p.k * tiles) return;
    const int k = (int)(i / tiles);
    const int t = (int)(i - (long long)k * tiles);
    const int img = t / (th * tw), rest = t - img * (th * tw), ty = rest / tw, tx = rest - ty * tw;
    const long long plane = (long long)p.k * tiles;
    ACC s[2][4];
#pragma unroll
    for (int b = 0; b < 4; b++) {  // A^T M: rows
        const ACC m0 = m[(0 + b) * plane + i], m1 = m[(4 + b) * plane + i];
        const ACC m2 = m[(8 + b) * plane + i], m3 = m[(12 + b) * plane + i];
        s[0][b] = m0 + m1 + m2;
        s[1][b] = m1 - m2 - m3;
    }
    const ACC add = p.has_bias ? to_acc(bias[k]) : (ACC)0;
    const int q = p.q, prow = p.pq / p.q;
    T* yk = y + ((long long)img * p.k + k) * p.pq;
#pragma unroll
    for (int a = 0; a < 2; a++) {  // (A^T M) A: columns
        const int oy = 2 * ty + a;
        if (oy >= prow) continue;
        const ACC r0 = s[a][0] + s[a][1] + s[a][2] + add, r1 = s[a][1] - s[a][2] - s[a][3] + add;
        yk[oy * q + 2 * tx] = from_acc(r0);
        if (2 * tx + 1 < q) yk[oy * q + 2 * tx + 1] = from_acc(r1);
    }
}
