"""linear on OpenCL devices: the GEMMs of ``matmul.cl`` (tiled for GPUs, SIMD-vector for CPUs,
the plain tiled baseline) built with their epilogue: ``bias[n]`` and ``residual[m, n]`` added
and ``ACTIVATE`` of ``epilogue.cl`` applied to each output in the accumulator type before its one rounding, so GEMM,
bias and activation are one kernel.

The product is ``x @ weight.T``: the kernels see ``b = weight.T`` (K x N), a transposed view,
which the GEMM launcher gathers into a row-major copy (one pass over the weight, K*N values, small
beside the GEMM's 2*M*N*K operations); a row-major ``weight.T`` (a transposed view given as the
weight) is read in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opruntime.kernels import Attrs, Kernel, Problem

from . import compile as cl_compile
from . import matmul as mm
from .memory import kernel_dtypes


def as_matmul(problem: Problem) -> Problem:
    """The linear problem as the GEMM (M x K) @ (K x N) that its kernels run: ``b`` is
    ``weight.T`` (its strides swapped)."""
    (m, k), (n, _) = problem.shapes[:2]
    sx, sw = problem.strides[:2]
    sb = None if sw is None else (sw[1], sw[0])
    return Problem("matmul", problem.device, ((m, k), (k, n)), problem.dtypes[:2], (sx, sb), Attrs(), (m, n),
                   problem.dtype)


def _epilogue(problem: Problem) -> mm.Epilogue:
    return mm.Epilogue(bias=problem.attrs["bias"], activation=problem.attrs["activation"],
                       residual=problem.attrs["residual"])


def _preparer(build: Callable[..., Callable[..., Any]], label: str) -> Callable[[Problem, Mapping[str, int]], Any]:
    def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
        gemm = build(as_matmul(problem), config, _epilogue(problem), label)
        has_bias, has_residual = problem.attrs["bias"], problem.attrs["residual"]

        def launch(x: Any, w: Any, *rest: Any) -> Any:
            return gemm(x, w.T, rest[0] if has_bias else None, rest[-1] if has_residual else None)

        return launch

    prepare.__name__ = f"prepare_{label.rsplit('.', 1)[1]}"
    return prepare


def _via(fn: Callable[[Problem], Any]) -> Callable[[Problem], Any]:
    """A matmul ``supports`` / ``config_for`` applied to the linear problem's GEMM."""
    return lambda problem: fn(as_matmul(problem))


def _cost(fn: Callable[[Problem, Mapping[str, int]], float]) -> Callable[[Problem, Mapping[str, int]], float]:
    """A matmul cost for the GEMM, plus the gather of ``weight.T`` when it is not row-major."""
    def cost(problem: Problem, config: Mapping[str, int]) -> float:
        g = as_matmul(problem)
        t = fn(g, config)
        dev = problem.device.provider
        if g.strides[1] is not None and g.shapes[1][1] > 1 and g.strides[1][1] != 1:
            t += 2 * g.shapes[1][0] * g.shapes[1][1] * mm.itemsize(problem.dtype) / dev.bandwidth + dev.launch_s
        return t

    return cost


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source(*mm.SOURCE), kernel_dtypes()
    table: Sequence[tuple[str, Any, Any, Any, Any, Any]] = (
        ("tiled", mm.prepare_tiled, mm.supports_tiled, mm.tiled_cost, mm.TILED_CONFIGS, mm.tiled_configs),
        ("vector", mm.prepare_vector, mm.supports_vector, mm.vector_cost, mm.VECTOR_CONFIGS, mm.vector_configs),
        ("simple", mm.prepare_simple, mm.supports_simple, mm.simple_cost, mm.SIMPLE_CONFIGS, mm.simple_configs),
    )
    return [
        #      op        name                      kind      dtypes
        Kernel("linear", f"opencl.linear.{name}", "opencl", dtypes, prepare=_preparer(build, f"opencl.linear.{name}"),
               supports=_via(supports), cost=_cost(cost), configs=configs, config_for=_via(config_for), source=src)
        for name, build, supports, cost, configs, config_for in table
    ]
