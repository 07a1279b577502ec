"""The demo plugin's own tests: every kernel against opruntime's float64 references.

Run after installing the package (``pip install -e .``): the plugin must be found through its
entry point, exactly as users will get it.
"""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.ops import OPS
from opruntime.plugins import registry
from opruntime.testing.numerics import TOLERANCE, rel_err


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()  # fresh inputs every run


def test_loaded_through_its_entry_point() -> None:
    rec = registry().records["demo"]
    assert rec.status == "ok", rec.reason
    assert rec.devices == ["demo:0"]
    assert "demo.softmax.threaded" in registry().kernels


def test_data_stays_in_demo_memory(rng: np.random.Generator) -> None:
    from opruntime_demo import DemoArray

    x = opr.tensor(rng.standard_normal((3, 5)).astype(np.float32), device="demo:0")
    assert isinstance(x.data, DemoArray) and x.device == "demo:0"
    y = opr.softmax(x)
    assert isinstance(y.data, DemoArray) and y.device == "demo:0"
    assert opr.explain("softmax", x).chosen == "demo.softmax.fused"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shapes", [((7, 13), (13, 5)), ((1, 1), (1, 1)), ((2, 3, 33, 17), (3, 17, 9)),
                                    ((4, 1, 5, 6), (1, 3, 6, 2)), ((65,), (65, 3))])
def test_matmul(rng: np.random.Generator, shapes, dtype: str) -> None:
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    out = opr.matmul(a, b, device="demo:0")
    assert out.device == "demo:0" and out.dtype == dtype
    assert rel_err(out.numpy(), OPS["matmul"].reference(a, b)) < TOLERANCE[dtype]


def test_matmul_strided(rng: np.random.Generator) -> None:
    a = rng.standard_normal((40, 30)).astype(np.float32)
    b = rng.standard_normal((50, 30)).astype(np.float32)
    bt = opr.tensor(b.T, device="demo:0")  # a transposed (strided) operand
    assert bt.data.strides != (50 * 4, 4)
    out = opr.matmul(opr.tensor(a, device="demo:0"), bt)
    assert rel_err(out.numpy(), a.astype(np.float64) @ b.T) < 1e-5


CONV = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(1, 2), padding=(2, 0), dilation=(2, 1)),
    dict(padding="same", dilation=2),
    dict(groups=3, padding=1),
    dict(groups=6, stride=2),  # depthwise
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("attrs", CONV, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "plain")
@pytest.mark.parametrize("bias", [False, True])
def test_conv2d(rng: np.random.Generator, attrs: dict, bias: bool, dtype: str) -> None:
    groups = attrs.get("groups", 1)
    x = rng.standard_normal((2, 6, 11, 9)).astype(dtype)
    w = rng.standard_normal((6, 6 // groups, 3, 3)).astype(dtype)
    b = rng.standard_normal(6).astype(dtype) if bias else None
    out = opr.conv2d(x, w, b, device="demo:0", **attrs)
    ref = OPS["conv2d"].reference(x, w, b, **attrs)
    assert rel_err(out.numpy(), ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,axis", [((5, 37), -1), ((4, 9, 3), 1), ((1,), 0), ((6, 1), -1)])
def test_softmax_demo(rng: np.random.Generator, op: str, shape, axis: int) -> None:
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    out = getattr(opr, op)(x, axis=axis, device="demo:0")
    assert rel_err(out.numpy(), OPS[op].reference(x, axis=axis)) < 1e-5


@pytest.mark.parametrize("config", [c["block_bytes"] for c in __import__("opruntime_demo.softmax").softmax.BLOCKS])
@pytest.mark.parametrize("shape", [(1000, 257), (3, 4, 129), (1, 5)])
def test_threaded_cpu_softmax(rng: np.random.Generator, shape, config: int) -> None:
    kernel = registry().kernels["demo.softmax.threaded"]
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    plan = OPS["softmax"].plan([x], opr.Device("cpu"), {"axis": -1}, __import__("opruntime.config").config.settings())
    assert kernel.supports(plan.problem)
    out = kernel(plan.problem, {"block_bytes": config}, x)
    assert rel_err(out, OPS["softmax"].reference(x)) < 1e-5


def test_threaded_cpu_softmax_is_chosen_only_where_it_should_win(rng: np.random.Generator) -> None:
    """The demo's kernel is ranked by its cost estimate against the built-in ones (NumPy's, and
    numba's where it is installed): chosen exactly where its estimate is the lowest."""
    small = np.ones((8, 16), np.float32)
    large = np.ones((8192, 1024), np.float32)  # 32 MiB: many blocks
    for x in (small, large):
        ex = opr.explain("softmax", x, device="cpu")
        ok = [c for c in ex.candidates if c.status == "ok"]
        best = min(ok, key=lambda c: c.cost)
        assert ex.chosen == best.label
    assert not opr.explain("softmax", small, device="cpu").chosen.startswith("demo.")  # threads do not pay
    # a non-last axis is declined, and a built-in kernel runs instead
    ex = opr.explain("softmax", large, axis=0, device="cpu")
    assert ex.chosen.startswith("numpy.softmax.")
    assert any(c.kernel.name.startswith("demo.softmax.threaded") and c.status != "ok" for c in ex.candidates)


def test_threaded_cpu_softmax_through_the_operator(rng: np.random.Generator) -> None:
    x = (3 * rng.standard_normal((4096, 1024))).astype(np.float32)
    out = opr.softmax(x, device="cpu")
    assert rel_err(out.numpy(), OPS["softmax"].reference(x)) < 1e-5
