// Device helpers shared by this backend's kernels. No system headers: NVRTC builds these
// without include paths, so 16-bit floats are handled as raw bits (bits16) through PTX.
// Needs sm_80 or newer (cp.async, ldmatrix, bf16 conversions).
#pragma once

typedef unsigned short bits16;
typedef long long i64;

// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// -- asynchronous copies global -> shared (sm_80) ---------------------------------------------
// 16 bytes, bypassing L1; when `pred` is false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
// 4 bytes (cp.async.ca supports 4, 8, 16), zero-filled when `pred` is false.
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool pred) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// -- 16-bit floats as bits ----------------------------------------------------------------------
__device__ __forceinline__ float f16_to_f32(bits16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ bits16 f32_to_f16(float f) {
    bits16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(bits16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bits16 f32_to_bf16(float f) {
    bits16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// Two floats packed into one 32-bit word of two 16-bit floats: `lo` in the low half.
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// -- warp reductions (X: float or double) -------------------------------------------------------
template <typename X>
__device__ __forceinline__ X warp_max(X v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename X>
__device__ __forceinline__ X warp_sum(X v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
