// The activation epilogues, shared by the elementwise kernels and the GEMM / conv epilogues.
// activate<A>(v) applies activation code A to v in the accumulator type (float or double);
// the codes are opruntime_cupy.epilogue.ACT (0 none, 1 relu, 2 gelu, 3 gelu_tanh, 4 silu,
// 5 sigmoid, 6 tanh). NaN stays NaN through every one.
#pragma once

// 1 / d for the denominators below (1 + z / 2 and 1 + exp(.), never subnormal): one MUFU.RCP
// (at most 1 ulp from the rounded quotient; rcp(inf) = 0, NaN stays NaN). The IEEE division or
// __frcp_rn it replaces adds a rarely taken slow path per value, a branch that keeps the compiler
// from interleaving the 64-128 activations of a GEMM epilogue: gelu_tanh after the TMA GEMM cost
// 110 us at 4096^3 on the H100, where the GEMM takes 197.
__device__ __forceinline__ float m_rcp(float d) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    return r;
}
__device__ __forceinline__ double m_rcp(double d) { return 1.0 / d; }

// Phi(v) = 0.5 erfc(-v / sqrt 2), the normal CDF, without the cancellation of 0.5 (1 + erf) for
// negative v. float: erfc(|v| / sqrt 2) by the rational fit of Numerical Recipes' erfcc (relative
// error < 1.2e-7; ~20 instructions where CUDA's erfcf takes ~75, which would make a float16 GELU
// compute-bound on an H100), reflected for v > 0. NaN stays NaN; Phi(-inf) = 0, Phi(inf) = 1.
__device__ __forceinline__ float m_phi(float v) {
    const float z = fabsf(v) * 0.70710678118654752440f;
    const float t = m_rcp(fmaf(0.5f, z, 1.0f));
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    const float e = t * expf(fmaf(-z, z, p));  // erfc(z)
    return v < 0.0f ? 0.5f * e : fmaf(-0.5f, e, 1.0f);
}
__device__ __forceinline__ double m_phi(double v) { return 0.5 * erfc(v * -0.70710678118654752440); }
__device__ __forceinline__ float m_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double m_tanh(double v) { return tanh(v); }
__device__ __forceinline__ float m_exp(float v) { return __expf(v); }
__device__ __forceinline__ double m_exp(double v) { return exp(v); }

template <int A, typename F>
__device__ __forceinline__ F activate(F v) {
    if constexpr (A == 1) {
        return (v > F(0) || v != v) ? v : F(0);
    } else if constexpr (A == 2) {
        // 0.5 v (1 + erf(v / sqrt 2)) = v Phi(v), Phi without cancellation for negative v
        return v * m_phi(v);
    } else if constexpr (A == 3) {
        // 0.5 v (1 + tanh u) as v / (1 + exp(-2u)), u = sqrt(2 / pi) (v + 0.044715 v^3): the same
        // without cancellation for negative v
        return v * m_rcp(F(1) + m_exp(F(-1.5957691216057307118) * (v + F(0.044715) * v * v * v)));
    } else if constexpr (A == 4) {
        return v * m_rcp(F(1) + m_exp(-v));
    } else if constexpr (A == 5) {
        return m_rcp(F(1) + m_exp(-v));
    } else if constexpr (A == 6) {
        return m_tanh(v);
    } else {
        return v;
    }
}
