// Layout changes between channels-first and channels-last, for the kernels that read NHWC (the
// TMA convolution, cuDNN's nhwc config): a batched transpose
//   y[b][i][j] = x[b * sb + j * sj + (i / wi) * sh + (i % wi) * sw]      (y contiguous)
// NCHW -> NHWC is i = (h, w), j = c (wi = W); NHWC -> NCHW is i = c, j = (h, w) (wi = C, sh = 0,
// sw = 1, sj = C), and KCRS -> KRSC the first with (r, s) as (h, w). Any strides of x.
//
// A block moves a TILE x TILE tile (i x j) through shared memory: it reads along i (x's
// contiguous index when x is NCHW) and writes along j (y's), both coalesced; the tile's rows are
// padded by one element against bank conflicts. Grid: (ceil(I / TILE), ceil(J / TILE), batches);
// threads (TILE, 8).
//
// Defines: ELEM, the element size in bytes (2, 4 or 8: the kernel moves bits, any dtype).
//
// transpose_plane2 (ELEM 2): the same for 16-bit elements when i is x's contiguous index (an NCHW
// image plane: offset b * sb + j * sj + i) and sb, sj, J are even: a 64 x 64 tile, each thread
// reading and writing element pairs as 4-byte words (a warp moves 128 contiguous bytes a row
// instead of 64). Grid: (ceil(I / 64), ceil(J / 64), batches); threads (32, 8).
#ifndef ELEM
#define ELEM 2
#endif
#if ELEM == 2
typedef unsigned short E;
#elif ELEM == 4
typedef unsigned int E;
#else
typedef unsigned long long E;
#endif
#define TILE 32

extern "C" __global__ void __launch_bounds__(TILE * 8)
transpose_batched(const E* __restrict__ x, E* __restrict__ y, const int I, const int J, const int wi,
                  const long long sb, const long long sj, const long long sh, const long long sw) {
    __shared__ E tile[TILE][TILE + 1];
    const int i0 = blockIdx.x * TILE, j0 = blockIdx.y * TILE, b = blockIdx.z;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const E* xb = x + b * sb;
    const int i = i0 + tx;
    const long long xi = i < I ? (long long)(i / wi) * sh + (long long)(i % wi) * sw : 0;
#pragma unroll
    for (int k = ty; k < TILE; k += 8) {  // read: consecutive threads along i
        const int j = j0 + k;
        if (i < I && j < J) tile[k][tx] = xb[xi + j * sj];
    }
    __syncthreads();
    E* yb = y + (long long)b * I * J;
#pragma unroll
    for (int k = ty; k < TILE; k += 8) {  // write: consecutive threads along j
        const int ii = i0 + k, j = j0 + tx;
        if (ii < I && j < J) yb[(long long)ii * J + j] = tile[tx][k];
    }
}

#if ELEM == 2
extern "C" __global__ void __launch_bounds__(256)
transpose_plane2(const E* __restrict__ x, E* __restrict__ y, const int I, const int J, const long long sb,
                 const long long sj) {
    __shared__ E tile[64][66];  // [j][i]; rows of 66: 33 words, so column reads spread over banks
    const int i0 = blockIdx.x * 64, j0 = blockIdx.y * 64, b = blockIdx.z;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const E* xb = x + b * sb;
    const int i = i0 + 2 * tx;
#pragma unroll
    for (int k = ty; k < 64; k += 8) {  // read: a warp takes 64 consecutive i of row j as 32 words
        const int j = j0 + k;
        if (j >= J) continue;
        const E* src = xb + j * sj + i;
        if (i + 1 < I) {
            const unsigned v = *reinterpret_cast<const unsigned*>(src);
            tile[k][2 * tx] = (E)v;
            tile[k][2 * tx + 1] = (E)(v >> 16);
        } else if (i < I) {
            tile[k][2 * tx] = src[0];
        }
    }
    __syncthreads();
    E* yb = y + (long long)b * I * J;
    const int j = j0 + 2 * tx;  // J even: j + 1 < J whenever j < J
#pragma unroll
    for (int k = ty; k < 64; k += 8) {  // write: a warp writes 64 consecutive j of row i as 32 words
        const int ii = i0 + k;
        if (ii < I && j < J)
            *reinterpret_cast<unsigned*>(yb + (long long)ii * J + j) = tile[2 * tx][k] | ((unsigned)tile[2 * tx + 1][k] << 16);
    }
}
#endif
