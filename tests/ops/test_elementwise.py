"""The elementwise operators' own semantics, on every device present: broadcasting and its error,
weak Python scalars (float16 stays float16), bool and integer operands refused, IEEE division by
zero, NaN propagation, the sign of zero under ``neg``, gelu's two approximations, the binary
operators' fused ``activation=`` (validated as linear's; against torch), every kernel
path (vector, broadcast, strided) against the float64 reference, and the CUDA launcher
``binary_act`` (GPU only). The conformance suite covers the operators' cases on every kernel."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err, skip_unless_dtype

import opruntime as opr
from opruntime.errors import AttributeValueError, DtypeError, ShapeError, UnknownAttributeError
from opruntime.ops import OPS
from opruntime.ops.elementwise import BINARY_OPS, UNARY_OPS, layout

ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _ref(op: str, *xs: np.ndarray, **attrs) -> np.ndarray:
    return OPS[op].reference(*[np.asarray(x, np.float64) for x in xs], **attrs)


# -- errors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", BINARY_OPS)
def test_shapes_that_do_not_broadcast_name_both(op):
    with pytest.raises(ShapeError, match=r"\(3, 4\) and \(5,\) do not broadcast: dim -1 is 4 in a and 5 in b"):
        getattr(opr, op)(np.ones((3, 4), np.float32), np.ones(5, np.float32), device="cpu")
    with pytest.raises(ShapeError, match=rf"{op}: shapes \(2, 3, 1\) and \(4, 1, 1\)"):
        getattr(opr, op)(np.ones((2, 3, 1), np.float32), np.ones((4, 1, 1), np.float32), device="cpu")


@pytest.mark.parametrize("op", ["add", "mul", "div"])
def test_bool_and_integer_operands_are_refused(op):
    x = np.ones(3, np.float32)
    fn = getattr(opr, op)
    with pytest.raises(DtypeError, match=rf"{op}: operand b is a bool \(True\).*{op}\(x, 1.0\)"):
        fn(x, True, device="cpu")
    with pytest.raises(DtypeError, match=rf"{op}: dtype bool is not supported"):
        fn(x, np.bool_(False), device="cpu")
    with pytest.raises(DtypeError, match=rf"{op}: operand a is a bool"):
        fn(False, x, device="cpu")
    with pytest.raises(DtypeError, match=rf"{op}: dtype int64 is not supported"):
        fn(x, np.arange(3), device="cpu")
    with pytest.raises(DtypeError, match=rf"{op}: dtype int32 is not supported"):
        fn(np.arange(3, dtype=np.int32), 2.0, device="cpu")
    with pytest.raises(DtypeError, match=r"relu: dtype int64"):
        opr.relu(np.arange(3), device="cpu")


def test_attributes_are_checked():
    x = np.ones(3, np.float32)
    with pytest.raises(AttributeValueError, match=r"gelu: approximate must be 'none' or 'tanh'.*'erf'"):
        opr.gelu(x, approximate="erf", device="cpu")
    with pytest.raises(AttributeValueError, match="approximate must be"):
        opr.gelu(x, approximate=True, device="cpu")
    with pytest.raises(UnknownAttributeError, match=r"add\(\) got unexpected keyword argument\(s\) alpha"):
        OPS["add"](x, x, alpha=2.0, device="cpu")
    with pytest.raises(UnknownAttributeError, match=r"silu\(\) got unexpected keyword argument\(s\) inplace"):
        OPS["silu"](x, inplace=True, device="cpu")


@pytest.mark.parametrize("op", BINARY_OPS)
def test_activation_is_validated_as_linears(op):
    """The binary operators' ``activation=`` takes exactly what linear's and conv2d's take, with
    the same typed error; it is keyword-only."""
    x = np.ones(3, np.float32)
    fn = getattr(opr, op)
    for bad in ("tanh", "sigmoid", "Relu", 1, True):
        with pytest.raises(AttributeValueError, match=rf"{op}: activation must be None or one of 'relu', 'gelu', "
                                                      rf"'gelu_tanh', 'silu'; got {bad!r}"):
            fn(x, x, activation=bad, device="cpu")
        with pytest.raises(AttributeValueError, match="linear: activation must be None or one of 'relu', 'gelu', "
                                                      "'gelu_tanh', 'silu'"):
            opr.linear(x, np.ones((2, 3), np.float32), activation=bad, device="cpu")
    with pytest.raises(TypeError):
        fn(x, x, "relu", device="cpu")  # keyword-only
    with pytest.raises(UnknownAttributeError, match=rf"{op}\(\) got unexpected keyword argument\(s\) alpha; "
                                                    r"it takes activation"):
        OPS[op](x, x, alpha=2.0, device="cpu")


# -- semantics on every device --------------------------------------------------------------------------

@pytest.mark.parametrize("op", BINARY_OPS)
def test_python_scalars_are_weak(device, op):
    skip_unless_dtype(device, op, "float16")
    fn = getattr(opr, op)
    x = np.array([[0.5, -1.25, 3.0]], np.float16)
    t = opr.tensor(x, device=device)
    for scalar in (2, 2.5, -3):
        for out, want in ((fn(t, scalar), ARITH[op](x, np.float16(scalar))),
                          (fn(scalar, t), ARITH[op](np.float16(scalar), x))):
            assert out.dtype == np.float16 and out.shape == (1, 3) and out.device == device
            np.testing.assert_array_equal(out.numpy(), want)  # float16 arithmetic, rounded once
    f32 = opr.tensor(x.astype(np.float32), device=device)
    assert fn(f32, 1e-3).dtype == np.float32  # a float scalar does not make it float64
    assert fn(x, 2).dtype == np.float16  # host arrays keep their dtype too
    strong = np.float64(2.0)  # a NumPy scalar is an array: ordinary promotion
    if "float64" in {d for k in opr.registry().kernels_for(op, device.kind) for d in k.dtypes}:
        assert fn(t, strong).dtype == np.float64


def test_a_scalar_out_of_float16_range_is_inf_as_torch(device):
    skip_unless_dtype(device, "add", "float16")
    t = opr.tensor(np.ones(2, np.float16), device=device)
    np.testing.assert_array_equal(opr.mul(t, 1e6).numpy(), np.array([np.inf, np.inf], np.float16))


def test_division_by_zero_follows_ieee(device):
    a = opr.tensor(np.array([1.0, -2.0, 0.0, np.inf, np.nan], np.float32), device=device)
    b = opr.tensor(np.array([0.0, 0.0, 0.0, 0.0, 0.0], np.float32), device=device)
    got = opr.div(a, b).numpy()
    np.testing.assert_array_equal(got, np.array([np.inf, -np.inf, np.nan, np.inf, np.nan], np.float32))
    neg = opr.div(opr.tensor(np.array([1.0], np.float32), device=device), -0.0).numpy()
    assert neg[0] == -np.inf


@pytest.mark.parametrize("op", [*BINARY_OPS, *UNARY_OPS])
def test_nan_propagates(device, op):
    x = np.array([np.nan, 1.5, -np.nan, -0.5, 0.0, 2.0, np.nan], np.float32)
    fn = getattr(opr, op)
    out = fn(opr.tensor(x, device=device), 1.5) if op in BINARY_OPS else fn(opr.tensor(x, device=device))
    got = out.numpy()
    assert np.array_equal(np.isnan(got), np.isnan(x)), got
    if op in BINARY_OPS:  # NaN in the second operand too, through the broadcast path
        got = fn(1.5, opr.tensor(x, device=device)).numpy()
        assert np.array_equal(np.isnan(got), np.isnan(x)), got


def test_neg_flips_the_sign_of_zero(device):
    x = opr.tensor(np.array([-0.0, 0.0, -1.0, np.inf], np.float32), device=device)
    got = opr.neg(x).numpy()
    np.testing.assert_array_equal(got, [0.0, -0.0, 1.0, -np.inf])
    assert list(np.signbit(got)) == [False, True, False, True]


def test_activations_at_the_specials(device):
    x = np.array([-np.inf, np.inf, 0.0, -30.0, 30.0], np.float32)
    t = opr.tensor(x, device=device)
    with np.errstate(all="ignore"):
        for op, attrs in (("relu", {}), ("silu", {}), ("sigmoid", {}), ("tanh", {}), ("gelu", {}),
                          ("gelu", {"approximate": "tanh"})):
            got = getattr(opr, op)(t, **attrs).numpy()
            ref = _ref(op, x, **attrs)
            assert np.array_equal(np.isnan(got), np.isnan(ref)), (op, attrs, got, ref)
            finite = np.isfinite(ref)
            np.testing.assert_array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
            np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-5, atol=1e-30, err_msg=f"{op} {attrs}")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch_and_keeps_the_tail(device, approximate):
    torch = pytest.importorskip("torch")
    x = np.linspace(-9.0, 6.0, 301).astype(np.float32)
    got = opr.gelu(opr.tensor(x, device=device), approximate=approximate).numpy()
    want = torch.nn.functional.gelu(torch.from_numpy(x.astype(np.float64)), approximate=approximate).numpy()
    np.testing.assert_allclose(got, _ref("gelu", x, approximate=approximate), rtol=1e-5, atol=0)  # the tail too
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert opr.gelu(x, device=device).numpy().tolist() == opr.gelu(x, approximate="none", device=device).numpy().tolist()


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("shapes", [((64, 33), (33,)), ((64, 32), (32,)), ((4, 6, 8, 8), (6, 1, 1)), ((5, 1), (5, 17)),
                                    ((), (9, 16)), ((3, 1, 16), (4, 16)), ((1, 1, 4099), (4099,))],
                         ids=lambda s: "x".join(map(str, s)).replace(" ", ""))
def test_broadcasting_against_the_reference(device, shapes, dtype, rng):
    skip_unless_dtype(device, "sub", dtype)
    a = rng.standard_normal(shapes[0]).astype(dtype)
    b = rng.standard_normal(shapes[1]).astype(dtype)
    for op in ("sub", "div"):
        bb = np.where(np.abs(b) < 0.5, 0.5, b).astype(dtype) if op == "div" else b
        for x, y in ((a, bb), (bb, a)) if op == "sub" else ((a, bb),):
            out = getattr(opr, op)(opr.tensor(x, device=device), opr.tensor(y, device=device))
            assert out.shape == np.broadcast_shapes(x.shape, y.shape) and out.dtype == np.dtype(dtype)
            assert rel_err(out.numpy(), _ref(op, x, y)) <= TOLERANCE[dtype]


def test_mixed_dtypes_promote(device):
    skip_unless_dtype(device, "add", "float16")
    a = opr.tensor(np.ones(4, np.float16), device=device)
    b = opr.tensor(np.full(4, 0.5, np.float32), device=device)
    out = opr.add(a, b)
    assert out.dtype == np.float32 and out.numpy().tolist() == [1.5] * 4


def test_strided_views_are_read_in_place(device, rng):
    x = rng.standard_normal((12, 20)).astype(np.float32)
    base = device.provider.from_host(np.ascontiguousarray(x.T))
    try:
        view = opr.Tensor._wrap(base.T, device)  # (12, 20), transposed strides
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no transposed views on {device.name}: {exc}")
    row = rng.standard_normal(20).astype(np.float32)
    np.testing.assert_allclose(opr.mul(view, row).numpy(), x * row, rtol=1e-6)
    np.testing.assert_allclose(opr.silu(view).numpy(), _ref("silu", x), rtol=1e-5)
    np.testing.assert_allclose(opr.add(view, view).numpy(), 2 * x, rtol=1e-6)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_fused_activation_matches_torch(device, act, rng):
    """``add(out, identity, activation=act)`` is ``act(out + identity)`` as torch computes it (the
    residual of a ResNet block), on every kernel path; each operator; NaN stays NaN."""
    torch = pytest.importorskip("torch")
    f = torch.nn.functional
    tact = (lambda y: f.gelu(y, approximate="tanh")) if act == "gelu_tanh" else getattr(f, act)
    out = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    for other in (rng.standard_normal((2, 6, 5, 7)), rng.standard_normal((6, 1, 1)), rng.standard_normal((5, 1))):
        other = np.where(np.abs(other) < 0.5, 0.5, other).astype(np.float32)  # divisors away from zero
        for op, tfn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div)):
            got = getattr(opr, op)(opr.tensor(out, device=device), opr.tensor(other, device=device), activation=act)
            assert got.shape == out.shape and got.dtype == np.float32
            want = tact(tfn(torch.from_numpy(out).double(), torch.from_numpy(other).double())).numpy()
            assert rel_err(got.numpy(), want) <= TOLERANCE["float32"], (op, act, other.shape)
    x = np.array([np.nan, 1.5, -2.0, 0.0], np.float32)
    got = opr.add(opr.tensor(x, device=device), 0.25, activation=act).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(x))


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_float16_activation_rounds_once(device, act, rng):
    """float16 operands: the sum is activated before its one rounding (not rounded, activated
    and rounded again), within the float16 tolerance of the float64 reference."""
    skip_unless_dtype(device, "add", "float16")
    a = rng.standard_normal((33, 65)).astype(np.float16)
    b = rng.standard_normal(65).astype(np.float16)
    got = opr.add(opr.tensor(a, device=device), opr.tensor(b, device=device), activation=act)
    assert got.dtype == np.float16
    assert rel_err(got.numpy(), _ref("add", a, b, activation=act)) <= TOLERANCE["float16"]


# -- the layout the CUDA and OpenCL kernels read -----------------------------------------------------------

def test_layout_picks_the_path():
    assert layout([(4, 5), (4, 5)], [(5, 1), (5, 1)], (4, 5)).path == "vector"
    assert layout([(1, 4, 5)], [(20, 5, 1)], (1, 4, 5)).path == "vector"  # size-1 dims say nothing
    row = layout([(4, 5), (5,)], [(5, 1), (1,)], (4, 5))
    assert (row.path, row.full, row.div, row.mod) == ("broadcast", 0, 1, 5)
    chan = layout([(2, 3, 4, 5), (3, 1, 1)], [(60, 20, 5, 1), (1, 1, 1)], (2, 3, 4, 5))
    assert (chan.path, chan.div, chan.mod) == ("broadcast", 20, 3)
    col = layout([(4, 1), (4, 5)], [(1, 1), (5, 1)], (4, 5))
    assert (col.path, col.full, col.div, col.mod) == ("broadcast", 1, 5, 4)
    scalar = layout([(), (4, 5)], [(), (5, 1)], (4, 5))
    assert (scalar.path, scalar.full, scalar.div, scalar.mod) == ("broadcast", 1, 1, 1)
    both = layout([(3, 1, 5), (4, 5)], [(5, 5, 1), (5, 1)], (3, 4, 5))
    assert both.path == "strided" and both.dims == (1, 1, 1, 3, 4, 5)
    assert both.strides == ((0, 0, 0, 5, 0, 1), (0, 0, 0, 0, 5, 1))
    t = layout([(4, 5), (4, 5)], [(1, 4), (5, 1)], (4, 5))
    assert t.path == "strided" and t.strides[0][-2:] == (1, 4)
    merged = layout([(2, 3, 4)], [(24, 8, 2)], (2, 3, 4), strided=True)  # every-other element: one dim
    assert merged.dims[-1] == 24 and merged.strides == ((0, 0, 0, 0, 0, 2),)
    assert layout([(4, 5), (4, 5)], [(5, 1), (5, 1)], (4, 5), strided=True).dims[-1] == 20
    seven = tuple([2] * 7)
    assert not layout([seven, seven], [tuple(2 ** i for i in range(7)), None], seven).fits  # reversed dims


# -- the CUDA launcher other CUDA code calls ------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_cuda_binary_act_is_one_launch_in_place(act, rng):
    cupy = pytest.importorskip("cupy")
    if not any(d.kind == "cuda" for d in opr.registry().devices):
        pytest.skip("no CUDA device")
    from opruntime_cupy.elementwise import binary_act

    y = rng.standard_normal((64, 96)).astype(np.float32)
    bias = rng.standard_normal(96).astype(np.float32)
    dy = cupy.asarray(y)
    out = binary_act("add", act, dy, cupy.asarray(bias), out=dy)
    assert out is dy
    ref = y.astype(np.float64) + bias
    if act:
        ref = opr.ops.base.ACTIVATIONS[act](ref)
    assert rel_err(cupy.asnumpy(out), ref) <= TOLERANCE["float32"]
    fresh = binary_act("mul", act, cupy.asarray(bias)[:, None], cupy.asarray(y[:, :1].T))  # both sides broadcast
    ref = bias.astype(np.float64)[:, None] * y[:, :1].T
    if act:
        ref = opr.ops.base.ACTIVATIONS[act](ref)
    assert fresh.shape == (96, 64) and rel_err(cupy.asnumpy(fresh), ref) <= TOLERANCE["float32"]


class _StandIn:
    """What the CUDA kernels read of a device (an H100's figures), for ranking without a GPU."""

    name, kind = "stand-in", "cuda"

    class provider:  # noqa: N801 - the attribute kernels read
        index, sm_count = 0, 132

        @staticmethod
        def figures():
            from opruntime_cupy import memory

            return memory.figures_for("NVIDIA H100 80GB HBM3", 132)


@pytest.mark.parametrize("shapes,strides,want", [
    (((64, 33), (64, 33)), ((33, 1), (33, 1)), "vector"),
    (((64, 33), (33,)), ((33, 1), (1,)), "broadcast"),
    (((2, 8, 4, 4), (8, 1, 1)), ((128, 16, 4, 1), (1, 1, 1)), "broadcast"),
    (((64, 33), ()), ((33, 1), ()), "broadcast"),
    (((33, 64), (33, 64)), ((1, 33), (64, 1)), "strided"),
    (((3, 1, 5), (4, 5)), ((5, 5, 1), (5, 1)), "strided"),
])
def test_cuda_kernels_rank_the_paths(shapes, strides, want):
    pytest.importorskip("opruntime_cupy")
    from opruntime_cupy import elementwise

    from opruntime.kernels import Problem
    from opruntime.ops.elementwise import broadcast_shape

    out = broadcast_shape("sub", *shapes)
    problem = Problem("sub", _StandIn(), shapes, ("float32", "float32"), strides, out_shape=out, out_dtype="float32")
    usable = [k for k in elementwise.kernels() if k.op == "sub" and k.supports(problem)]
    best = min(usable, key=lambda k: k.estimate(problem, k.configs[0]))
    assert best.name == f"cupy.sub.{want}"
    assert "cupy.sub.strided" in [k.name for k in usable]  # takes every layout


def test_explain_describes_the_call_that_runs():
    """explain applies the call's own rewrites: a weak Python scalar keeps float16 (no promotion to
    float32), and a middle operand given as None (layer_norm's weight) is the bias-only plan."""
    x = opr.tensor(np.ones((4, 3), np.float16))
    assert opr.explain("add", x, 1.0).problem.dtype == "float16"
    assert opr.explain("add", x, 1.0).problem == opr.explain("add", x, 2.0).problem
    ln = opr.explain("layer_norm", np.ones((2, 3), np.float32), None, np.ones(3, np.float32), normalized_shape=3)
    assert ln.problem.attrs["bias"] and not ln.problem.attrs["weight"]
