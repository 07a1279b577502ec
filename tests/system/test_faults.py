"""Faults at the scale of a device, on every device present: allocations and results larger than
the device's memory are a typed OutOfMemoryError at the call (before any kernel runs, quickly,
naming no fallback kernel), and absurd sizes never crash the process (a backend that could abort
runs in a child process, so that it cannot take the suite down)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import NoKernelError, OpRuntimeError, OutOfMemoryError

# -- an allocation larger than device memory ---------------------------------------------------------------------
HUGE = (1 << 42,)  # 16 TiB of float32


def test_huge_allocation_is_out_of_memory(device):
    with pytest.raises(OutOfMemoryError):
        device.provider.empty(HUGE, np.dtype(np.float32))
    with pytest.raises(OutOfMemoryError):
        device.provider.zeros(HUGE, np.dtype(np.float32))


def test_operator_whose_result_does_not_fit_is_out_of_memory(device):
    """A 4 TiB matmul result, in a child process (a backend that aborts must not take the suite down)."""
    code = textwrap.dedent(f"""
        import numpy as np, opruntime as opr
        from opruntime.errors import OutOfMemoryError
        a = np.ones((1 << 20, 1), np.float32)
        try:
            out = opr.matmul(a, a.T, device={device.name!r})
            out.numpy()
        except OutOfMemoryError as exc:
            print("TYPED", exc)
        except Exception as exc:
            print("NOT-OOM", type(exc).__module__, type(exc).__name__, exc)
        else:
            print("NO ERROR")
    """)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300,
                          check=False)
    tail = (proc.stdout + proc.stderr)[-1500:]
    assert proc.returncode == 0, f"the process died (rc {proc.returncode}):\n{tail}"
    assert proc.stdout.startswith("TYPED"), tail


# -- findings: absurd sizes -------------------------------------------------------------------------------------
#: device kinds whose runtime may abort the process on an absurd size (XLA checks fail with SIGABRT):
#: their cases run in a child process
ABORTS = ("jax",)


def call_typed(device: opr.Device, code: str) -> tuple[str, str]:
    """Run ``code`` (which calls an operator on ``DEV``, the device) and return ``(the class name
    of the error it raised or "NO ERROR", the message)``; in a child process for :data:`ABORTS`."""
    if device.kind not in ABORTS:
        try:
            exec(code, {"np": np, "opr": opr, "DEV": device})
        except Exception as exc:
            return type(exc).__name__, str(exc)
        return "NO ERROR", ""
    child = textwrap.dedent(f"""
        import sys, numpy as np, opruntime as opr
        DEV = opr.Device({device.name!r})
        try:
            exec({code!r})
        except Exception as exc:
            print(type(exc).__module__, type(exc).__name__, "|", exc)
        else:
            print("- NO ERROR |")
    """)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", child], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, f"the process died (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-1500:]}"
    # the child's own line (a library may print after it: XLA logs on stdout)
    ours = [ln for ln in proc.stdout.splitlines() if " | " in ln and len(ln.partition(" | ")[0].split()) == 2]
    assert ours, f"the child printed no result:\n{(proc.stdout + proc.stderr)[-1500:]}"
    head, _, msg = ours[-1].partition(" | ")
    module, name = head.split()
    assert module in ("-", "opruntime.errors"), f"untyped {module}.{name}: {msg}"
    return name, msg


@pytest.mark.parametrize("padding", [2**31, (1, 2**31), 2**40], ids=["2**31", "(1, 2**31)", "2**40"])
def test_finding_9_huge_padding_is_a_typed_error_on_every_device(device, padding):
    """Finding 9: ``conv2d(..., padding=2**31)`` overflowed 32-bit index arithmetic (a crash, or
    garbage); it is a typed error (the result cannot fit, or no kernel takes it) on every device."""
    name, msg = call_typed(device, f"opr.conv2d(np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32), "
                                   f"padding={padding!r}, device=DEV).numpy()")
    assert name in ("OutOfMemoryError", "NoKernelError"), f"{name}: {msg}"
    assert "conv2d" in msg


def test_finding_11_a_huge_broadcast_softmax_is_out_of_memory_at_once():
    """Finding 11: a broadcast view of 10**12 elements (4 bytes of memory) went to the kernel,
    which allocated for minutes before failing; the frontend refuses it before any kernel runs."""
    x = np.broadcast_to(np.float32(1), (10**6, 10**6))
    t0 = time.perf_counter()
    with pytest.raises(OutOfMemoryError, match=r"softmax: .*1000000x1000000.* needs .*GiB .* but cpu has .* free"):
        opr.softmax(x, device="cpu")
    assert time.perf_counter() - t0 < 2.0


def test_finding_12_a_result_larger_than_free_memory_is_out_of_memory_on_every_device(device):
    """Finding 12: matmul of two broadcast views (a few bytes each) whose result is 4 TiB started
    the kernel; on every device the call raises OutOfMemoryError first, naming the sizes."""
    t0 = time.perf_counter()
    name, msg = call_typed(device, "a = np.broadcast_to(np.float32(1), (1 << 20, 1))\n"
                                   "b = np.broadcast_to(np.float32(1), (1, 1 << 20))\n"
                                   "opr.matmul(a, b, device=DEV).numpy()")
    assert name == "OutOfMemoryError", f"{name}: {msg}"
    assert "needs" in msg and "GiB" in msg and device.name in msg
    if device.kind not in ABORTS:
        assert time.perf_counter() - t0 < 2.0  # refused at the call, not after trying


def test_finding_17_huge_padding_on_cpu_names_no_fallback_kernel():
    """Finding 17: ``padding=2**40`` on the cpu gave an OutOfMemoryError from inside a kernel,
    after a fallback announcement that named another kernel; the frontend refuses it first."""
    with pytest.raises(OutOfMemoryError) as info:
        opr.conv2d(np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32), padding=2**40, device="cpu")
    msg = str(info.value)
    assert msg.startswith("conv2d: ") and "needs" in msg
    assert "numpy.conv2d" not in msg and "using" not in msg and "fall" not in msg
    assert isinstance(info.value, OpRuntimeError) and isinstance(info.value, MemoryError)
    assert not isinstance(info.value, NoKernelError)
