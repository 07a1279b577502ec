"""Compiling JAX functions once per static signature, and the per-platform facts the kernels share.

Every kernel of this backend is one traceable JAX function per *static signature* (kernel,
shapes, dtype, attributes, config, platform, matmul-precision setting), wrapped in one
``jax.jit``. :meth:`JitKernel.prepare` is the kernel's ``prepare``: it finds (or makes) the
jitted function of the problem's signature in :data:`EXECUTABLES` and returns the launcher the
runtime keeps in its one launch cache (:data:`opruntime.kernels.LAUNCHES`). A call is then
``launch(*arrays)``: JAX's C++ dispatch of the jitted function inside a ``try`` that types
JAX's errors (:class:`~opruntime.errors.OutOfMemoryError`,
:class:`~opruntime.errors.KernelCompileError`). Nothing is retraced on a repeated call;
:data:`TRACES` counts traces per kernel so tests can prove it.

Memory stays flat over ever-new shapes because both caches are bounded LRUs and a jitted
function's XLA executables live exactly as long as the function object: JAX keeps them in the
function's own cache and in global caches keyed weakly by the traced function, so they are freed
(by reference counting, no garbage collection needed) when the last holder lets go, an
:data:`EXECUTABLES` entry or a launcher in ``LAUNCHES``. Measured with jax 0.10.2 on the CPU,
softmax over distinct shapes (``cache_entries`` 16): 1.76 MB of RSS per shape while every
function is kept, 0.05 MB per shape with eviction. That rest is JAX's own: its tracing caches key
jaxprs (not executables) weakly on jax.numpy's internal jitted functions, which never die, and
one of them (``trace_to_jaxpr``) is unbounded; only ``jax.clear_caches()`` empties it, which would
also drop the executables of every live function, the user's included, so the backend does not
call it. Eviction calls no ``fn.clear_cache()`` either: a launcher still in ``LAUNCHES`` shares
the function and would silently retrace on its next call (and ``clear_cache`` also empties JAX's
global parameter cache of every jitted function).

The only platform-specific choice in the whole backend is :func:`pallas_mode`: Pallas kernels
run with ``interpret=True`` on ``cpu`` and are compiled (Triton on ``gpu``, Mosaic on ``tpu``)
elsewhere. The platform comes from the problem's device provider (:func:`platform`).
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Mapping
from typing import Any

from opruntime.errors import KernelCompileError, OutOfMemoryError
from opruntime.kernels import Problem, frozen, itemsize, roofline
from opruntime.lru import LRU

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


def platform(problem: Problem) -> str:
    """The JAX platform (``cpu``, ``gpu``, ``tpu``) of the problem's device, from its provider
    (a :class:`~.memory.JaxDevice`): device names are never parsed."""
    return problem.device.provider.platform


def device_cost(problem: Problem, flops: float, nbytes: float, *, flop_eff: float = 1.0, byte_eff: float = 1.0,
                launch_mult: float = 1.0) -> float:
    """A roofline estimate on the problem's platform, scaled by a kernel's efficiencies."""
    f32, half, bw, launch = FIGURES.get(platform(problem), FIGURES["cpu"])
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


def accumulator(dtype: str) -> Any:
    """The dtype a kernel accumulates and applies its epilogue in for inputs of ``dtype``: float32
    for float16 and bfloat16 (rounded once, at the end), the dtype itself otherwise."""
    import jax.numpy as jnp

    return jnp.dtype(jnp.float32 if dtype in ("float16", "bfloat16") else dtype)


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

#: The jitted function of every static signature of every JAX kernel, least recently prepared
#: first; its capacity is the ``cache_entries`` setting (the module doc says why that bounds the
#: executables too).
EXECUTABLES = LRU("jax executables")


class JitKernel:
    """The ``prepare`` of a kernel made of one jitted JAX function per static signature.

    Args:
        name: the kernel name (for :data:`TRACES`, cache keys and error messages).
        build: ``build(problem, config) -> fn``: a traceable function of the operand arrays
            that returns the result; called once per static signature.

    Register it as ``Kernel(..., prepare=JitKernel(name, build).prepare)``.
    """

    __slots__ = ("build", "name")
    #: where the jitted functions are kept: one LRU for every kernel of the backend
    jitted = EXECUTABLES

    def __init__(self, name: str, build: Builder) -> None:
        self.name, self.build = name, build

    def prepare(self, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        """``launch(*arrays)`` for ``problem``: the jitted function of its static signature
        (made now unless an earlier problem had that signature; XLA compiles it on the first
        launch) behind the translation of JAX's errors. Errors of ``build`` are raised here."""
        key = self.static_key(problem, config)
        fn = EXECUTABLES.get(key)
        if fn is None:
            fn = EXECUTABLES[key] = self._jit(problem, config)
        return _launcher(fn, self.name, key, problem)

    def static_key(self, problem: Problem, config: Mapping[str, Any]) -> tuple:
        """Everything the traced function depends on. Not the strides (operands are JAX arrays,
        laid out by JAX) nor the device index (one jitted function serves every device of a
        platform; JAX keeps an executable per device inside it)."""
        import jax

        return (self.name, problem.shapes, problem.dtype, problem.attrs, frozen(config), platform(problem),
                jax.config.jax_default_matmul_precision)

    def _jit(self, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
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


def _launcher(fn: Callable[..., Any], name: str, key: tuple, problem: Problem) -> Callable[..., Any]:
    """``fn`` with JAX's errors typed: out of memory on every call; compile failures on the
    launcher's first call, which is where XLA (with Triton or Mosaic for Pallas) compiles."""
    warm = False  # set by the first call that succeeds: later failures are not compile failures

    def launch(*arrays: Any) -> Any:
        nonlocal warm
        try:
            out = fn(*arrays)
        except Exception as exc:
            raise_if_oom(exc, f"{name}: {problem.device} ran out of memory for {problem}")
            if not warm and _is_compile_error(exc):
                if EXECUTABLES.get(key) is fn:
                    EXECUTABLES.pop(key)  # the next prepare builds afresh
                raise KernelCompileError(name, str(problem.device), f"{type(exc).__name__}: {exc}") from exc
            raise
        warm = True
        return out

    launch.__qualname__ = launch.__name__ = f"launch[{name}]"
    launch.jitted = fn  # type: ignore[attr-defined]  (for tests: the jitted function it shares)
    return launch


def raise_if_oom(exc: BaseException, what: str) -> None:
    """Raise :class:`OutOfMemoryError` from ``exc`` when it is JAX's out-of-memory error:
    ``RESOURCE_EXHAUSTED`` where an allocation fails, ``Out of memory`` where a later computation
    is handed the failed buffer. ``what`` names the op, the operands and the device."""
    text = str(exc).strip()
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
        raise OutOfMemoryError(f"{what}: {text}. Free device memory (drop results no longer needed), "
                               "use smaller operands or a device with more memory") from exc


def _is_compile_error(exc: Exception) -> bool:
    """Lowering / compiler failures (Pallas -> Triton / Mosaic), as opposed to bad inputs."""
    text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    return any(s in text for s in ("Lowering", "lowering", "Mosaic", "Triton", "triton", "NotImplementedError",
                                   "XlaRuntimeError", "JaxRuntimeError", "compil"))
