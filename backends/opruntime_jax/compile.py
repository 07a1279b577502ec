"""Compiling JAX functions once per static signature, and the per-platform facts the kernels share.

Every kernel of this backend is one traceable JAX function per *static signature* (operator,
shapes, dtype, attributes, config, platform, matmul-precision setting), jit-compiled once and
kept. :class:`JitKernel` is the ``run`` callable of such a kernel; its hot path is: look the
problem up by identity (the selector hands the same :class:`~opruntime.kernels.Problem` object
for every repeat of a call), call the cached jitted function. Nothing is retraced or rebuilt on a
repeated call; :data:`TRACES` counts traces per kernel so tests can prove it.

The only platform-specific choice in the whole backend is :func:`pallas_mode`: Pallas kernels
run with ``interpret=True`` on ``cpu`` and are compiled (Triton on ``gpu``, Mosaic on ``tpu``)
elsewhere.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from opruntime.errors import KernelCompileError, OutOfMemoryError
from opruntime.kernels import Problem, itemsize, roofline

#: kernel name -> number of times its JAX function was traced (incremented at trace time only).
TRACES: collections.Counter[str] = collections.Counter()

#: Rough device figures per platform, for cost estimates only: (float32 FLOP/s at full
#: precision, float16/bfloat16 FLOP/s, bytes/s, per-call dispatch seconds). The GPU row is an
#: H100/H200 (cuBLAS fp32 ~50 TFLOP/s, fp16 ~700, ~3.5 TB/s, see ../shared/GPU.md); the TPU row
#: is a v4/v5-class chip, untested here; the CPU row is a small host.
FIGURES: dict[str, tuple[float, float, float, float]] = {
    "cpu": (50e9, 50e9, 10e9, 5e-6),
    "gpu": (50e12, 700e12, 3.5e12, 10e-6),
    "tpu": (50e12, 200e12, 1.2e12, 10e-6),
}


def platform(device: str) -> str:
    """The JAX platform of an opruntime device name: ``"jax:gpu:0"`` -> ``"gpu"``."""
    return device.split(":")[1]


def device_cost(problem: Problem, flops: float, nbytes: float, *, flop_eff: float = 1.0, byte_eff: float = 1.0,
                launch_mult: float = 1.0) -> float:
    """A roofline estimate on the problem's platform, scaled by a kernel's efficiencies."""
    f32, half, bw, launch = FIGURES.get(platform(problem.device), FIGURES["cpu"])
    rate = half if problem.dtype in ("float16", "bfloat16") else f32 / (4 if problem.dtype == "float64" else 1)
    return roofline(flops, nbytes, rate * flop_eff, bw * byte_eff, launch * launch_mult)


def io_bytes(problem: Problem) -> float:
    """Bytes read and written once: every operand and the result."""
    n = sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)
    return float(n * itemsize(problem.dtype))


# -- float64 ---------------------------------------------------------------------------------------
def x64_scope() -> contextlib.AbstractContextManager:
    """A context in which JAX keeps float64 (``jax_enable_x64`` for this thread only).

    The global flag is never changed, so the user's own JAX code behaves as before; float64
    data is created and computed on inside this scope only.
    """
    import jax

    scope = getattr(jax, "enable_x64", None)
    if scope is None:  # older JAX
        from jax.experimental import enable_x64 as scope  # type: ignore[no-redef]
    return scope(True)


def matmul_precision(dtype: str) -> Any:
    """The ``precision`` for dot / conv: HIGHEST for float32 and float64 (no TF32, no bf16 passes),
    unless the user has set ``jax_default_matmul_precision`` themselves, which then applies."""
    import jax
    from jax import lax

    if jax.config.jax_default_matmul_precision is not None:
        return None
    return lax.Precision.HIGHEST if dtype in ("float32", "float64") else None


# -- Pallas ------------------------------------------------------------------------------------------
def pallas_mode(plat: str, num_warps: int | None = None, num_stages: int | None = None) -> dict[str, Any]:
    """The keyword arguments that make a ``pallas_call`` run on ``plat``: interpreted on the CPU,
    compiled through Triton on GPUs and through Mosaic on TPUs. The only per-platform switch."""
    if plat == "cpu":
        return {"interpret": True}
    if plat == "gpu":
        from jax.experimental.pallas import triton as plgpu

        return {"compiler_params": plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)}
    return {}


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


# -- the jit cache -----------------------------------------------------------------------------------
Builder = Callable[[Problem, Mapping[str, Any]], Callable[..., Any]]


class JitKernel:
    """The jit cache of one kernel made of one jitted JAX function per static signature.

    Args:
        name: the kernel name (for :data:`TRACES` and error messages).
        build: ``build(problem, config) -> fn``: a traceable function of the operand arrays
            that returns the result; called once per static signature.

    ``JitKernel(name, build).run`` is the kernel's ``run(problem, config, *arrays)``: a plain
    closure (cheaper to call than a method) that finds the jitted function by the problem's
    identity and calls it; ``run.jit`` leads back here. ``prepare`` hands a plan that launcher
    itself; ``Kernel(..., **JitKernel(name, build).callables())`` sets both.
    """

    __slots__ = ("build", "fast", "jitted", "name", "run")
    FAST_MAX = 4096  # problems remembered by identity; past this the map starts over

    def __init__(self, name: str, build: Builder) -> None:
        self.name, self.build = name, build
        self.fast: dict[int, tuple[Problem, Mapping[str, Any], Callable[..., Any]]] = {}
        self.jitted: dict[tuple, Callable[..., Any]] = {}
        fast_get, miss = self.fast.get, self._miss

        def run(problem: Problem, config: Mapping[str, Any], *arrays: Any) -> Any:
            hit = fast_get(id(problem))
            if hit is not None and hit[0] is problem and hit[1] is config:
                return hit[2](*arrays)
            return miss(problem, config, arrays)

        run.jit = self  # type: ignore[attr-defined]
        run.__qualname__ = run.__name__ = f"run[{name}]"
        self.run = run

    def callables(self) -> dict[str, Callable[..., Any]]:
        """``run`` and ``prepare`` for the :class:`~opruntime.kernels.Kernel` record."""
        return {"run": self.run, "prepare": self.prepare}

    def prepare(self, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        """The launcher ``run`` keeps for this problem (the jitted function behind the
        out-of-memory translation); ``run`` itself if the problem has been forgotten since."""
        hit = self.fast.get(id(problem))
        if hit is not None and hit[0] is problem and hit[1] is config:
            return hit[2]
        return functools.partial(self.run, problem, config)

    def static_key(self, problem: Problem, config: Mapping[str, Any]) -> tuple:
        import jax

        return (problem.op, problem.shapes, problem.dtype, problem.attrs, tuple(sorted(config.items())),
                platform(problem.device), jax.config.jax_default_matmul_precision)

    def _miss(self, problem: Problem, config: Mapping[str, Any], arrays: tuple) -> Any:
        key = self.static_key(problem, config)
        fn = self.jitted.get(key)
        fresh = fn is None
        if fresh:
            fn = self.jitted[key] = self._compile(problem, config)
        if len(self.fast) >= self.FAST_MAX:
            self.fast.clear()
        self.fast[id(problem)] = (problem, config, _guarded(fn, self.name, problem))
        try:
            return fn(*arrays)
        except Exception as exc:
            _raise_oom(exc, self.name, problem)
            if fresh and _is_compile_error(exc):
                del self.jitted[key]
                raise KernelCompileError(self.name, problem.device, f"{type(exc).__name__}: {exc}") from exc
            raise

    def _compile(self, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        import jax

        body, name = self.build(problem, config), self.name

        def traced(*arrays: Any) -> Any:
            TRACES[name] += 1  # runs at trace time only
            return body(*arrays)

        jitted = jax.jit(traced)
        if problem.dtype != "float64":
            return jitted

        def in_x64(*arrays: Any) -> Any:
            with x64_scope():
                return jitted(*arrays)

        return in_x64


def _guarded(fn: Callable[..., Any], name: str, problem: Problem) -> Callable[..., Any]:
    """``fn`` with JAX's out-of-memory errors raised as :class:`OutOfMemoryError`."""

    def launch(*arrays: Any) -> Any:
        try:
            return fn(*arrays)
        except Exception as exc:
            _raise_oom(exc, name, problem)
            raise

    return launch


def _raise_oom(exc: Exception, name: str, problem: Problem) -> None:
    if "RESOURCE_EXHAUSTED" in str(exc) or "out of memory" in str(exc).lower():
        raise OutOfMemoryError(f"{name}: {problem.device} ran out of memory for {problem}: {exc}") from exc


def _is_compile_error(exc: Exception) -> bool:
    """Lowering / compiler failures (Pallas -> Triton / Mosaic), as opposed to bad inputs."""
    text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    return any(s in text for s in ("Lowering", "lowering", "Mosaic", "Triton", "triton", "NotImplementedError",
                                   "XlaRuntimeError", "JaxRuntimeError", "compil"))
