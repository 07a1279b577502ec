#!/usr/bin/env bash
# The JAX backend on the GPU machine, in one call (run through scripts/gpu.sh, which installs
# the project):  scripts/gpu.sh bash scripts/jax_gpu.sh
# 1. the issue-5 timings (scripts/jax_bench.py), 2. `opruntime bench` on jax:gpu:0 with every
# candidate kernel, 3. the operator suite and the backend tests on jax:gpu:0. Logs go to $OUT.
set -uo pipefail
OUTDIR=${OUT:-out}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tee "$OUTDIR/jax-devices.log"
timeout 200 python3 scripts/jax_bench.py --json "$OUTDIR/jax_bench.json" 2>&1 | tee "$OUTDIR/jax-bench.log"
{
  timeout 60 python3 -m opruntime.cli bench --suite overhead --device jax:gpu:0 --peers jax
  timeout 60 python3 -m opruntime.cli bench matmul --shape 4096x4096,4096x4096 --device jax:gpu:0 --kernels --peers jax,torch
  timeout 60 python3 -m opruntime.cli bench softmax --shape 8192x8192 --device jax:gpu:0 --kernels --peers jax,torch,triton
} 2>&1 | grep -v "^\[" | tee "$OUTDIR/jax-opruntime-bench.log"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_ops.py tests/test_backend_jax.py -k "jax and gpu" 2>&1 | tee "$OUTDIR/jax-tests.log" | tail -25
