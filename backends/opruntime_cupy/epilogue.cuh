// The activation epilogues, shared by the elementwise kernels and the GEMM / conv epilogues.
// activate<A>(v) applies activation code A to v in the accumulator type (float or double);
// the codes are opruntime_cupy.epilogue.ACT (0 none, 1 relu, 2 gelu, 3 gelu_tanh, 4 silu,
// 5 sigmoid, 6 tanh). NaN stays NaN through every one.
#pragma once

__device__ __forceinline__ float m_erfc(float v) { return erfcf(v); }
__device__ __forceinline__ double m_erfc(double v) { return erfc(v); }
__device__ __forceinline__ float m_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double m_tanh(double v) { return tanh(v); }
__device__ __forceinline__ float m_exp(float v) { return __expf(v); }
__device__ __forceinline__ double m_exp(double v) { return exp(v); }

template <int A, typename F>
__device__ __forceinline__ F activate(F v) {
    if constexpr (A == 1) {
        return (v > F(0) || v != v) ? v : F(0);
    } else if constexpr (A == 2) {
        // 0.5 v (1 + erf(v / sqrt 2)) as 0.5 v erfc(-v / sqrt 2): no cancellation for negative v
        return F(0.5) * v * m_erfc(v * F(-0.70710678118654752440));
    } else if constexpr (A == 3) {
        // 0.5 v (1 + tanh u) as v / (1 + exp(-2u)), u = sqrt(2 / pi) (v + 0.044715 v^3): the same
        // without cancellation for negative v
        return v / (F(1) + m_exp(F(-1.5957691216057307118) * (v + F(0.044715) * v * v * v)));
    } else if constexpr (A == 4) {
        return v / (F(1) + m_exp(-v));
    } else if constexpr (A == 5) {
        return F(1) / (F(1) + m_exp(-v));
    } else if constexpr (A == 6) {
        return m_tanh(v);
    } else {
        return v;
    }
}
