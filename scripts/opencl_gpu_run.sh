#!/usr/bin/env bash
# The OpenCL backend's GPU-machine run, in one call: build and check every config on the NVIDIA
# OpenCL platform, time them against cupy.matmul (cuBLAS), torch.softmax and device copies, then
# run the operator suite and the backend tests on that device.
#
#   scripts/gpu.sh bash scripts/opencl_gpu_run.sh          (device tool: carry .whl)
#   SIZES="256" SHAPES="512x512" DEV=opencl:0 bash scripts/opencl_gpu_run.sh   (a dry run on PoCL)
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
python3 -c "
import pyopencl as cl
for p in cl.get_platforms():
    for d in p.get_devices():
        print(p.name, '|', d.name, '|', d.version, '| wg', d.max_work_group_size, '| local', d.local_mem_size,
              '| ext', ' '.join(sorted(e for e in d.extensions.split() if 'fp' in e or 'subgroup' in e)))
" 2>&1 | tee "$O/opencl_platforms.txt"
DEV=${DEV:-$(python3 -c "import opruntime as o; print(o.Device('opencl:gpu').name)")} || { echo "no OpenCL GPU"; exit 1; }
echo "OpenCL GPU device: $DEV"
PEERS=${PEERS:-cupy}
timeout 300 python3 scripts/opencl_bench.py --device "$DEV" --matmul ${SIZES:-1024 4096} \
  --softmax ${SHAPES:-8192x8192 4096x4096 32768x1024 1024x32768} --peers $PEERS --verbose-build --red-variants \
  --repeats 10 --json "$O/opencl_bench.json" 2>&1 | tee "$O/opencl_bench.log"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_ops.py tests/test_backend_opencl.py -k "$DEV" \
  -W "ignore:opruntime plugin:opruntime.errors.FallbackWarning" 2>&1 | tee "$O/opencl_tests.log" | tail -25
