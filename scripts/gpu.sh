#!/usr/bin/env bash
# Set up the (offline) GPU machine for opruntime and run a command there.
#
#   scripts/gpu.sh                      # the GPU benchmark suites, then the GPU tests (logs in $OUT or out/)
#   scripts/gpu.sh python3 my_check.py  # anything else, after the set-up, e.g. one device's kernels:
#   scripts/gpu.sh python3 -m opruntime.tools bench softmax --shape 8192x8192 --kernels --device opencl:gpu
#
# Needs the pyopencl wheels in .whl/ (see ../shared/GPU.md) carried with the call; without them
# the OpenCL backend reports "pyopencl not installed" and the rest still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -d /etc/OpenCL/vendors ] && [ ! -f /etc/OpenCL/vendors/nvidia.icd ]; then
  echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd   # register NVIDIA's OpenCL platform
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/opruntime-install.log 2>&1 \
  || { cat /tmp/opruntime-install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if [ $# -gt 0 ]; then
  exec "$@"
fi
OUTDIR=${OUT:-out}
mkdir -p "$OUTDIR"
opr() { python3 -m opruntime.tools "$@"; }   # the `opruntime` command, whatever PATH holds
opr info > "$OUTDIR/info.txt" 2>&1
# 1. the GPU benchmark suite on cuda:0, every candidate kernel timed, peers in the same run
opr bench --suite gpu --kernels --device cuda:0 --output "$OUTDIR/bench-cuda.json" \
  2>"$OUTDIR/bench-cuda.err" | tee "$OUTDIR/bench-cuda.txt"
# 2. OpenCL and JAX on the GPU beside cuda:0 (cuBLAS), in one process: every candidate (each OpenCL
#    and Pallas config), the peers, and the per-call cost
for args in "matmul --shape 4096x4096,4096x4096" "softmax --shape 8192x8192" "--suite overhead"; do
  name=${args#--suite }; name=${name%% *}
  opr bench $args --kernels --device opencl:gpu --device jax:gpu --device cuda:0 \
    --output "$OUTDIR/bench-cl-jax-$name.json" 2>>"$OUTDIR/bench-cl-jax.err" | tee -a "$OUTDIR/bench-cl-jax.txt"
done
# 3. the GPU tests: CUDA, OpenCL on the GPU and JAX on the GPU
python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUTDIR/gpu-tests.log" | tail -30
