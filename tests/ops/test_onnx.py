"""ONNX node tests as an outside conformance reference, on every device present.

Two sources, both ONNX's own:

* the node test cases of MatMul, Conv, Softmax and LogSoftmax, generated in this run by ONNX's
  case scripts (``onnx.backend.test.case.node``: the same ``expect`` calls that
  ``collect_testcases()`` runs; we import just these four case modules, ~1 s instead of ~10 s);
* the single-node models with data that the onnx wheel ships (``backend/test/data/pytorch-*``):
  opset-6 Conv (1-D, 2-D; 3-D is out of scope) and Softmax / LogSoftmax with the pre-opset-13
  "flatten to 2-D" semantics.

Each model is run by a small mapping onto opruntime (below) and compared the way ONNX's backend
test runner does (``rtol`` / ``atol`` of the case: 1e-3 / 1e-7). A case opruntime cannot express
is skipped with its reason; a test prints the pass count per device and asserts that every
applicable case passes.
"""

# ruff: noqa: BLE001 - whatever a plugin (or a thread) raises is reported, never let through

from __future__ import annotations

import functools
import glob
import importlib
import math
import os
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import dtypes_on

import opruntime as opr

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper

OPS = {"MatMul": "matmul", "Conv": "conv2d", "Softmax": "softmax", "LogSoftmax": "log_softmax"}
CASE_MODULES = ("matmul", "conv", "softmax", "logsoftmax")


@dataclass
class NodeCase:
    name: str
    model: object  # onnx.ModelProto
    inputs: list[np.ndarray]
    expected: np.ndarray
    rtol: float = 1e-3
    atol: float = 1e-7

    @property
    def node(self):
        return self.model.graph.node[0]

    @property
    def opset(self) -> int:
        return next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 1)


@functools.cache
def generated_cases() -> tuple[NodeCase, ...]:
    from onnx.backend.test.case import node as node_cases

    try:
        for name in CASE_MODULES:
            importlib.import_module(f"{node_cases.__name__}.{name}")
        found = list(node_cases._NodeTestCases)
    except (ImportError, AttributeError):  # another onnx layout: the whole collection
        found = list(node_cases.collect_testcases())
    ours = {c.name for c in found if c.model is not None and [n.op_type for n in c.model.graph.node] in
            [[op] for op in OPS]}
    out = []
    for c in found:  # the single-node cases, and their function-expanded twins (counted as not applicable)
        if c.name.split("_expanded")[0] not in ours:
            continue
        (inputs, outputs), = c.data_sets
        out.append(NodeCase(c.name, c.model, [np.asarray(x) for x in inputs], np.asarray(outputs[0]), c.rtol, c.atol))
    return tuple(out)


@functools.cache
def shipped_cases() -> tuple[NodeCase, ...]:
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    out = []
    for d in sorted(glob.glob(os.path.join(root, "pytorch-*", "test_*"))):
        model = onnx.load(os.path.join(d, "model.onnx"))
        if not any(n.op_type in OPS for n in model.graph.node):
            continue
        sets = sorted(glob.glob(os.path.join(d, "test_data_set_*")))
        if not sets:
            continue

        def load(pattern, s=sets[0]):
            return [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(s, pattern)))]

        inputs = load("input_*.pb")
        init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        fed = [i.name for i in model.graph.input if i.name not in init]
        named = dict(zip(fed, inputs)) | init
        node = model.graph.node[-1]
        out.append(NodeCase(os.path.basename(d), model, [named.get(n) for n in node.input if n], load("output_*.pb")[0]))
    return tuple(out)


def all_cases() -> list[NodeCase]:
    return [*generated_cases(), *shipped_cases()]


# -- mapping one ONNX node onto opruntime ---------------------------------------------------------------------
class NotApplicable(Exception):
    """The case is outside what opruntime's operators express (the reason is the message)."""


def run_node(case: NodeCase, device: opr.Device) -> np.ndarray:
    graph = case.model.graph
    if len(graph.node) != 1:
        raise NotApplicable(f"a {len(graph.node)}-node graph ({', '.join(sorted({n.op_type for n in graph.node}))}), "
                            "not one operator")
    node = case.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    xs = case.inputs
    for x in xs:
        if x is None or x.dtype.kind != "f":
            raise NotApplicable(f"non-float input ({None if x is None else x.dtype})")
        if x.dtype.name not in dtypes_on(device, OPS[node.op_type]):
            raise NotApplicable(f"no {OPS[node.op_type]} kernel computes {x.dtype.name} on {device.name}")
    if node.op_type == "MatMul":
        return opr.matmul(*xs, device=device).numpy()
    if node.op_type in ("Softmax", "LogSoftmax"):
        return _softmax(case, node.op_type, xs[0], attrs, device)
    return _conv(xs, attrs, device)


def _softmax(case: NodeCase, op_type: str, x: np.ndarray, attrs: dict, device: opr.Device) -> np.ndarray:
    fn = opr.softmax if op_type == "Softmax" else opr.log_softmax
    if case.opset >= 13:  # one axis (default -1)
        return fn(x, axis=attrs.get("axis", -1), device=device).numpy()
    # opset < 13: the input is coerced to 2-D at ``axis`` (default 1) and normalised over the
    # flattened trailing dims
    axis = attrs.get("axis", 1) % max(x.ndim, 1)
    flat = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return fn(flat, axis=1, device=device).numpy().reshape(x.shape)


def _conv(xs: list[np.ndarray], attrs: dict, device: opr.Device) -> np.ndarray:
    x, w, *b = xs
    spatial = x.ndim - 2
    if spatial not in (1, 2):
        raise NotApplicable(f"{spatial}-D convolution: opruntime has conv2d")
    if spatial == 1:  # Conv1d is conv2d over a height of 1
        x, w = x[:, :, None, :], w[:, :, None, :]
    strides = list(attrs.get("strides", [1] * spatial))
    dilations = list(attrs.get("dilations", [1] * spatial))
    pads = list(attrs.get("pads", [0] * 2 * spatial))
    if spatial == 1:
        strides, dilations, pads = [1, *strides], [1, *dilations], [0, pads[0], 0, pads[1]]
    kernel = w.shape[2:]
    if "kernel_shape" in attrs and list(attrs["kernel_shape"]) != list(kernel[-spatial:]):
        raise NotApplicable(f"kernel_shape {attrs['kernel_shape']} differs from the weight's {kernel}")
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        pads = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    top, left, bottom, right = pads
    if (top, left) != (bottom, right):  # opruntime pads symmetrically: pad the rest with zeros first
        x = np.pad(x, ((0, 0), (0, 0), (top - min(top, bottom), bottom - min(top, bottom)),
                       (left - min(left, right), right - min(left, right))))
        top, left = min(top, bottom), min(left, right)
    out = opr.conv2d(x, w, b[0] if b else None, stride=tuple(strides), padding=(top, left),
                     dilation=tuple(dilations), groups=attrs.get("group", 1), device=device).numpy()
    return out[:, :, 0, :] if spatial == 1 else out


# -- the tests ---------------------------------------------------------------------------------------------------
def run_all(device: opr.Device) -> tuple[list[str], list[str], dict[str, str]]:
    passed, failed, skipped = [], [], {}
    for case in all_cases():
        try:
            got = run_node(case, device)
        except NotApplicable as why:
            skipped[case.name] = str(why)
            continue
        except Exception as exc:
            failed.append(f"{case.name}: {type(exc).__name__}: {exc}")
            continue
        try:
            assert got.dtype == case.expected.dtype, f"dtype {got.dtype} != {case.expected.dtype}"
            np.testing.assert_allclose(got, case.expected, rtol=case.rtol, atol=case.atol)
            passed.append(case.name)
        except AssertionError as exc:
            failed.append(f"{case.name}: {str(exc).strip()[:400]}")
    return passed, failed, skipped


def test_onnx_cases_were_generated():
    names = {c.name for c in all_cases()}
    assert {"test_matmul_4d", "test_conv_with_autopad_same", "test_softmax_axis_0", "test_logsoftmax_large_number",
            "test_Conv2d_depthwise_with_multiplier", "test_softmax_functional_dim3"} <= names
    ops = {c.node.op_type for c in all_cases() if len(c.model.graph.node) == 1}
    assert ops == set(OPS), ops


_results: dict[str, tuple[list[str], list[str], dict[str, str]]] = {}


def results(device: opr.Device) -> tuple[list[str], list[str], dict[str, str]]:
    if device.name not in _results:
        _results[device.name] = run_all(device)
    return _results[device.name]


def test_onnx_node_tests(device, capsys):
    passed, failed, skipped = results(device)
    applicable = len(passed) + len(failed)
    with capsys.disabled():
        print(f"\nONNX node tests on {device.name}: {len(passed)}/{applicable} applicable cases passed "
              f"({len(skipped)} not applicable)")
    reasons = sorted(set(skipped.values()))
    assert applicable >= 50, f"only {applicable} applicable cases; skipped for: {reasons}"
    assert not failed, f"{len(failed)} of {applicable} ONNX node tests failed on {device.name}:\n" + "\n".join(failed)


def test_not_applicable_cases_are_real_limits(device):
    """Skipped only for a real limit (3-D conv, a graph of several nodes, a dtype the device lacks),
    never an operator case opruntime should run."""
    for name, why in results(device)[2].items():
        assert any(r in why for r in ("3-D convolution", "-node graph", "kernel computes")), f"{name}: {why}"


def test_flatten_semantics_of_old_softmax_differ_from_the_axis_semantics():
    """The mapping is not vacuous: an opset-6 softmax over axis 3 of a 4-D input equals the
    one-axis form (the last axis), while axis 1 normalises over three flattened dims."""
    case = next(c for c in shipped_cases() if c.name == "test_softmax_functional_dim3")
    x = case.inputs[0]
    assert case.opset < 13
    np.testing.assert_allclose(opr.softmax(x, axis=3, device="cpu").numpy(), case.expected, rtol=1e-5)
    old = _softmax(case, "Softmax", x, {"axis": 1}, opr.Device("cpu"))
    assert old.reshape(2, -1).sum(axis=1) == pytest.approx([1, 1], rel=1e-5)
