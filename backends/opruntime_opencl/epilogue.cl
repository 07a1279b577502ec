// The activation epilogues, shared by the elementwise kernels and the GEMM / conv epilogues
// (prepended by compile.source(name, "epilogue.cl")). ACTIVATE(v) applies the build's ACT code
// (opruntime_opencl.epilogue.ACT: 0 none, 1 relu, 2 gelu, 3 gelu_tanh, 4 silu, 5 sigmoid,
// 6 tanh) to v, a scalar or vector of the including file's scalar accumulator type ACC (float or
// double; define it before this file); NaN stays NaN.
#ifndef ACT
#define ACT 0
#endif
#if ACT == 1
#define ACTIVATE(v) (isnan(v) ? (v) : fmax((v), (ACC)0))
#elif ACT == 2
#define ACTIVATE(v) (0.5f * (v) * (1 + erf((v) * 0.70710678118654752440f)))
#elif ACT == 3
#define ACTIVATE(v) (0.5f * (v) * (1 + tanh(0.79788456080286535588f * ((v) + 0.044715f * (v) * (v) * (v)))))
#elif ACT == 4
#define ACTIVATE(v) ((v) / (1 + exp(-(v))))
#elif ACT == 5
#define ACTIVATE(v) (1 / (1 + exp(-(v))))
#elif ACT == 6
#define ACTIVATE(v) tanh(v)
#else
#define ACTIVATE(v) (v)
#endif
