// C = A @ B for row-major A (M x K, row stride lda) and B (K x N, row stride ldb); C is a fresh
// contiguous M x N. Batches run along grid dim 2; a0 + aoff[b] / b0 + boff[b] are each batch's
// element offsets: a0 / b0 the view's start, aoff / boff each batch's step from it (broadcast
// batch dims repeat one), so any broadcast or batch stride works and the step tables depend on
// the layout only, not on where a view starts.
//
// Build options: T (element type), ACC (accumulator type), USE_FP64 / USE_FP16 (extensions).
//   gemm_tiled:  TSM, TSN, TSK (the work-group's tile), WPTM, WPTN (the outputs each work-item
//                computes: register blocking), VW (vector width of global loads, local tiles and
//                stores: 1, 2 or 4), AT (1: the A tile is kept k-major in local memory, so each
//                k step reads WPTM / VW vectors of A instead of WPTM: fewer registers), DB (1: two
//                local stages, one barrier per k tile instead of two).
//                The work-group is (TSN / WPTN, TSM / WPTM).
//   gemm_simple: TS (a TS x TS tile, one output per work-item).
//   gemm_vector: MR, NRV, VW (CPUs: MR rows x NRV VW-wide vectors per work-item, no local memory).
// Epilogue (linear): BIAS 1 adds bias[bias0 + n] (two more kernel arguments, after C's), RESID 1
// adds resid[resid0 + m * ldr + n] (three more, after the bias's: a linear's residual, row-major
// with row stride ldr; no batches), and ACT applies epilogue.cl's ACTIVATE (prepended by the
// launcher) to the fp32 / fp64 result before its one rounding to T. Without them C = A @ B.

#ifndef BIAS
#define BIAS 0
#endif
#ifndef RESID
#define RESID 0
#endif
#ifndef ACTIVATE
#define ACTIVATE(v) (v)
#endif
#if BIAS
#define BIAS_ARGS , __global const T* bias, const long bias0
#define ADD_BIAS(v, n) ((v) + (ACC)bias[bias0 + (n)])
#else
#define BIAS_ARGS
#define ADD_BIAS(v, n) (v)
#endif
#if RESID
#define RESID_ARGS , __global const T* resid, const long resid0, const long ldr
#define ADD_RESID(v, m, n) ((v) + (ACC)resid[resid0 + (long)(m) * ldr + (n)])
#else
#define RESID_ARGS
#define ADD_RESID(v, m, n) (v)
#endif
// The value stored at (m, n): bias, residual and activation in ACC, then rounded once.
inline T epilogue_value(ACC v) { return (T)ACTIVATE(v); }
#define EPILOGUE(v, m, n) epilogue_value(ADD_RESID(ADD_BIAS((ACC)(v), n), m, n))

#ifdef TSM  // ---------------------------------------------------------------- gemm_tiled
#ifndef VEC4  // vector literals (scripts/opencl_nvcc_check.py redefines them to compile as CUDA)
#define VEC2(V, a, b) ((V)(a, b))
#define VEC4(V, a, b, c, d) ((V)(a, b, c, d))
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#if VW == 1
#define VT T
#define VGET(v, i) (v)
#define VMAKE(t) ((t)[0])
#elif VW == 2
#define VT CAT(T, 2)
#define VGET(v, i) ((i) == 0 ? (v).s0 : (v).s1)
#define VMAKE(t) VEC2(VT, (t)[0], (t)[1])
#elif VW == 4
#define VT CAT(T, 4)
#define VGET(v, i) ((i) == 0 ? (v).s0 : (i) == 1 ? (v).s1 : (i) == 2 ? (v).s2 : (v).s3)
#define VMAKE(t) VEC4(VT, (t)[0], (t)[1], (t)[2], (t)[3])
#endif

#define RTSM (TSM / WPTM)          // work-items along M
#define RTSN (TSN / WPTN)          // work-items along N
#define WG (RTSM * RTSN)
#define KV (TSK / VW)              // vectors per A-tile row
#define NV (TSN / VW)              // vectors per B-tile row
#define LPTA (TSM * KV / WG)       // A-tile vectors each work-item loads
#define LPTB (TSK * NV / WG)       // B-tile vectors each work-item loads
#if AT  // A-tile vector idx -> (row, k vector): rows fastest, so the transposed stores spread over banks
#define A_ROW(idx) ((idx) % TSM)
#define A_KV(idx) ((idx) / TSM)
#else   // k fastest: each row's vectors are contiguous in memory and in the tile
#define A_ROW(idx) ((idx) / KV)
#define A_KV(idx) ((idx) % KV)
#endif
#ifndef LOCAL_PTR
#define LOCAL_PTR __local
#endif
#if AT
#define AST T                      // A tile element: scalars, k-major
#define A_TILE (TSK * TSM)
#else
#define AST VT                     // A tile element: vectors along k, row-major
#define A_TILE (TSM * KV)
#endif
#define STAGES (DB ? 2 : 1)

// Output (and A-tile) row of the work-item's wm-th row: VW consecutive rows per chunk, chunks
// RTSM * VW apart, so one vector read of the B tile serves VW columns and the stores coalesce.
#define ROW(ly, wm) (((wm) / VW) * (RTSM * VW) + (ly) * VW + (wm) % VW)
#define COLV(lx, j) ((j) * RTSN + (lx))   // vector column of the j-th column chunk

// Global -> registers: one tile of A (TSM x TSK at m0, k0) and of B (TSK x TSN at k0, n0).
// Full, aligned tiles use vector loads; edge tiles load scalars and zero-fill outside.
inline void load_tiles(__global const T* A, __global const T* B, int lda, int ldb, int M, int N, int K,
                       int m0, int n0, int k0, bool a_fast, bool b_fast, int tid, VT* ra, VT* rb) {
    #pragma unroll
    for (int l = 0; l < LPTA; l++) {
        int idx = l * WG + tid, r = A_ROW(idx), kv = A_KV(idx);
        if (a_fast) {
            ra[l] = *(__global const VT*)(A + (size_t)r * lda + kv * VW);
        } else {
            T t[VW];
            #pragma unroll
            for (int c = 0; c < VW; c++) {
                int k = k0 + kv * VW + c;
                t[c] = (m0 + r < M && k < K) ? A[(size_t)r * lda + kv * VW + c] : (T)0;
            }
            ra[l] = VMAKE(t);
        }
    }
    #pragma unroll
    for (int l = 0; l < LPTB; l++) {
        int idx = l * WG + tid, r = idx / NV, nv = idx % NV;
        if (b_fast) {
            rb[l] = *(__global const VT*)(B + (size_t)r * ldb + nv * VW);
        } else {
            T t[VW];
            #pragma unroll
            for (int c = 0; c < VW; c++) {
                int n = n0 + nv * VW + c;
                t[c] = (k0 + r < K && n < N) ? B[(size_t)r * ldb + nv * VW + c] : (T)0;
            }
            rb[l] = VMAKE(t);
        }
    }
}

// Registers -> one local stage. AT: A kept k-major as scalars (As[k * TSM + m]); else row-major
// vectors (As[m * KV + kv]). B is row-major vectors (Bs[k * NV + nv]).
inline void store_tiles(LOCAL_PTR AST* as, LOCAL_PTR VT* bs, const VT* ra, const VT* rb, int tid) {
    #pragma unroll
    for (int l = 0; l < LPTA; l++) {
        int idx = l * WG + tid;
#if AT
        #pragma unroll
        for (int c = 0; c < VW; c++) as[(A_KV(idx) * VW + c) * TSM + A_ROW(idx)] = VGET(ra[l], c);
#else
        as[A_ROW(idx) * KV + A_KV(idx)] = ra[l];
#endif
    }
    #pragma unroll
    for (int l = 0; l < LPTB; l++) bs[l * WG + tid] = rb[l];
}

__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void gemm_tiled(const int M, const int N, const int K,
                __global const T* A, __global const long* aoff, const long a0, const int lda, const int a_vec,
                __global const T* B, __global const long* boff, const long b0, const int ldb, const int b_vec,
                __global T* C, const int c_vec BIAS_ARGS RESID_ARGS) {
    __local AST As[STAGES * A_TILE] __attribute__((aligned(sizeof(VT))));
    __local VT Bs[STAGES * TSK * NV];

    const int lx = get_local_id(0), ly = get_local_id(1), tid = ly * RTSN + lx;
    const int n0 = get_group_id(0) * TSN, m0 = get_group_id(1) * TSM, batch = get_group_id(2);
    A += a0 + aoff[batch] + (long)m0 * lda;
    B += b0 + boff[batch] + n0;
    C += (long)batch * M * N;

    ACC acc[WPTM][WPTN];
    #pragma unroll
    for (int i = 0; i < WPTM; i++)
        #pragma unroll
        for (int j = 0; j < WPTN; j++) acc[i][j] = (ACC)0;

    const bool rows_in = m0 + TSM <= M, cols_in = n0 + TSN <= N;
    const int ntiles = (K + TSK - 1) / TSK;
    VT ra[LPTA], rb[LPTB];
    load_tiles(A, B, lda, ldb, M, N, K, m0, n0, 0, a_vec && rows_in && TSK <= K, b_vec && cols_in && TSK <= K,
               tid, ra, rb);
#if DB  // two local stages: tile t+1 is stored while tile t is read, one barrier per tile
    store_tiles(As, Bs, ra, rb, tid);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

    for (int t = 0; t < ntiles; t++) {
#if DB
        LOCAL_PTR const AST* as = As + (t & 1) * A_TILE;
        LOCAL_PTR const VT* bs = Bs + (t & 1) * TSK * NV;
#else
        LOCAL_PTR const AST* as = As;
        LOCAL_PTR const VT* bs = Bs;
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's readers are done
        store_tiles(As, Bs, ra, rb, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        if (t + 1 < ntiles) {  // prefetch the next tile into registers while this one is used
            int k1 = (t + 1) * TSK;
            bool kin = k1 + TSK <= K;
            load_tiles(A + k1, B + (long)k1 * ldb, lda, ldb, M, N, K, m0, n0, k1,
                       a_vec && rows_in && kin, b_vec && cols_in && kin, tid, ra, rb);
        }
#if AT
        #pragma unroll
        for (int k = 0; k < TSK; k++) {
            VT a[WPTM / VW], b[WPTN / VW];
            #pragma unroll
            for (int i = 0; i < WPTM / VW; i++) a[i] = *(LOCAL_PTR const VT*)(as + k * TSM + ROW(ly, i * VW));
            #pragma unroll
            for (int j = 0; j < WPTN / VW; j++) b[j] = bs[k * NV + COLV(lx, j)];
            #pragma unroll
            for (int i = 0; i < WPTM; i++) {
                ACC ai = (ACC)VGET(a[i / VW], i % VW);
                #pragma unroll
                for (int j = 0; j < WPTN; j++) acc[i][j] += ai * (ACC)VGET(b[j / VW], j % VW);
            }
        }
#else
        #pragma unroll
        for (int kv = 0; kv < KV; kv++) {
            VT a[WPTM];
            #pragma unroll
            for (int i = 0; i < WPTM; i++) a[i] = as[ROW(ly, i) * KV + kv];
            #pragma unroll
            for (int c = 0; c < VW; c++) {
                VT b[WPTN / VW];
                #pragma unroll
                for (int j = 0; j < WPTN / VW; j++) b[j] = bs[(kv * VW + c) * NV + COLV(lx, j)];
                #pragma unroll
                for (int i = 0; i < WPTM; i++) {
                    ACC ai = (ACC)VGET(a[i], c);
                    #pragma unroll
                    for (int j = 0; j < WPTN; j++) acc[i][j] += ai * (ACC)VGET(b[j / VW], j % VW);
                }
            }
        }
#endif
#if DB
        if (t + 1 < ntiles) store_tiles(As + ((t + 1) & 1) * A_TILE, Bs + ((t + 1) & 1) * TSK * NV, ra, rb, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

    const bool c_fast = c_vec && rows_in && cols_in;
    #pragma unroll
    for (int i = 0; i < WPTM; i++) {
        int m = m0 + ROW(ly, i);
        #pragma unroll
        for (int j = 0; j < WPTN / VW; j++) {
            int n = n0 + COLV(lx, j) * VW;
            if (c_fast) {
                T t[VW];
                #pragma unroll
                for (int c = 0; c < VW; c++) t[c] = EPILOGUE(acc[i][j * VW + c], m, n + c);
                *(__global VT*)(C + (long)m * N + n) = VMAKE(t);
            } else if (m < M) {
                #pragma unroll
                for (int c = 0; c < VW; c++)
                    if (n + c < N) C[(long)m * N + n + c] = EPILOGUE(acc[i][j * VW + c], m, n + c);
            }
        }
    }
}
#endif  // TSM

#ifdef TS  // ----------------------------------------------------------------- gemm_simple
__kernel __attribute__((reqd_work_group_size(TS, TS, 1)))
void gemm_simple(const int M, const int N, const int K,
                 __global const T* A, __global const long* aoff, const long a0, const int lda,
                 __global const T* B, __global const long* boff, const long b0, const int ldb, __global T* C BIAS_ARGS
                 RESID_ARGS) {
    __local T As[TS][TS];
    __local T Bs[TS][TS];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int col = get_global_id(0), row = get_global_id(1), batch = get_group_id(2);
    A += a0 + aoff[batch];
    B += b0 + boff[batch];
    ACC acc = (ACC)0;
    for (int k0 = 0; k0 < K; k0 += TS) {
        As[ly][lx] = (row < M && k0 + lx < K) ? A[(long)row * lda + k0 + lx] : (T)0;
        Bs[ly][lx] = (k0 + ly < K && col < N) ? B[(long)(k0 + ly) * ldb + col] : (T)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; k++) acc += (ACC)As[ly][k] * (ACC)Bs[k][lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < M && col < N) C[(long)batch * M * N + (long)row * N + col] = EPILOGUE(acc, row, col);
}
#endif  // TS

#ifdef MR  // ------------------------------------------------------------------ gemm_vector
// For CPU devices: no local memory (the caches block), each work-item computes MR rows x
// NRV vectors of VW columns, an FMA of a broadcast A element into a VW-wide B row segment per
// step: SIMD-wide code by construction (PoCL maps float16 to one AVX-512 register). Rows past
// M are clamped (computed, not stored); a column block crossing N takes the scalar path.
#define VEC_T CAT2(T, VW)
#define VEC_ACC CAT2(ACC, VW)
#define CAT2_(a, b) a##b
#define CAT2(a, b) CAT2_(a, b)
#define VLOAD CAT2(vload, VW)
#define VSTORE CAT2(vstore, VW)
#define TO_VACC CAT2(convert_, VEC_ACC)
#define TO_VT CAT2(convert_, VEC_T)

__kernel void gemm_vector(const int M, const int N, const int K,
                          __global const T* A, __global const long* aoff, const long a0, const int lda,
                          __global const T* B, __global const long* boff, const long b0, const int ldb, __global T* C
                          BIAS_ARGS RESID_ARGS) {
    const int n0 = get_global_id(0) * (NRV * VW), m0 = get_global_id(1) * MR, batch = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    A += a0 + aoff[batch];
    B += b0 + boff[batch];
    C += (long)batch * M * N;
    __global const T* arow[MR];
    #pragma unroll
    for (int i = 0; i < MR; i++) arow[i] = A + (long)min(m0 + i, M - 1) * lda;
    VEC_ACC acc[MR][NRV];
    #pragma unroll
    for (int i = 0; i < MR; i++)
        #pragma unroll
        for (int j = 0; j < NRV; j++) acc[i][j] = (VEC_ACC)(0);
    if (n0 + NRV * VW <= N) {
        for (int k = 0; k < K; k++) {
            VEC_ACC b[NRV];
            #pragma unroll
            for (int j = 0; j < NRV; j++) b[j] = TO_VACC(VLOAD(0, B + (long)k * ldb + n0 + j * VW));
            #pragma unroll
            for (int i = 0; i < MR; i++) {
                VEC_ACC a = (VEC_ACC)((ACC)arow[i][k]);
                #pragma unroll
                for (int j = 0; j < NRV; j++) acc[i][j] = fma(a, b[j], acc[i][j]);
            }
        }
        #pragma unroll
        for (int i = 0; i < MR; i++)
            if (m0 + i < M)
                #pragma unroll
                for (int j = 0; j < NRV; j++) {
                    VEC_ACC v = acc[i][j];
#if BIAS
                    v += TO_VACC(VLOAD(0, bias + bias0 + n0 + j * VW));
#endif
#if RESID
                    v += TO_VACC(VLOAD(0, resid + resid0 + (long)(m0 + i) * ldr + n0 + j * VW));
#endif
                    VSTORE(TO_VT(ACTIVATE(v)), 0, C + (long)(m0 + i) * N + n0 + j * VW);
                }
    } else {  // the last, partial column block: scalars
        for (int i = 0; i < MR && m0 + i < M; i++)
            for (int n = n0; n < N; n++) {
                ACC s = (ACC)0;
                for (int k = 0; k < K; k++) s += (ACC)arow[i][k] * (ACC)B[(long)k * ldb + n];
                C[(long)(m0 + i) * N + n] = EPILOGUE(s, m0 + i, n);
            }
    }
}
#endif  // MR
