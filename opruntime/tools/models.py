"""The ``models`` bench suite: whole models through opruntime against PyTorch eager and ONNX Runtime.

``opruntime bench --suite models`` times, on each device asked for, the two models of the examples
(``examples/transformer_block.py``, ``examples/resnet50.py``), each built by the example's own
``build(device, dtype, **sizes)`` (one copy of each model: the example's), against the peers in
the same rounds of the one timing harness (:func:`opruntime.timing.measure_rounds`):

* ``torch``: the same ``torch.nn`` module, eager, where the device's data lives (the CPU, or the
  CUDA device of a CUDA device's arrays), in the same dtype;
* ``onnx``: ResNet-50 exported with ``torch.onnx.export`` and run by ONNX Runtime on the CPU,
  for devices whose data lives on the host, in float32.

========================  =====================================  ==================================
model                     accelerators (float16)                 host devices (float32)
========================  =====================================  ==================================
transformer_block         B=8, S=1024, d=768, 12 heads           the same
resnet50                  batch 32, 224x224                      batch 4, 224x224
========================  =====================================  ==================================

``--quick`` takes small sizes (a check that the suite runs, not a measurement). Each result is a
:class:`opruntime.tools.bench.Result` (``op`` is the model, ``kernel`` the operator calls one
forward pass makes, the rate GFLOP/s of the forward pass's matmuls and convolutions as
``torch.utils.flop_counter`` counts them), so the table, the JSON and the plot are the operators'.
Its ``error`` says when opruntime's output differs from PyTorch float32 by more than the
example's ``TOLERANCE`` (relative error: max abs error / max abs reference), after the timing.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from opruntime.capture import capture
from opruntime.devices import Device
from opruntime.tensor import tensor
from opruntime.timing import Timed, measure_rounds, paired_ratio, settle
from opruntime.trace import trace

from . import peers as peer_libraries
from .bench import Result

#: the suite's name in ``opruntime bench --suite``
SUITE = "models"
#: where the models are defined: the repository's examples (an editable install, or a checkout)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: the peer libraries a model case can be timed against
LIBRARIES = ("torch", "onnx")


@dataclass(frozen=True)
class ModelCase:
    """One model at one size in one dtype: ``examples/<model>.py``'s ``build(device, dtype, **sizes)``."""

    model: str
    dtype: str
    sizes: Mapping[str, int] = field(default_factory=dict)
    peers: tuple[str, ...] = ("torch",)
    #: the forward through ``opr.capture`` (one device graph per call) instead of call by call
    captured: bool = False

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.sizes.items()) + (" captured" if self.captured else "")


def cases(device: Device, quick: bool = False) -> list[ModelCase]:
    """The suite on ``device``: float16 and ResNet-50 at batch 32 on accelerators, float32 and
    batch 4 elsewhere; ``quick``: small sizes, to check that it runs."""
    accelerator = device.provider.accelerator
    dtype = "float16" if accelerator else "float32"
    if quick:
        block = {"batch": 1, "seq": 32, "d_model": 64, "heads": 2}
        resnet = {"batch": 1, "size": 32}
    else:
        block = {"batch": 8, "seq": 1024, "d_model": 768, "heads": 12}
        resnet = {"batch": 32 if accelerator else 4, "size": 224}
    out = [ModelCase("transformer_block", dtype, block), ModelCase("resnet50", dtype, resnet, ("torch", "onnx"))]
    if accelerator:  # the block replayed as a device graph (opr.capture), against the same eager peers (ResNet-50's
        # convolutions call cuBLAS through CuPy, which refuses stream capture)
        out.append(ModelCase("transformer_block", dtype, block, captured=True))
    return out


def load(model: str) -> ModuleType:
    """The example module ``examples/<model>.py`` (imported once; it needs torch)."""
    name = f"opruntime_example_{model}"
    if name in sys.modules:
        return sys.modules[name]
    path = EXAMPLES / f"{model}.py"
    if not path.is_file():
        raise FileNotFoundError(f"the models suite builds its models from the repository's examples, and {path} "
                                f"is missing: run it from a checkout (pip install -e .)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def run_case(case: ModelCase, device: Device, *, repeats: int = 15, peers: Sequence[str] | None = None) -> Result:
    """Time one model on one device against its peers (``peers`` limits the libraries; default:
    the case's); check opruntime's output against PyTorch float32 after the timing."""
    res = Result(case.model, case.label, case.dtype, device.name, unit="GFLOP/s")
    prov = device.provider
    try:
        if importlib.util.find_spec("torch") is None:
            raise ModuleNotFoundError("the models suite needs torch (pip install 'opruntime[models]')")
        example = load(case.model)
        built = example.build(device, case.dtype, **case.sizes)
        x = tensor(built.x, device=device, dtype=case.dtype)
        last: list[Any] = [built.ours(x)]  # plans every operator before the timing
        first = last[0].numpy()
        with trace() as t:
            built.ours(x)
        res.kernel = f"{len(t.events)} operator calls"
        res.flops = forward_flops(built.module, built.x.shape)

        forward = capture(built.ours) if case.captured else built.ours

        def ours() -> None:
            last[0] = forward(x)

        contenders: dict[str, Timed] = {"opruntime": (ours, lambda: prov.wait(last[0].data))}
        at = peer_libraries.where(device, last[0].data)
        for lib in case.peers:
            if peers is not None and lib not in peers:
                continue
            try:
                timed = PEERS[lib](built, case, at)
            except Exception as exc:  # a peer that cannot run here is left out, with the reason
                print(f"  peer {lib}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            if timed is not None:
                contenders[f"peer:{lib}"] = timed
    except Exception as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    samples, errors = measure_rounds(contenders, repeats, idle=settle(prov))
    if "opruntime" in errors:
        res.error = errors["opruntime"]
        return res
    for name, err in errors.items():
        print(f"  {name}: {err}", file=sys.stderr)
    ours_s = samples["opruntime"]
    res.time_s = statistics.median(ours_s)
    for name, s in samples.items():
        if name.startswith("peer:"):
            res.peers[name[5:]] = statistics.median(s)
            res.peer_ratios[name[5:]] = paired_ratio(s, ours_s)
    res.rate = res.flops / res.time_s / 1e9
    res.error = check(example, built, case.dtype, at, first, last[0].numpy())
    return res


def check(example: ModuleType, built: Any, dtype: str, at: peer_libraries.Where, first: np.ndarray,
          final: np.ndarray) -> str:
    """Why the timed forward passes cannot be trusted, or "": the output after the timing must be
    the first one, and within the example's ``TOLERANCE[dtype]`` of PyTorch float32 (run where
    the peer runs: the CUDA device, else the CPU)."""
    import torch

    tol = example.TOLERANCE[dtype]
    drift = example.relative_error(final, first)
    if not drift <= tol:
        return f"wrong result: the output after the timing differs from the first by {drift:.1e} (relative)"
    target = f"cuda:{at.cuda}" if at.cuda is not None and torch.cuda.is_available() else "cpu"
    with _no_tf32(torch):
        module = copy.deepcopy(built.module).to(target)
        with torch.inference_mode():
            ref = module(torch.from_numpy(built.x).to(target)).double().cpu().numpy()
    err = example.relative_error(first, ref)
    if not err <= tol:
        return f"wrong result: {err:.1e} from PyTorch float32 (relative: max abs error / max abs; tolerance {tol:g})"
    return ""


@contextlib.contextmanager
def _no_tf32(torch: Any) -> Any:
    """float32 matmuls and convolutions in float32 on CUDA (TF32 off) within the block."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def forward_flops(module: Any, shape: Sequence[int]) -> float:
    """Floating-point operations of one forward pass on input of ``shape``, as
    ``torch.utils.flop_counter`` counts them (matmuls, convolutions, attention), on meta tensors
    (nothing is computed)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(module).to("meta")
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        meta(torch.empty(tuple(shape), device="meta"))
    return float(counter.get_total_flops())


# -- the peers -------------------------------------------------------------------------------------
def _torch_peer(built: Any, case: ModelCase, at: peer_libraries.Where) -> Timed | None:
    """The example's torch module, eager, where the device's data lives, in the case's dtype."""
    import torch

    if at.host:
        target, sync = "cpu", _no_sync
    elif at.cuda is not None and torch.cuda.is_available():
        target, sync = f"cuda:{at.cuda}", functools.partial(torch.cuda.synchronize, at.cuda)
    else:
        return None
    dtype = getattr(torch, case.dtype)
    module = copy.deepcopy(built.module).to(target, dtype)
    x = torch.from_numpy(built.x).to(target, dtype)

    @torch.inference_mode()
    def call() -> None:
        if dtype == torch.float32:
            with _no_tf32(torch):  # float32 against float32
                module(x)
        else:
            module(x)

    return call, sync


def _onnx_peer(built: Any, case: ModelCase, at: peer_libraries.Where) -> Timed | None:
    """The torch module exported with ``torch.onnx.export`` (opset 17), run by ONNX Runtime on
    the CPU in float32."""
    if not at.host or importlib.util.find_spec("onnxruntime") is None:
        return None
    if case.dtype != "float32":
        raise peer_libraries.NotApplicable(f"ONNX Runtime's CPU peer runs float32, not {case.dtype}")
    import onnxruntime
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(built.module, (torch.from_numpy(built.x),), buffer, dynamo=False,
                          opset_version=peer_libraries.ONNX_OPSET, input_names=["x"], output_names=["y"])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads yield the cores
    session = onnxruntime.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    feeds = {"x": built.x}
    session.run(None, feeds)
    return functools.partial(session.run, None, feeds), _no_sync


def _no_sync() -> None:
    return None


#: library -> how it runs a built model (None: not where the device's data lives)
PEERS: Mapping[str, Callable[[Any, ModelCase, peer_libraries.Where], Timed | None]] = {
    "torch": _torch_peer,
    "onnx": _onnx_peer,
}


def run_suite(devices: Sequence[Device], *, quick: bool = False, repeats: int = 15,
              peers: Sequence[str] | None = None,
              progress: Callable[[int, str], None] | None = None) -> list[Result]:
    """Every model case on every device; ``progress(i, label)`` is told before each."""
    jobs = [(c, d) for d in devices for c in cases(d, quick)]
    results = []
    for i, (case, dev) in enumerate(jobs):
        if progress is not None:
            progress(i, f"{case.model} {case.label} {case.dtype} on {dev.name}")
        results.append(run_case(case, dev, repeats=repeats, peers=peers))
    return results


def count(devices: Sequence[Device], quick: bool = False) -> int:
    """How many results :func:`run_suite` gives."""
    return sum(len(cases(d, quick)) for d in devices)
