"""Operators are units: each ``opruntime/ops/<name>.py`` carries everything about its operator
(reference, cases, empty cases, quick picks, bench shapes, peers, bound, public function), every
entry of ``OPS`` is complete (:func:`unit_problems`, which fails for an operator missing any of
it), and adding an operator is that one file plus kernels: everything else (the public function,
``opruntime.<name>``, the configuration's ``[ops.<name>]``, the conformance tables and checks,
the bench suites) derives from the Operator."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opruntime
import opruntime as opr
from opruntime.errors import AttributeValueError
from opruntime.ops import FUNCTIONS, OPS, Case, Operator
from opruntime.plugins import registry
from opruntime.testing import CASES, EMPTY, QUICK_CASES, check_kernel, failures, summary

ROOT = Path(__file__).resolve().parents[2]


def unit_problems(op: Operator, functions: Mapping[str, Callable[..., Any]] | None = None,
                  module: Any = None) -> list[str]:
    """What ``op`` lacks to be a complete operator unit (empty: nothing)."""
    functions = FUNCTIONS if functions is None else functions
    module = opruntime if module is None else module
    out = []
    if type(op).reference is Operator.reference:
        out.append("reference: the base's")
    cases = list(op.cases)
    if not cases:
        out.append("cases: none")
    else:
        dims = [n for c in cases for s in c.shapes for n in s]
        if not any(n > 1 and n % 2 for n in dims):
            out.append("cases: no odd size")
        if 1 not in dims:
            out.append("cases: no size-1 dim")
        if not any(v for c in cases for v in c.views):
            out.append("cases: no non-contiguous view")
        if any(c.op != op.name for c in cases):
            out.append("cases: not named after the operator")
        try:  # the reference answers the first case, in float64, in the operator's result shape
            rng = np.random.default_rng(0)
            first = cases[0]
            ref = op.reference(*[rng.standard_normal(s) for s in first.shapes], **first.attrs)
            want = op.normalize([tuple(s) for s in first.shapes], dict(first.attrs)).result_shape
            if np.shape(ref) != want or np.asarray(ref).dtype != np.float64:
                out.append(f"reference: gives {np.shape(ref)} {np.asarray(ref).dtype} for {first.id}, not {want} float64")
        except Exception as exc:  # noqa: BLE001 - reported as the operator's problem
            out.append(f"reference: raised {type(exc).__name__}: {exc}")
    if not op.empty:
        out.append("empty: none")
    elif not all(math.prod(op.normalize([tuple(s) for s in c.shapes], dict(c.attrs)).out_shape) == 0
                 or op.normalize([tuple(s) for s in c.shapes], dict(c.attrs)).trivial for c in op.empty):
        out.append("empty: a case with something to compute")
    if not op.quick or not all(isinstance(i, int) and 0 <= i < len(cases) for i in op.quick):
        out.append(f"quick: {tuple(op.quick)} are not indices of the {len(cases)} cases")
    if not any(op.bench.values()):
        out.append("bench: no shapes in any suite")
    if not op.peers:
        out.append("peers: none")
    if op.bound not in ("memory", "compute"):
        out.append(f"bound: {op.bound!r}, not 'memory' or 'compute'")
    fn = functions.get(op.name)
    if fn is None or getattr(fn, "operator", None) is not op:
        out.append("function: not in opruntime.ops.FUNCTIONS")
    elif getattr(module, op.name, None) is not fn:
        out.append(f"function: not opruntime.{op.name}")
    elif not (fn.__doc__ or "").strip() or fn.__name__ != op.name:
        out.append("function: no docstring")
    if not registry().kernels_for(op.name, "cpu"):
        out.append("kernels: none on cpu")
    return out


@pytest.mark.parametrize("name", list(OPS))
def test_every_operator_is_a_complete_unit(name):
    assert unit_problems(OPS[name]) == []


def test_the_tables_are_read_from_the_operators():
    for name, op in OPS.items():
        assert CASES[name] == list(op.cases) and EMPTY[name] == list(op.empty)
        assert QUICK_CASES[name] == [op.cases[i] for i in op.quick]
        assert FUNCTIONS[name].operator is op and getattr(opr, name) is FUNCTIONS[name] and name in opr.__all__
    assert set(opruntime.config.OPERATORS) == set(OPS)


# -- a throwaway operator, complete, then missing one thing at a time ------------------------------------------
SCALE_MODULE = textwrap.dedent('''
    """scale: ``alpha * x`` (a test's operator, written as a new operator file is)."""

    from __future__ import annotations

    import math
    from typing import Any

    import numpy as np

    from ..errors import AttributeValueError, UnknownAttributeError
    from ..kernels import Attrs
    from ..tensor import Tensor
    from .base import Case, Normalized, Operator


    class Scale(Operator):
        name = "scale"
        operands = ("x",)
        bound = "memory"
        cases = [Case(((7, 1),), {"alpha": 2.0}), Case(((3, 5),), {"alpha": -1.5}, views=("T",)),
                 Case(((1,),), {"alpha": 0.5}), Case(((2, 6),), {"alpha": 3.0}, views=("slice",))]
        quick = (0, 1)
        empty = [Case(((0, 3),), {"alpha": 2.0})]
        bench = {"cpu": [Case(((1024, 1024),), {"alpha": 2.0})], "overhead": [Case(((16,),), {"alpha": 2.0})]}
        peers = {"numpy": lambda np, x, alpha=1.0: alpha * x}

        def normalize(self, shapes, attrs):
            (shape,) = shapes
            alpha = attrs.pop("alpha", 1.0)
            if attrs:
                raise UnknownAttributeError(f"scale() got unexpected keyword argument(s) {', '.join(attrs)}")
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
                raise AttributeValueError(f"scale: alpha must be a number, got {alpha!r}")
            trivial = "empty" if math.prod(shape) == 0 else None
            return Normalized((shape,), Attrs(alpha=float(alpha)), shape, shape, trivial)

        def reference(self, x, alpha=1.0):
            return np.asarray(x, np.float64) * alpha


    SCALE = Scale()


    @SCALE.function
    def scale(x: Any, alpha: float = 1.0, *, device: Any = None) -> Tensor:
        """``alpha * x``, elementwise."""
''')

def _scale_module() -> types.ModuleType:
    """:data:`SCALE_MODULE` run as a module of ``opruntime.ops`` (its relative imports resolve),
    without adding it to the package: the in-process tests' operator is the new file's."""
    module = types.ModuleType("opruntime.ops.scale")
    module.__package__ = "opruntime.ops"
    exec(compile(SCALE_MODULE, "<opruntime/ops/scale.py>", "exec"), module.__dict__)
    return module


Scale = _scale_module().Scale


def _scale_stub(x: Any, alpha: float = 1.0, *, device: Any = None) -> opr.Tensor:
    """``alpha * x``, elementwise."""


def scale_run(problem, config, x):
    return (x * problem.attrs["alpha"]).astype(x.dtype)


@pytest.fixture
def scale(kernel_plugin, monkeypatch):
    """A complete throwaway operator: its function in FUNCTIONS and as ``opruntime.scale``, a cpu
    kernel registered by a tiny plugin, and (for the conformance checks) an entry in OPS."""
    def make(cls=Scale, kernel=True):
        op = cls()
        fn = op.function(_scale_stub)
        fn.__name__ = op.name
        monkeypatch.setitem(FUNCTIONS, op.name, fn)
        monkeypatch.setattr(opruntime, op.name, fn, raising=False)
        monkeypatch.setitem(OPS, op.name, op)
        if kernel:
            kernel_plugin("tiny", opr.Kernel(op.name, f"tiny.{op.name}.numpy", "cpu", opr.FLOATS, scale_run))
        return op, fn

    return make


def test_the_throwaway_operator_is_complete_and_works(scale, rng):
    op, fn = scale()
    assert unit_problems(op) == []
    x = rng.standard_normal((4, 3)).astype(np.float32)
    out = fn(x, alpha=2.0, device="cpu")
    assert isinstance(out, opr.Tensor) and out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), 2 * x, rtol=1e-6)
    with pytest.raises(AttributeValueError, match="alpha must be a number"):
        fn(x, alpha="2", device="cpu")
    assert opr.explain("scale", x, alpha=2.0, device="cpu").chosen == "tiny.scale.numpy"
    k = registry().kernels["tiny.scale.numpy"]  # the conformance suite reads the operator's own cases
    findings = check_kernel(k, opr.Device("cpu"), op.cases)
    assert not failures(findings), summary(findings)
    assert len([f for f in findings if not f.failed]) == 0


def _without(**changes):
    return type("Lacking", (Scale,), changes)


@pytest.mark.parametrize("changes,problem", [
    ({"cases": []}, "cases: none"),
    ({"cases": [Case(((4, 1),), {"alpha": 2.0}, views=("T",))], "quick": (0,)}, "cases: no odd size"),
    ({"cases": [Case(((3, 5),), {"alpha": 2.0}, views=("T",))], "quick": (0,)}, "cases: no size-1 dim"),
    ({"cases": [Case(((3, 1),), {"alpha": 2.0})], "quick": (0,)}, "cases: no non-contiguous view"),
    ({"empty": []}, "empty: none"),
    ({"empty": [Case(((2, 3),), {"alpha": 2.0})]}, "empty: a case with something to compute"),
    ({"quick": (0, 9)}, "quick: (0, 9) are not indices"),
    ({"quick": ()}, "quick: () are not indices"),
    ({"bench": {}}, "bench: no shapes in any suite"),
    ({"bench": {"cpu": []}}, "bench: no shapes in any suite"),
    ({"peers": {}}, "peers: none"),
    ({"bound": "latency"}, "bound: 'latency'"),
    ({"reference": lambda self, x, alpha=1.0: np.asarray(x, np.float32)}, "reference: gives"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_the_check_fails_for_an_operator_lacking_a_part(scale, changes, problem):
    op, _ = scale(_without(**changes))
    found = unit_problems(op)
    if problem == "cases: none":  # no case is then also no valid quick pick
        assert found == ["cases: none", "quick: (0, 1) are not indices of the 0 cases"]
    else:
        assert len(found) == 1 and found[0].startswith(problem), found


def test_the_check_fails_for_the_base_reference_a_missing_function_or_kernel(scale, monkeypatch):
    op, fn = scale(kernel=False)
    assert unit_problems(op) == ["kernels: none on cpu"]
    assert "function: not in opruntime.ops.FUNCTIONS" in unit_problems(op, functions={})
    assert "function: not opruntime.scale" in unit_problems(op, module=object())
    monkeypatch.setattr(fn, "__doc__", None)
    assert "function: no docstring" in unit_problems(op)
    monkeypatch.setattr(Scale, "reference", Operator.reference)
    assert "reference: the base's" in unit_problems(op)


def test_attribute_types_key_the_throwaway_operator_too(scale, rng):
    """``alpha: float`` in the stub: 2 and 2.0 are two plan-cache keys, each validated."""
    op, fn = scale()
    x = opr.tensor(rng.standard_normal(3).astype(np.float32), device="cpu")
    assert op.attr_key({"alpha": 2}) != op.attr_key({"alpha": 2.0})
    np.testing.assert_allclose(fn(x, alpha=2).numpy(), fn(x, alpha=2.0).numpy())
    with pytest.raises(AttributeValueError):
        fn(x, alpha=True)


# -- a new operator is one file -----------------------------------------------------------------------------------
CHILD = textwrap.dedent('''
    import sys, types
    import numpy as np
    sys.path.insert(0, sys.argv[1])  # tests/ops: the completeness check
    import opruntime as opr
    assert opr.__file__.startswith(sys.argv[2]), opr.__file__  # the copy with the new file
    from opruntime.ops import FUNCTIONS, OPS
    from opruntime.testing import CASES, EMPTY, QUICK_CASES, check_frontend_edges, check_kernel, check_pinned, failures
    from opruntime.testing import summary

    kernel = opr.Kernel("scale", "tiny.scale.numpy", "cpu", opr.FLOATS,
                        lambda p, c, x: (x * p.attrs["alpha"]).astype(x.dtype), cost=lambda p, c: 1e-6)
    opr.register(types.SimpleNamespace(__name__="tiny", opruntime_kernels=opr.hookimpl(lambda: [kernel])))
    from test_operator_units import unit_problems
    assert unit_problems(OPS["scale"]) == [], unit_problems(OPS["scale"])
    assert FUNCTIONS["scale"] is opr.scale and "scale" in opr.__all__
    assert CASES["scale"] == OPS["scale"].cases and EMPTY["scale"] and len(QUICK_CASES["scale"]) == 2
    out = opr.scale(np.arange(3, dtype=np.float32), alpha=2.0)
    assert out.numpy().tolist() == [0.0, 2.0, 4.0] and out.device.name == "cpu"
    cpu, k = opr.Device("cpu"), opr.registry().kernels["tiny.scale.numpy"]
    bad = failures(check_kernel(k, cpu) + check_pinned(k, cpu) + check_frontend_edges(cpu, "scale"))
    assert not bad, summary(bad)
    opr.configure(ops={"scale": {"kernel": "tiny.scale.numpy"}})  # the configuration knows it
    assert "pinned by configure()" in opr.explain("scale", np.ones(3, np.float32), alpha=3.0).why
    from opruntime.tools import bench
    assert [c.op for c in bench.suites()["overhead"]].count("scale") == 1  # the bench reads it too
    print("ok")
''')


def test_a_new_operator_is_one_file(tmp_path):
    """A copy of the package with one new file, ``opruntime/ops/scale.py``, and a tiny plugin
    registering its cpu kernel: ``opr.scale`` works, the completeness check passes, the
    conformance suite reads and passes its cases, the configuration and the bench know it. No
    other file of the copy is edited."""
    copy = tmp_path / "opruntime"
    shutil.copytree(ROOT / "opruntime", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "ops" / "scale.py").write_text(SCALE_MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPRUNTIME_")}
    env |= {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
            "OPRUNTIME_CACHE_DIR": str(tmp_path / "cache"), "OPRUNTIME_PLUGINS": "-opencl,-jax,-cupy"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent), str(copy)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (proc.stdout + proc.stderr)[-4000:]


def test_case_ids_and_labels():
    c = replace(Case(((7, 13), (13, 5)), {"stride": (2, 1)}, views=("T", None)), op="matmul")
    assert c.id == "(7,13)x(13,5)-stride=(2,1)-0T" and c.label == "7x13 x 13x5 stride=(2, 1)"
