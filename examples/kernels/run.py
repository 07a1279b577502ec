"""Register the example kernels (OpenCL C, CUDA C, Pallas) and check each, in every config, on
every present device of its kind against the float64 reference. Kernels for device kinds that
are not present are skipped, with the reason.

    python examples/kernels/run.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import opruntime as opr
from opruntime.ops import OPS
from opruntime.plugins import registry
from opruntime.testing.numerics import rel_err

sys.path.insert(0, str(Path(__file__).parent))
import cuda_softmax  # noqa: E402
import opencl_softmax  # noqa: E402
import pallas_softmax  # noqa: E402

MODULES = (opencl_softmax, cuda_softmax, pallas_softmax)
SHAPES = [(37, 1000), (4, 5, 129), (1, 3)]


def main() -> int:
    for module in MODULES:
        opr.register(module, name=module.__name__)  # a package declares an entry point instead
    reg = registry()
    failed = 0
    for module in MODULES:
        kernel = reg.kernels[module.NAME]
        devices = [d for d in reg.devices if d.kind == kernel.device_kind]
        if not devices:
            why = reg.unavailable.get(kernel.device_kind, "no plugin provides it")
            print(f"{kernel.name}: skipped, no {kernel.device_kind} device here ({why})")
        for dev in devices:
            for shape in SHAPES:
                x = (4 * np.random.default_rng().standard_normal(shape)).astype(np.float32)
                ref = OPS["softmax"].reference(x)
                # 1. through the operator, with the kernel pinned by configuration
                with opr.override(ops={"softmax": {"kernel": kernel.name}}):
                    chosen = opr.explain("softmax", x, device=dev.name).chosen
                    errors = {"pinned": rel_err(opr.softmax(x, device=dev.name).numpy(), ref)}
                # 2. every config, called directly with the Problem the frontend builds
                xd = dev.provider.from_host(x)
                problem = OPS["softmax"].problem([xd], dev, {"axis": -1})[0]
                for config in kernel.configs:
                    out = dev.provider.to_host(kernel(problem, config, xd))
                    errors[str(config)] = rel_err(out, ref)
                ok = chosen.startswith(kernel.name) and all(e < 1e-5 for e in errors.values())
                failed += not ok
                worst = max(errors.values())
                print(f"{kernel.name:<30} {dev.name:<10} {'x'.join(map(str, shape)):<10} {len(errors)} runs, "
                      f"worst rel. error {worst:.1e}: {'ok' if ok else f'FAILED (chosen {chosen}; {errors})'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
