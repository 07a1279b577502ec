// The activation epilogues, shared by the elementwise kernels and the GEMM / conv epilogues
// (prepended by compile.source(name, "epilogue.cl")). ACTIVATE(v) applies the build's ACT code
// (opruntime_opencl.epilogue.ACT: 0 none, 1 relu, 2 gelu, 3 gelu_tanh, 4 silu, 5 sigmoid,
// 6 tanh) to v, a scalar or vector of the including file's scalar accumulator type ACC (float or
// double; define it before this file, or as a -D option); NaN stays NaN. Constants are cast to
// ACC from full-precision literals, so a double build is exact to double (a float literal would
// limit gelu to float precision; without cl_khr_fp64 the compiler reads the literals as float).
// gelu is 0.5 v erfc(-v / sqrt 2) and gelu_tanh v / (1 + exp(-2u)), u = sqrt(2 / pi)(v + 0.044715 v^3):
// the textbook 1 + erf / 1 + tanh forms cancel for negative v (all digits of a float at v = -5).
#ifndef ACT
#define ACT 0
#endif
#if ACT == 1
#define ACTIVATE(v) (isnan(v) ? (v) : fmax((v), (ACC)0))
#elif ACT == 2
#define ACTIVATE(v) ((ACC)0.5 * (v) * erfc((v) * (ACC)-0.70710678118654752440))
#elif ACT == 3
#define ACTIVATE(v) ((v) / (1 + exp((ACC)-1.5957691216057307118 * ((v) + (ACC)0.044715 * (v) * (v) * (v)))))
#elif ACT == 4
#define ACTIVATE(v) ((v) / (1 + exp(-(v))))
#elif ACT == 5
#define ACTIVATE(v) (1 / (1 + exp(-(v))))
#elif ACT == 6
#define ACTIVATE(v) tanh(v)
#else
#define ACTIVATE(v) (v)
#endif
