// fp16 / bf16 GEMM on Hopper, warp-specialised and persistent: C = A @ B (+ bias, activation),
// A (M x K) k-contiguous, B (K x N) n-contiguous (B_NCONTIG 1) or k-contiguous (0), C (M x N)
// contiguous; fp32 accumulation in registers.
//
// One block per SM walks the C tiles (BM x BN, grouped for L2 reuse). Warpgroup 0 is the
// producer: one thread loads each stage's A and B tiles with the tensor memory accelerator (TMA,
// `cp.async.bulk.tensor` through the host-encoded tensor maps `ta` and `tb`, 128-byte swizzle,
// edges zero-filled by the hardware) into STAGES stages guarded by mbarriers: "full" completes
// when a stage's bytes have landed, "empty" when every consumer warp has finished reading it.
// The producer gives most of its registers back (setmaxnreg). Warpgroups 1..BM/64 are the
// consumers: each multiplies 64 rows x BN with one m64nBNk16 wgmma per k16 step from shared
// memory and releases a stage as soon as the group that read it completes. Its epilogue applies
// bias and activation in fp32, rounds, and (STORE_TMA 1: rows of C 16-byte aligned) writes its
// 64 x BN piece into a shared staging buffer that the TMA stores asynchronously while the
// warpgroup goes on to its next tile; STORE_TMA 0 stores pairs straight from the registers (at
// K = 768 those stores had cost as much as the MMAs). Meanwhile the producer already fills the
// stages for the next tile.
//
// Shared memory layout (128-byte swizzle, as the descriptors name it; 1024-byte aligned stages):
// A as BM rows of 64 k (128 B), chunk c of row r at c ^ (r % 8); a k-contiguous B the same with
// BN rows; an n-contiguous B as BN/64 atoms of 64 n x 64 k rows, chunk c of row k at c ^ (k % 8);
// the C staging buffer (STORE_TMA) as BM/64 x BN/64 atoms of 64 rows x 64 n, chunk c of row r at
// c ^ (r % 8), in the order (warpgroup, atom). The barriers follow.
//
// CONV 1: conv2d as an implicit GEMM (conv_launch.py): M = output channels, N = output pixels
// (image, p, q), K = the filter taps (r, s) x the input channels in chunks of 64. `ta` maps the
// weight laid out (K, R*S, C) (boxes of 64 channels x 1 tap x BM output channels: the same tile
// as a GEMM's A), `tb` is an im2col map of the input laid out NHWC (BN output positions x 64
// channels at one tap: the TMA forms the addresses, steps by the stride and zero-fills the
// padding), `tc` maps the NCHW output as (P*Q, K, images). The bias is per row. A tile's pixels
// may span images: a 64-pixel atom is stored by the TMA into the image it starts in, the rest of
// it by the warpgroup's threads from the staging buffer. Rows of P*Q pixels not 16-byte
// multiples: stores from registers.
// CONV 2: a 1x1, stride-1, unpadded conv2d on an NCHW input whose images are (C, H*W) matrices
// with 16-byte rows: per image, Y = W (K x C) @ X (C x H*W), the weight through a 2-D map (a
// GEMM's A), the image's X through a 3-D map (H*W, C, images) as an n-contiguous B, Y through a
// 3-D map (H*W, K, images); the tiles are (image, K tile, pixel tile), none spanning two images.
//
// Needs -arch=sm_90a; for other targets the kernel compiles to a trap (CI builds it).
// opruntime-arch: sm_90a
#include "matmul_common.cuh"
#include "wgmma.cuh"

#ifndef BM
#define BM 128
#define BN 256
#define STAGES 4
#endif
#ifndef STORE_TMA
#define STORE_TMA 1
#endif
#ifndef CONV
#define CONV 0
#endif
#if CONV
#undef B_NCONTIG
#define B_NCONTIG (CONV == 2)  // 1: an image's X, pixels contiguous; 0: the im2col tile, channels contiguous
// The convolution as the kernel walks it (conv_launch.py fills it)
struct ConvGemm {
    int k, npq, pq, q;                          // M, N; P*Q, Q
    int str_h, str_w, pad_t, pad_l, dil_h, dil_w;
    int s, chunks, ktiles;                      // filter width; 64-channel chunks a tap; R*S*chunks
};
#define PARAMS ConvGemm
#else
#define PARAMS GemmParams
#endif
#define BK 64
#define NCWG (BM / 64)            // consumer warpgroups
#define NT ((NCWG + 1) * 128)     // + the producer warpgroup
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BK * BN * 2)
#define STAGE_BYTES (A_BYTES + B_BYTES)
#define C_BYTES (STORE_TMA ? BM * BN * 2 : 0)  // the staging buffer of the TMA stores
// registers per thread after the hand-over: the producer keeps few, the consumers take the rest
#define PRODUCER_REGS 40
#define CONSUMER_REGS (NCWG == 1 ? 240 : 232)
static_assert(BM == 64 || BM == 128, "one or two consumer warpgroups");
static_assert(BN == 128 || BN == 256, "one m64nBNk16 instruction per k16 step");
static_assert(STAGES >= 2, "double buffering at least");
static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "swizzle atoms stay 1024-byte aligned");

// A CUtensorMap: 128 opaque bytes, encoded on the host (tma.py)
struct __align__(64) TensorMap {
    unsigned long long w[16];
};

// Columns n, n + 1 of rows r, r + 8 (accumulators a[0..1] and a[2..3]): bias (per column; per
// row for CONV) and activation in fp32, rounded to two 16-bit pairs (lo: row r, hi: row r + 8)
__device__ __forceinline__ void finish(const float* a, int r, int n, int M, int N, const bits16* bias, unsigned& lo,
                                       unsigned& hi) {
    float v[4] = {a[0], a[1], a[2], a[3]};
#if BIAS && CONV
    const float b0 = bias16(bias, r, M), b8 = bias16(bias, r + 8, M);
    v[0] += b0; v[1] += b0; v[2] += b8; v[3] += b8;
#elif BIAS
    const float b0 = bias16(bias, n, N), b1 = bias16(bias, n + 1, N);
    v[0] += b0; v[1] += b1; v[2] += b0; v[3] += b1;
#endif
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = activate<ACT>(v[q]);
#if BF16
    lo = pack_bf16x2(v[0], v[1]); hi = pack_bf16x2(v[2], v[3]);
#else
    lo = pack_f16x2(v[0], v[1]); hi = pack_f16x2(v[2], v[3]);
#endif
}
#if BIAS
#define BIAS_ARG bias
#else
#define BIAS_ARG nullptr
#endif

extern "C" __global__ void __launch_bounds__(NT, 1)
hgemm_tma(bits16* __restrict__ C,
#if BIAS
          const bits16* __restrict__ bias,
#endif
          const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb,
          const __grid_constant__ TensorMap tc, const PARAMS p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned base = (raw + 1023) & ~1023u;  // swizzle atoms: 1024-byte aligned stages
#if CONV == 2  // per image: N = its pixels
    const int M = p.k, N = p.pq, ktiles = p.ktiles, images = p.npq / p.pq;
#elif CONV
    const int M = p.k, N = p.npq, ktiles = p.ktiles, images = 1;
#else
    const int M = (int)p.M, N = (int)p.N, images = 1;
    const int ktiles = ((int)p.K + BK - 1) / BK;  // >= 1: matmul.py sends K = 0 elsewhere
#endif
    const int tid = threadIdx.x, wg = tid >> 7;
    const int per_image = ((M + BM - 1) / BM) * ((N + BN - 1) / BN), tiles = images * per_image;
    // tile t: image t / per_image, and its C tile in grouped order
    auto tile_at = [&](int t, int& m0, int& n0) {
        const int img = t / per_image;
        grouped_tile_at(t - img * per_image, M, N, BM, BN, m0, n0);
        return img;
    };
    auto stage_a = [&](int s) { return base + s * STAGE_BYTES; };
    auto stage_b = [&](int s) { return base + s * STAGE_BYTES + A_BYTES; };
    const unsigned staging = base + STAGES * STAGE_BYTES, bars = staging + C_BYTES;
    auto full = [&](int s) { return bars + s * 8; };
    auto empty = [&](int s) { return bars + (STAGES + s) * 8; };

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);           // the producer's expect_tx arrival (+ the bytes)
            mbar_init(empty(s), NCWG * 4);   // one arrival per consumer warp
        }
        fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {  // ---- producer ----
        setmaxnreg_dec<PRODUCER_REGS>();
        if (tid == 0) {
            prefetch_tensormap(&ta);
            prefetch_tensormap(&tb);
            int s = 0, phase = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                int m0, n0;
                const int timg = tile_at(tile, m0, n0);
#if CONV == 1  // the tile's first output position, as the input pixel its filter window starts at
                const int img = n0 / p.pq, pq = n0 - img * p.pq, op = pq / p.q;
                const int h0 = op * p.str_h - p.pad_t, w0 = (pq - op * p.q) * p.str_w - p.pad_l;
                int chunk = 0, tap = 0, tr = 0, ts = 0;  // k step kt = (tap = r * S + s) * chunks + chunk
#endif
                for (int kt = 0; kt < ktiles; ++kt) {
                    mbar_wait(empty(s), phase ^ 1);  // the consumers are done with this stage
                    mbar_expect_tx(full(s), STAGE_BYTES);
#if CONV == 1
                    tma_load_3d(stage_a(s), &ta, chunk * BK, tap, m0, full(s));
                    tma_load_im2col(stage_b(s), &tb, chunk * BK, w0, h0, img, (unsigned short)(ts * p.dil_w),
                                    (unsigned short)(tr * p.dil_h), full(s));
                    if (++chunk == p.chunks) {
                        chunk = 0;
                        ++tap;
                        if (++ts == p.s) { ts = 0; ++tr; }
                    }
#else
                    tma_load_2d(stage_a(s), &ta, kt * BK, m0, full(s));
#if CONV == 2
#pragma unroll
                    for (int a = 0; a < BN / 64; ++a)
                        tma_load_3d(stage_b(s) + a * (BK * 128), &tb, n0 + a * 64, kt * BK, timg, full(s));
#elif B_NCONTIG
#pragma unroll
                    for (int a = 0; a < BN / 64; ++a)
                        tma_load_2d(stage_b(s) + a * (BK * 128), &tb, n0 + a * 64, kt * BK, full(s));
#else
                    tma_load_2d(stage_b(s), &tb, kt * BK, n0, full(s));
#endif
#endif
                    if (++s == STAGES) { s = 0; phase ^= 1; }
                }
            }
        }
    } else {  // ---- consumers ----
        setmaxnreg_inc<CONSUMER_REGS>();
        const int cw = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31;
        int s = 0, phase = 0;
        float acc[BN / 2];
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int m0, n0;
            const int timg = tile_at(tile, m0, n0);
            int prev = 0;
            for (int kt = 0; kt < ktiles; ++kt) {
                mbar_wait(full(s), phase);
                const unsigned a0 = stage_a(s) + cw * 64 * 128, b0 = stage_b(s);
                wg_fence();
                wgmma_k64<BN, B_NCONTIG>(acc, a0, b0, kt);  // the tile's first step overwrites
                wg_commit();
                wg_wait<1>();  // the group before this one has read its stage: hand it back
                if (kt > 0 && lane == 0) mbar_arrive(empty(prev));
                prev = s;
                if (++s == STAGES) { s = 0; phase ^= 1; }
            }
            wg_wait<0>();
            fence_regs<BN / 2>(acc);
            if (lane == 0) mbar_arrive(empty(prev));

#if STORE_TMA
            // Epilogue through shared memory: accumulator i of a thread is row 16 * warp + lane / 4
            // (+8 for i % 4 >= 2) of its warpgroup's 64, column 8 * (i / 4) + 2 * (lane % 4) + i % 2;
            // 4-byte pairs into the swizzled atoms (conflict-free: the 8 rows of a store land in 8
            // different 16-byte chunks), then one thread hands the atoms to the TMA.
            const int wtid = tid & 127;
            const unsigned mine = staging + cw * (64 * BN * 2);
            if (wtid == 0) bulk_wait_read<0>();  // the previous tile's stores have read the buffer
            named_bar_sync(1 + cw, 128);
            const int r = warp * 16 + (lane >> 2), gr = m0 + cw * 64 + r;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int n = n0 + j * 8 + (lane & 3) * 2;
                unsigned lo, hi;
                finish(acc + 4 * j, gr, n, M, N, BIAS_ARG, lo, hi);
                const unsigned atom = mine + (j >> 3) * (64 * 128), c = j & 7, off = (lane & 3) * 4;
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(atom + r * 128 + ((c ^ (r & 7)) << 4) + off), "r"(lo));
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(atom + (r + 8) * 128 + ((c ^ ((r + 8) & 7)) << 4) + off),
                             "r"(hi));
            }
            fence_proxy_async();  // the writes, visible to the TMA's (async) proxy ...
            named_bar_sync(1 + cw, 128);  // ... from every thread of the warpgroup
            if (wtid == 0) {
#pragma unroll
                for (int a = 0; a < BN / 64; ++a) {
#if CONV == 2
                    tma_store_3d(&tc, mine + a * (64 * 128), n0 + a * 64, m0 + cw * 64, timg);
#elif CONV  // the atom's pixels in the image it starts in (the TMA drops those past its end)
                    const int pix = n0 + a * 64, img = pix / p.pq;
                    if (pix < N) tma_store_3d(&tc, mine + a * (64 * 128), pix - img * p.pq, m0 + cw * 64, img);
#else
                    tma_store_2d(&tc, mine + a * (64 * 128), n0 + a * 64, m0 + cw * 64);
#endif
                }
                bulk_commit();
            }
#if CONV == 1
            // An atom's pixels past the end of the image it starts in (P*Q not a multiple of 64): a
            // box cannot start at a negative pixel (the TMA faults), so every thread copies 16-byte
            // chunks of them, 8 pixels that never straddle two images (P*Q % 8 == 0 here)
#pragma unroll
            for (int a = 0; a < BN / 64; ++a) {
                const int pix = n0 + a * 64, first = (pix / p.pq + 1) * p.pq - pix;  // pixels in its first image
                if (first >= 64 || pix >= N) continue;
                const unsigned atom = mine + a * (64 * 128);
                for (int idx = wtid; idx < 64 * 8; idx += 128) {
                    const int rr = idx >> 3, c = idx & 7, px = pix + c * 8, row = m0 + cw * 64 + rr;
                    if (c * 8 < first || px >= N || row >= M) continue;
                    const int img = px / p.pq;
                    uint4 v;
                    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                                 : "r"(atom + rr * 128 + ((c ^ (rr & 7)) << 4)));
                    *reinterpret_cast<uint4*>(C + ((i64)img * M + row) * p.pq + (px - img * p.pq)) = v;
                }
            }
#endif
#else
            // Epilogue from registers: accumulator i of a thread is row 16 * warp + lane / 4
            // (+8 for i % 4 >= 2) of its warpgroup's 64, column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
            const int r = m0 + cw * 64 + warp * 16 + (lane >> 2), c = n0 + (lane & 3) * 2;
#if CONV  // y[image, r, pq]: each element on its own (CONV 1: the pair may straddle two images)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int n = c + j * 8;
                unsigned lo, hi;
                finish(acc + 4 * j, r, n, M, N, BIAS_ARG, lo, hi);
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    if (n + u >= N) continue;
                    const int img = CONV == 2 ? timg : (n + u) / p.pq;
                    bits16* y = C + ((i64)img * M + r) * p.pq + (CONV == 2 ? n + u : n + u - img * p.pq);
                    if (r < M) y[0] = (bits16)(lo >> (16 * u));
                    if (r + 8 < M) y[(i64)8 * p.pq] = (bits16)(hi >> (16 * u));
                }
            }
#else
            const bool pair = (N & 1) == 0;  // 4-byte aligned pairs
            bits16* c0 = C + (i64)r * N;
            bits16* c8 = c0 + (i64)8 * N;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int n = c + j * 8;
                unsigned lo, hi;
                finish(acc + 4 * j, r, n, M, N, BIAS_ARG, lo, hi);
                if (n >= N) continue;
                if (pair) {  // n even and N even: n + 1 < N too
                    if (r < M) *reinterpret_cast<unsigned*>(c0 + n) = lo;
                    if (r + 8 < M) *reinterpret_cast<unsigned*>(c8 + n) = hi;
                } else {
                    if (r < M) { c0[n] = (bits16)lo; if (n + 1 < N) c0[n + 1] = (bits16)(lo >> 16); }
                    if (r + 8 < M) { c8[n] = (bits16)hi; if (n + 1 < N) c8[n + 1] = (bits16)(hi >> 16); }
                }
            }
#endif
#endif
        }
#if STORE_TMA
        if ((tid & 127) == 0) bulk_wait<0>();  // the last stores complete before the block ends
#endif
    }
#else
    __trap();  // built for a target without wgmma / TMA: matmul.py never launches this
#endif
}
