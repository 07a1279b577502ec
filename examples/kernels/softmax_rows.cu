// softmax over the last axis of a C-contiguous float32 (rows, cols) array: one block of BLOCK
// threads per row. BLOCK is a tunable, injected as a #define line by the launcher; the default
// lets the file compile on its own (CI compiles every .cu with nvcc).
// A row of all -inf gives NaN, as the float64 reference does.

#define NEG_INF __int_as_float(0xff800000)  // -inf without <math.h>: NVRTC has no host headers
#ifndef BLOCK
#define BLOCK 256
#endif

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Reduce over the block with warp shuffles and one shared-memory round; every thread gets the result.
template <bool MAX>
__device__ float block_reduce(float v, float* scratch) {
    v = MAX ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < BLOCK / 32 ? scratch[lane] : (MAX ? NEG_INF : 0.0f);
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();  // scratch is reused by the next reduction
    return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float scratch[32];
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;

    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += BLOCK) m = fmaxf(m, xr[i]);
    m = block_reduce<true>(m, scratch);

    float sum = 0.0f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) sum += expf(xr[i] - m);
    const float inv = 1.0f / block_reduce<false>(sum, scratch);

    for (int i = threadIdx.x; i < cols; i += BLOCK) yr[i] = expf(xr[i] - m) * inv;
}
