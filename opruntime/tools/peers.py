"""The peers ``opruntime bench`` compares against: each operator's ``peers`` (see
:class:`opruntime.ops.base.Operator`), run through the library they name, where the device's data
lives. Imported only by the bench.

This module holds only the per-library plumbing: placing the host operands for the library,
converting them to the case's dtype, compiling (``jax.jit``, an ONNX session) and waiting for the
device. How a library computes an operator is the operator's own business
(``opruntime/ops/<name>.py``). The libraries:

==========  ==================  ========================================================
name        the operator's      where it runs
==========  ==================  ========================================================
``numpy``   ``peers["numpy"]``  the host CPU, with ``lib=numpy``
``cupy``    ``peers["numpy"]``  a CUDA device, the same function with ``lib=cupy``
``torch``   ``peers["torch"]``  the host CPU or a CUDA device; TF32 off
``triton``  ``peers["triton"]`` a CUDA device, on torch tensors
``jax``     ``peers["jax"]``    the JAX device where the data lives, ``jax.jit`` of it
``onnx``    ``peers["onnx"]``   the host CPU: one ONNX node (or a chain) run by onnxruntime
``copy``    (none: a baseline)  the host CPU (NumPy) or a CUDA device (CuPy): a copy of
                                half the case's bytes, so that it reads and writes as
                                many bytes as the operator; memory-bound operators only
==========  ==================  ========================================================

``copy`` is no library but the roofline of a memory-bound operator: its ratio (copy time /
opruntime's time) is the fraction of the device's copy bandwidth that opruntime's call reaches,
the yardstick the issues' bandwidth targets name ("≥ 0.8x the machine's stream bandwidth,
measured with a NumPy copy").

Where the data lives comes from the device's provider (:func:`where`): the DLPack device of one
operand (``DeviceProvider.dlpack_device``) and whether the device is an accelerator.
A library that is not installed or does not run there is left out quietly; a peer that raises or
answers ``None`` / ``NotImplemented`` for a case is left out with the reason on stderr.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opruntime.devices import Device
from opruntime.kernels import np_dtype
from opruntime.ops import OPS
from opruntime.ops.base import Case, Operator
from opruntime.timing import Timed

#: DLPack device types (``__dlpack_device__()[0]``) the peers' libraries can run on
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_MANAGED = 1, 2, 13


@dataclass(frozen=True)
class Where:
    """Where a device's data lives, as the peers' libraries name it."""

    host: bool  # the host CPU
    cuda: int | None = None  # else the CUDA device of this index
    sample: Any = None  # one operand as the device holds it (a JAX array names its JAX device)


class NotApplicable(Exception):
    """A peer that does not run this case here, with the reason."""


def where(device: Device, sample: Any) -> Where:
    """Where ``device`` keeps ``sample`` (one of its arrays): a CUDA device when its DLPack device
    says so, the host when it says "CPU" (or nothing) and the device is no accelerator (an
    accelerator may export host copies), else only the sample itself (a JAX array knows its
    device)."""
    prov = device.provider
    try:
        kind, index = prov.dlpack_device(sample)
    except Exception:  # an array type without DLPack
        kind, index = None, 0
    if kind is not None and int(kind) in (DLPACK_CUDA, DLPACK_CUDA_MANAGED):
        return Where(False, int(index), sample)
    return Where((kind is None or int(kind) == DLPACK_CPU) and not prov.accelerator, None, sample)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _no_sync() -> None:
    return None


def _checked(lib: str, out: Any) -> Any:
    if out is None or out is NotImplemented:
        raise NotApplicable(f"the operator's {lib} peer does not compute this case (it answered {out!r})")
    return out


def _keeping(fn: Callable[[], Any]) -> tuple[Callable[[], None], list[Any]]:
    """``fn`` as a contender that keeps its last result (so that the sync can wait for it)."""
    last: list[Any] = [None]

    def call() -> None:
        last[0] = fn()

    return call, last


# -- the libraries ---------------------------------------------------------------------------------
def _numpy(peer: Callable[..., Any], host: Sequence[np.ndarray], case: Case, at: Where) -> Timed | None:
    if not at.host:
        return None
    if case.dtype == "bfloat16":
        raise NotApplicable("NumPy computes no bfloat16")
    xs = [h.astype(np_dtype(case.dtype), copy=False) for h in host]
    _checked("numpy", peer(np, *xs, **case.attrs))
    return functools.partial(peer, np, *xs, **case.attrs), _no_sync


def _cupy(peer: Callable[..., Any], host: Sequence[np.ndarray], case: Case, at: Where) -> Timed | None:
    if at.cuda is None or not _installed("cupy"):
        return None
    import cupy

    dev = cupy.cuda.Device(at.cuda)
    with dev:
        xs = [cupy.asarray(h).astype(np_dtype(case.dtype)) for h in host]
        _checked("numpy", peer(cupy, *xs, **case.attrs))
    return functools.partial(peer, cupy, *xs, **case.attrs), dev.synchronize


def _torch_place(host: Sequence[np.ndarray], case: Case, at: Where) -> tuple[Any, list[Any], Callable[[], None]] | None:
    """torch, the operands as torch tensors where the data lives (TF32 off), and the sync."""
    if not _installed("torch"):
        return None
    import torch

    if at.host:
        target, sync = "cpu", _no_sync
    elif at.cuda is not None and torch.cuda.is_available():
        target = f"cuda:{at.cuda}"
        torch.backends.cuda.matmul.allow_tf32 = False  # compare float32 with float32
        torch.backends.cudnn.allow_tf32 = False
        sync = functools.partial(torch.cuda.synchronize, at.cuda)
    else:
        return None
    dtype = getattr(torch, case.dtype)
    return torch, [torch.from_numpy(np.ascontiguousarray(h)).to(target, dtype) for h in host], sync


def _torch(peer: Callable[..., Any], host: Sequence[np.ndarray], case: Case, at: Where,
           library: str = "torch") -> Timed | None:
    placed = _torch_place(host, case, at)
    if placed is None:
        return None
    torch, ts, sync = placed
    _checked(library, peer(torch, *ts, **case.attrs))
    return functools.partial(peer, torch, *ts, **case.attrs), sync


def _triton(peer: Callable[..., Any], host: Sequence[np.ndarray], case: Case, at: Where) -> Timed | None:
    """A Triton kernel takes torch tensors on a CUDA device."""
    if at.cuda is None or not _installed("triton"):
        return None
    return _torch(peer, host, case, at, "triton")


def _jax(peer: Callable[..., Any], host: Sequence[np.ndarray], case: Case, at: Where) -> Timed | None:
    if not _installed("jax"):
        return None
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as the JAX backend: leave the others memory
    import jax

    jdev = _jax_device(jax, at)
    if jdev is None:
        return None
    if case.dtype == "float64" and not jax.config.jax_enable_x64:
        raise NotApplicable("float64 needs JAX's jax_enable_x64")
    xs = [jax.device_put(h.astype(np_dtype(case.dtype), copy=False), jdev) for h in host]
    f = jax.jit(functools.partial(peer, jax, **case.attrs))
    _checked("jax", f(*xs)).block_until_ready()  # compiles
    call, last = _keeping(functools.partial(f, *xs))
    return call, lambda: last[0].block_until_ready()


def _jax_device(jax: Any, at: Where) -> Any:
    """The JAX device where the data lives: a JAX array's own, else the host's or the CUDA one."""
    if isinstance(at.sample, jax.Array):
        return next(iter(at.sample.devices()))
    try:
        if at.host:
            return jax.devices("cpu")[0]
        if at.cuda is not None:
            return next((d for d in jax.devices("gpu") if d.id == at.cuda), None)
    except RuntimeError:  # no such JAX backend here
        return None
    return None


#: ONNX opset of the one-node models (Softmax takes one axis from opset 13 on)
ONNX_OPSET = 17


def _onnx(peer: Callable[..., Any], host: Sequence[np.ndarray], case: Case, at: Where) -> Timed | None:
    if not at.host or not _installed("onnx") or not _installed("onnxruntime"):
        return None
    import onnx
    import onnxruntime
    from onnx import helper

    node = _checked("onnx", peer(**case.attrs))
    chain = node if isinstance(node, list) else [node]  # a list: each node on the one before's result
    opset = max([ONNX_OPSET, *(v for n in chain for v in n[2:])])  # (op_type, attributes[, opset needed])
    xs = [h.astype(np_dtype(case.dtype), copy=False) for h in host]
    names = [f"x{i}" for i in range(len(xs))]
    elem = helper.np_dtype_to_tensor_dtype(xs[0].dtype)
    outs = [f"t{i}" for i in range(len(chain) - 1)] + ["y"]
    graph = helper.make_graph(
        [helper.make_node(n[0], names if i == 0 else [outs[i - 1]], [outs[i]], **n[1]) for i, n in enumerate(chain)],
        case.op,
        [helper.make_tensor_value_info(n, elem, x.shape) for n, x in zip(names, xs)],
        [helper.make_tensor_value_info("y", elem, op_result_shape(case, xs))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 18 else 9  # readable by onnxruntime releases of the last years
    onnx.checker.check_model(model)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads yield the cores
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = dict(zip(names, xs))
    session.run(None, feeds)
    return functools.partial(session.run, None, feeds), _no_sync


#: the copy baseline's name (see the module's docstring)
COPY = "copy"


def _copy(nbytes: float, at: Where) -> Timed | None:
    """A copy of ``nbytes / 2`` bytes where the data lives (``nbytes``: what the operator reads and
    writes once): NumPy's ``copyto`` on the host, a device-to-device ``cudaMemcpyAsync`` on a CUDA
    device; ``None`` elsewhere (a JAX device has no plain copy to time)."""
    n = max(int(nbytes) // 2, 1)
    if at.host:
        src, dst = np.ones(n, np.uint8), np.empty(n, np.uint8)
        return functools.partial(np.copyto, dst, src), _no_sync
    if at.cuda is None or not _installed("cupy"):
        return None
    import cupy

    dev = cupy.cuda.Device(at.cuda)
    with dev:
        src, dst = cupy.ones(n, cupy.uint8), cupy.empty(n, cupy.uint8)
    return functools.partial(dst.data.copy_from_device_async, src.data, n), dev.synchronize


def op_result_shape(case: Case, xs: Sequence[np.ndarray]) -> list[int]:
    """The result's shape, as the operator infers it (the ONNX checker wants the output's)."""
    return list(OPS[case.op].normalize([x.shape for x in xs], dict(case.attrs)).result_shape)


#: back-to-back calls recorded in one device graph by ``opruntime bench --graphs``
GRAPH_CALLS = 20
#: the libraries whose calls ``--graphs`` records through torch's CUDA graphs (the others on a CUDA
#: device, opruntime's own calls and ``copy`` included, through the device's provider)
TORCH_GRAPHS = ("torch", "triton")


def graphed(name: str, timed: Timed, device: Device, at: Where, calls: int) -> Timed:
    """``timed`` recorded once as a device graph of ``calls`` back-to-back calls, as ``(replay,
    sync)``: one replay stands for ``calls`` calls, and costs the host one graph launch, so that the
    timing is the device's alone (Triton's ``do_bench_cudagraph``). ``name`` is the contender's
    library (``torch`` / ``triton``: torch's ``CUDAGraph``, its allocations in torch's graph pool)
    or anything else run on the device's own stack (opruntime's calls, ``copy``, ``cupy``:
    :meth:`~opruntime.hookspecs.DeviceProvider.capture`, a private pool and stream). A library with
    no graphs here (JAX, ONNX Runtime, NumPy, a device without graphs) raises :class:`NotApplicable`."""
    call, sync = timed
    if name in TORCH_GRAPHS:
        import torch

        with torch.cuda.device(at.cuda):
            side = torch.cuda.Stream()  # torch's recipe: warm up on a side stream, then record
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    call()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    call()
        return graph.replay, sync
    if name not in ("opruntime", COPY, "cupy"):
        raise NotApplicable(f"{name} has no device graphs to record (--graphs times CUDA graphs only)")

    def record(static: list[Any]) -> list[Any]:
        for _ in range(calls):
            call()
        return []

    graph = device.provider.capture(record, [])
    if graph is None:
        raise NotApplicable(f"{device.name} records no device graphs (--graphs needs a CUDA device)")
    return functools.partial(graph.run, []), device.provider.synchronize


Runner = Callable[[Callable[..., Any], Sequence[np.ndarray], Case, Where], Timed | None]

#: library -> (the operator's peer it runs, how). ``cupy`` is the ``numpy`` peer on a CUDA device
#: (cuBLAS for matmul).
LIBRARIES: Mapping[str, tuple[str, Runner]] = {
    "numpy": ("numpy", _numpy),
    "cupy": ("numpy", _cupy),
    "torch": ("torch", _torch),
    "triton": ("triton", _triton),
    "jax": ("jax", _jax),
    "onnx": ("onnx", _onnx),
}


def contenders(op: Operator, case: Case, host: Sequence[np.ndarray], device: Device, sample: Any,
               wanted: Sequence[str] | None = None, nbytes: float = 0.0) -> dict[str, Timed]:
    """The peers of ``op`` that run ``case`` where ``device`` keeps its data (``sample``: one of
    its operands there), as ``name -> (call, sync)`` on operands of their own made from ``host``
    (float32 host data for a bfloat16 case); ``wanted`` limits the libraries. A memory-bound
    operator also gets the ``copy`` baseline of its ``nbytes``."""
    at = where(device, sample)
    out: dict[str, Timed] = {}
    if nbytes > 0 and op.bound == "memory" and (wanted is None or COPY in wanted):
        copy = _copy(nbytes, at)
        if copy is not None:
            out[COPY] = copy
    for lib, (peer_name, run) in LIBRARIES.items():
        peer = op.peers.get(peer_name)
        if peer is None or (wanted is not None and lib not in wanted):
            continue
        try:
            timed = run(peer, host, case, at)
        except Exception as exc:  # a peer that cannot run this case is skipped, with the reason
            print(f"  peer {lib}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        if timed is not None:
            out[lib] = timed
    return out
