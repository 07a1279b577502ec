// The warp-level tensor-core helpers of the mma.sync kernels (matmul_hgemm.cu, attention.cu's
// FAMILY 1): ldmatrix loads of 16-bit fragments from shared memory, the m16n8k16 MMA with fp32
// accumulation and the packing of two floats into one 32-bit A fragment word. The 16-bit type is
// BF16's (0 half, 1 bfloat16; the includer defines it first, as matmul_common.cuh does).
#pragma once
#include "common.cuh"

#ifndef BF16
#define BF16 0
#endif
#if BF16
#define MMA_T "bf16"
#else
#define MMA_T "f16"
#endif

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += a b, one m16n8k16 tile
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_T "." MMA_T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// two floats as two 16-bit values of the input type, `lo` in the low half
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
#if BF16
    return pack_bf16x2(lo, hi);
#else
    return pack_f16x2(lo, hi);
#endif
}
