// What the matmul kernels of this backend share: the scalar parameters of one launch, passed
// as one struct (one kernel argument: fewer arguments for the host to marshal per call).
#pragma once
#include "common.cuh"

struct GemmParams {
    i64 M, N, K;
    i64 sam, sak;  // A[m, k] at m * sam + k * sak (elements)
    i64 sbk, sbn;  // B[k, n] at k * sbk + n * sbn
    i64 z0;        // first batch entry of this launch (launches cover at most 65535 entries)
    i64 d1, d0;    // batch dims (d2 x d1 x d0), d0 innermost
    i64 sa2, sa1, sa0, sb2, sb1, sb0;  // batch strides of A and B (0: broadcast)
};
