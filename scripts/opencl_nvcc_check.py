"""Compile the OpenCL kernels as CUDA with nvcc for sm_90 and print ptxas' resource report.

NVIDIA's OpenCL compiler ends in the same ptxas, so registers, spills and local-memory use seen
here are a free (no GPU) preview of what the NVIDIA OpenCL platform builds. A thin prelude maps
the OpenCL C the kernels use onto CUDA.

    python scripts/opencl_nvcc_check.py            # every matmul config

(The softmax kernels compute on OpenCL vector types, which CUDA lacks, so they are not covered.)
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))

PRELUDE = r"""
#define __kernel extern "C" __global__
#define __global
#define __local __shared__
#define reqd_work_group_size(...)
#define inline __device__ inline
#define barrier(x) __syncthreads()
#define CLK_LOCAL_MEM_FENCE 0
__device__ inline unsigned cl_id(uint3 v, int d) { return d == 0 ? v.x : d == 1 ? v.y : v.z; }
__device__ inline unsigned cl_dim(dim3 v, int d) { return d == 0 ? v.x : d == 1 ? v.y : v.z; }
#define get_local_id(d) cl_id(threadIdx, d)
#define get_group_id(d) cl_id(blockIdx, d)
#define get_global_id(d) (cl_id(blockIdx, d) * cl_dim(blockDim, d) + cl_id(threadIdx, d))
struct __align__(16) clfloat4 { float s0, s1, s2, s3; };
struct __align__(8) clfloat2 { float s0, s1; };
struct __align__(16) cldouble2 { double s0, s1; };
struct __align__(32) cldouble4 { double s0, s1, s2, s3; };
#define float4 clfloat4
#define float2 clfloat2
#define double2 cldouble2
#define double4 cldouble4
#define LOCAL_PTR
#define VEC2(V, a, b) (V{a, b})
#define VEC4(V, a, b, c, d) (V{a, b, c, d})
"""


def compile_report(source: str, defines: dict, maxreg: int = 0) -> str:
    text = PRELUDE + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + source
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(text)
        cap = [f"-maxrregcount={maxreg}"] if maxreg else []
        res = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", *cap, "-o", str(Path(tmp) / "k.cubin"),
                              str(src)], capture_output=True, text=True)
    if res.returncode:
        return "BUILD FAILED\n" + res.stderr[-3000:]
    regs = re.findall(r"Used (\d+) registers", res.stderr)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    smem = re.findall(r"(\d+) bytes smem", res.stderr)
    stack = re.findall(r"(\d+) bytes stack frame", res.stderr)
    return f"regs {regs} spill(st,ld) {spill} smem {smem} stack {stack}"


def main() -> None:
    from opruntime_opencl import matmul

    mm = (Path(matmul.__file__).with_name("matmul.cl")).read_text()
    for cfg in matmul.TILED_CONFIGS:
        print("gemm_tiled", cfg, compile_report(mm, {"T": "float", "ACC": "float", **cfg}))
    print("gemm_tiled fp64", matmul.TILED_CONFIGS[6],
          compile_report(mm, {"T": "double", "ACC": "double", **matmul.TILED_CONFIGS[6]}))
    for cfg in matmul.SIMPLE_CONFIGS:
        print("gemm_simple", cfg, compile_report(mm, {"T": "float", "ACC": "float", **cfg}))

if __name__ == "__main__":
    main()
