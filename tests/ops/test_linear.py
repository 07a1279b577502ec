"""linear (and conv2d's activation=): the error messages, the special semantics (1-D x, zero
input features, the activation after the bias), agreement with torch on every device, and the
CUDA backend's linear kernels: their table, supports and costs on a stand-in device (no GPU), and
every kernel x config x activation against the float64 reference (``-m gpu``).

The conformance suite checks every kernel on the operators' own cases; these tests add what it
does not: the messages, torch itself as the reference, and each CUDA kernel pinned directly."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import skip_unless_dtype

import opruntime as opr
from opruntime.errors import AttributeValueError, ShapeError, UnknownAttributeError
from opruntime.kernels import Problem, c_strides
from opruntime.ops import OPS
from opruntime.ops.base import ACTIVATIONS, EPILOGUES
from opruntime.testing.numerics import TOLERANCE, rel_err

LINEAR = OPS["linear"]


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# -- errors -------------------------------------------------------------------------------------------
def test_in_features_mismatch_names_both_shapes_and_the_fix(rng):
    with pytest.raises(ShapeError, match=r"linear: x \(4, 7\) has in_features=7 .* weight \(3, 5\) has "
                                         r"in_features=5 .*\(out_features, in_features\)"):
        opr.linear(f32(rng, 4, 7), f32(rng, 3, 5), device="cpu")


def test_a_matmul_shaped_weight_is_refused_with_the_transpose_hint(rng):
    """weight (in, out) is matmul's layout, not linear's: the message says to transpose it."""
    with pytest.raises(ShapeError, match="transpose a \\(in, out\\) matrix first"):
        opr.linear(f32(rng, 4, 7), f32(rng, 7, 3), device="cpu")


@pytest.mark.parametrize("w_shape", [(3,), (2, 3, 7)])
def test_weight_must_be_2d(rng, w_shape):
    want = f"linear: weight must be 2-D (out_features, in_features), got shape {tuple(w_shape)}"
    with pytest.raises(ShapeError, match=re.escape(want)):
        opr.linear(f32(rng, 4, 7), f32(rng, *w_shape), device="cpu")


def test_bias_shape_must_match_out_features(rng):
    with pytest.raises(ShapeError, match=r"linear: bias must have shape \(3,\) to match weight \(3, 7\) "
                                         r"\(out_features=3\), got \(4,\)"):
        opr.linear(f32(rng, 4, 7), f32(rng, 3, 7), f32(rng, 4), device="cpu")


def test_x_must_not_be_0d(rng):
    with pytest.raises(ShapeError, match="linear: x must be at least 1-D"):
        opr.linear(np.float32(1.0), f32(rng, 3, 1), device="cpu")


@pytest.mark.parametrize("bad", ["tanh", "sigmoid", "GELU", "", 1, True])
def test_unknown_activation_lists_the_ones_there_are(rng, bad):
    with pytest.raises(AttributeValueError) as info:
        opr.linear(f32(rng, 4, 7), f32(rng, 3, 7), activation=bad, device="cpu")
    msg = str(info.value)
    assert msg.startswith("linear: activation must be None or one of") and repr(bad) in msg
    assert all(repr(name) in msg for name in EPILOGUES)


def test_unknown_keyword_is_typed(rng):
    with pytest.raises(UnknownAttributeError, match="linear\\(\\) got unexpected keyword argument\\(s\\) act"):
        LINEAR(f32(rng, 4, 7), f32(rng, 3, 7), act="relu", device="cpu")


def test_conv2d_unknown_activation(rng):
    with pytest.raises(AttributeValueError, match="conv2d: activation must be None or one of 'relu'"):
        opr.conv2d(f32(rng, 1, 2, 5, 5), f32(rng, 3, 2, 3, 3), activation="tanh", device="cpu")


# -- semantics ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("x_shape", "want"), [((7,), (3,)), ((5, 7), (5, 3)), ((2, 4, 7), (2, 4, 3)),
                                               ((2, 1, 4, 7), (2, 1, 4, 3))])
def test_result_shape_follows_x(rng, x_shape, want):
    norm = LINEAR.normalize([x_shape, (3, 7), (3,)], {})
    assert norm.result_shape == want and norm.shapes[0] == (int(np.prod(x_shape[:-1])), 7)
    assert opr.linear(f32(rng, *x_shape), f32(rng, 3, 7), f32(rng, 3), device="cpu").shape == want


@pytest.mark.parametrize("activation", [None, *EPILOGUES])
def test_zero_in_features_give_the_activated_bias(device, activation):
    """x @ weight.T over K = 0 is zeros: the result is act(bias), answered by the frontend."""
    skip_unless_dtype(device, "linear", "float32")
    bias = np.array([-2.0, -0.5, 0.0, 0.75, 3.0], np.float32)
    out = opr.linear(np.zeros((3, 0), np.float32), np.zeros((5, 0), np.float32), bias, activation=activation,
                     device=device)
    want = np.broadcast_to(bias if activation is None else ACTIVATIONS[activation](bias.astype(np.float64)), (3, 5))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    no_bias = opr.linear(np.zeros((3, 0), np.float32), np.zeros((5, 0), np.float32), activation=activation,
                         device=device)
    assert not np.any(no_bias.numpy())


def test_conv2d_zero_channels_give_the_activated_bias():
    bias = np.array([-1.0, 2.0], np.float32)
    out = opr.conv2d(np.zeros((1, 0, 4, 4), np.float32), np.zeros((2, 0, 3, 3), np.float32), bias,
                     activation="gelu", device="cpu")
    np.testing.assert_allclose(out.numpy()[0, :, 0, 0], ACTIVATIONS["gelu"](bias.astype(np.float64)), rtol=1e-6)


def test_reference_applies_the_activation_after_the_bias():
    x, w, b = np.array([[1.0, -2.0]]), np.array([[1.0, 1.0], [2.0, 0.5]]), np.array([0.5, 1.5])
    plain = x @ w.T + b  # (-0.5, 2.5)
    np.testing.assert_array_equal(LINEAR.reference(x, w, b, activation="relu"), np.maximum(plain, 0))
    np.testing.assert_allclose(LINEAR.reference(x, w, b, activation="silu"), plain / (1 + np.exp(-plain)))


# -- torch agreement ------------------------------------------------------------------------------------
def _torch_act(torch, name, y):
    f = torch.nn.functional
    if name is None:
        return y
    return f.gelu(y, approximate="tanh") if name == "gelu_tanh" else getattr(f, name)(y)


@pytest.mark.parametrize("activation", [None, *EPILOGUES])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_agrees_with_torch(device, rng, activation, bias):
    torch = pytest.importorskip("torch")
    skip_unless_dtype(device, "linear", "float32")
    x, w = f32(rng, 3, 17, 45), f32(rng, 29, 45)
    b = f32(rng, 29) if bias else None
    out = opr.linear(x, w, b, activation=activation, device=device).numpy()
    with torch.no_grad():
        tb = None if b is None else torch.from_numpy(b).double()
        want = _torch_act(torch, activation, torch.nn.functional.linear(torch.from_numpy(x).double(),
                                                                        torch.from_numpy(w).double(), tb)).numpy()
    assert out.shape == want.shape
    assert rel_err(out, want) <= TOLERANCE["float32"]


@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_residual_agrees_with_torch(device, rng, activation, bias):
    """``linear(x, w, b, residual=r)`` is ``act(F.linear(x, w, b) + r)`` (the residual before the
    activation), with and without a bias (without one the kernels get ``x, w, r``), r a Tensor
    that is a non-contiguous view on the device."""
    torch = pytest.importorskip("torch")
    skip_unless_dtype(device, "linear", "float32")
    x, w, r = f32(rng, 3, 17, 45), f32(rng, 29, 45), f32(rng, 3, 17, 29)
    b = f32(rng, 29) if bias else None
    r_view = opr.tensor(np.ascontiguousarray(r.transpose(1, 0, 2)), device=device).permute(1, 0, 2)
    for residual in (r, r_view):
        out = opr.linear(x, w, b, activation=activation, residual=residual, device=device).numpy()
        with torch.no_grad():
            tb = None if b is None else torch.from_numpy(b).double()
            y = torch.nn.functional.linear(torch.from_numpy(x).double(), torch.from_numpy(w).double(), tb)
            want = _torch_act(torch, activation, y + torch.from_numpy(r).double()).numpy()
        assert out.shape == want.shape
        assert rel_err(out, want) <= TOLERANCE["float32"]


def test_residual_of_the_wrong_shape_names_the_result_shape(rng):
    with pytest.raises(ShapeError, match=r"residual must have the result's shape \(4, 3\).*got \(3,\).*opr.add"):
        opr.linear(f32(rng, 4, 7), f32(rng, 3, 7), f32(rng, 3), residual=f32(rng, 3), device="cpu")
    with pytest.raises(ShapeError, match=r"residual.*\(2, 4, 3\).*got \(4, 3\)"):
        opr.linear(f32(rng, 2, 4, 7), f32(rng, 3, 7), residual=f32(rng, 4, 3), device="cpu")


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_zero_in_features_with_a_residual(device, rng, activation):
    """K = 0: act(bias + residual), and act(residual) without a bias, from the frontend."""
    skip_unless_dtype(device, "linear", "float32")
    bias, r = f32(rng, 5), f32(rng, 3, 5)
    x, w = np.zeros((3, 0), np.float32), np.zeros((5, 0), np.float32)
    act = (lambda v: v) if activation is None else ACTIVATIONS[activation]
    out = opr.linear(x, w, bias, activation=activation, residual=r, device=device)
    np.testing.assert_allclose(out.numpy(), act(bias.astype(np.float64) + r), rtol=1e-6, atol=1e-7)
    out = opr.linear(x, w, activation=activation, residual=r, device=device)
    np.testing.assert_allclose(out.numpy(), act(r.astype(np.float64)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("activation", [None, "relu"])
def test_float16_product_and_bias_are_rounded_once(device, activation):
    """float16: the product plus the bias rounded once, as an fp32 accumulator and epilogue do:
    3 * 0.3 - 0.9 in float16 operands is 2^-12, exact in float32; the product rounded to float16
    first gives 0 or 2^-11, an error as large as the result (JAX's linear did, in float16)."""
    skip_unless_dtype(device, "linear", "float16")
    x, w, b = np.array([[3.0]], np.float16), np.array([[0.3]], np.float16), np.array([-0.9], np.float16)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    assert want.tolist() == [[2.0 ** -12]]
    out = opr.linear(x, w, b, activation=activation, device=device).numpy()
    assert out.dtype == np.float16 and out.tolist() == [[2.0 ** -12]]


@pytest.mark.parametrize("activation", EPILOGUES)
def test_conv2d_activation_agrees_with_torch(device, rng, activation):
    torch = pytest.importorskip("torch")
    skip_unless_dtype(device, "conv2d", "float32")
    f = torch.nn.functional
    for x_shape, w_shape, attrs in (((2, 6, 11, 9), (8, 6, 3, 3), {"padding": 1}),
                                    ((2, 6, 11, 9), (6, 1, 3, 3), {"padding": 1, "groups": 6}),
                                    ((2, 6, 11, 9), (5, 6, 1, 1), {})):
        x, w, b = f32(rng, *x_shape), f32(rng, *w_shape), f32(rng, w_shape[0])
        out = opr.conv2d(x, w, b, activation=activation, device=device, **attrs).numpy()
        with torch.no_grad():
            y = f.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(),
                         **attrs)
            want = _torch_act(torch, activation, y).numpy()
        assert rel_err(out, want) <= TOLERANCE["float32"], (x_shape, w_shape, attrs)


# -- the CUDA kernels without a GPU: table, supports, costs -------------------------------------------
class _StandInProvider:
    """What the CUDA kernels read of a CudaDevice: an H100's figures."""

    index, sm_count = 0, 132

    def figures(self):
        from opruntime_cupy import memory

        return memory.figures_for("NVIDIA H100 80GB HBM3", self.sm_count)


class _StandIn:
    name, kind, provider = "stand-in", "cuda", _StandInProvider()


def _problem(x, w, bias, dtype, activation=None, strides=None, device=None, residual=None) -> Problem:
    shapes = [x, w] + ([(w[0],)] if bias else []) + ([residual] if residual else [])
    hidden = {"_residual_only": True} if residual and not bias else {}
    norm = LINEAR.normalize(shapes, {"activation": activation, **hidden})
    strides = strides or tuple(c_strides(s) for s in norm.shapes)
    return Problem("linear", device or _StandIn(), norm.shapes, (dtype,) * len(shapes), strides, norm.attrs,
                   norm.out_shape, dtype)


def test_cuda_linear_table_supports_and_costs_read_the_provider():
    from opruntime_cupy import linear

    table = {k.name: k for k in linear.kernels()}
    assert {"cupy.linear.cublas", "cupy.linear.cublaslt", "cupy.linear.simt", "cupy.linear.simt_generic",
            "cupy.linear.mma", "cupy.linear.mma_generic", "cupy.linear.wgmma", "cupy.linear.tma"} == set(table)
    assert table["cupy.linear.cublas"].vendor and table["cupy.linear.cublaslt"].vendor
    assert all(k.prepare is not None and k.run is None for k in table.values())
    for dtype in ("float32", "float16"):
        p = _problem((4096, 4096), (4096, 4096), True, dtype, "gelu")
        g = linear.as_matmul(p)  # weight (N, K) row-major is B (K x N) k-contiguous: no copy
        assert g.shapes == ((4096, 4096), (4096, 4096)) and g.strides[1] == (1, 4096)
        for k in table.values():
            if dtype not in k.dtypes or k.name in ("cupy.linear.wgmma", "cupy.linear.tma", "cupy.linear.cublaslt",
                                                   "cupy.linear.cublas"):
                continue  # wgmma / tma ask CuPy for the arch; the vendors' supports probe their libraries
            if k.supports(p):
                costs = [k.estimate(p, c) for c in k.candidates(p)]
                assert costs and all(0 < c < 1 for c in costs) and costs == sorted(costs), k.name
    own = table["cupy.linear.mma"]
    p = _problem((4096, 4096), (4096, 4096), True, "float16", "gelu")
    plain = _problem((4096, 4096), (4096, 4096), False, "float16")
    assert own.supports(p) and own.estimate(p, own.configs[0]) >= own.estimate(plain, own.configs[0])


@pytest.mark.parametrize(("activation", "bias", "ok"), [
    (None, True, True), ("relu", True, True), ("gelu_tanh", True, True), ("relu", False, True),
    ("gelu", True, True), ("silu", False, True), (None, False, False)])
def test_cublaslt_serves_every_epilogue_but_the_plain_gemm(monkeypatch, activation, bias, ok):
    """cuBLASLt's GELU is the tanh approximation: exact gelu and silu are its BIAS epilogue and one
    activation pass; a plain GEMM is matmul's."""
    from opruntime_cupy import linear

    monkeypatch.setattr(linear, "nvmath_missing", lambda: "")
    monkeypatch.setattr(linear, "supports_cublas", lambda p: True)
    assert bool(linear.supports_cublaslt(_problem((8, 16), (4, 16), bias, "float16", activation))) is ok
    monkeypatch.setattr(linear, "nvmath_missing", lambda: "nvmath-python is not importable")
    assert not linear.supports_cublaslt(_problem((8, 16), (4, 16), True, "float16", "relu"))


@pytest.mark.parametrize(("strides", "ok"), [(None, True), (((16, 1), (16, 1), (12, 1)), True),
                                             (((16, 1), (16, 1), (1, 8)), False), (((16, 1), (16, 1), (2, 1)), False)])
def test_cublaslt_takes_a_residual_as_c_when_its_rows_are_unit_stride(monkeypatch, strides, ok):
    """A residual alone is an epilogue too (C with beta 1); its rows must be unit-stride and not
    overlap (row stride >= N), else the own GEMMs and their pass serve it."""
    from opruntime_cupy import linear

    monkeypatch.setattr(linear, "nvmath_missing", lambda: "")
    monkeypatch.setattr(linear, "supports_cublas", lambda p: True)
    assert bool(linear.supports_cublaslt(_problem((8, 16), (4, 16), False, "float16", None, strides,
                                                  residual=(8, 4)))) is ok


def test_cuda_epilogue_variants_are_listed_for_ci():
    from opruntime_cupy import conv, linear

    variants = linear.build_variants()
    assert {d["ACT"] for f, d in variants if f == "linear.cu"} == {0, 1, 2, 3, 4}
    for f in ("matmul_sgemm.cu", "matmul_hgemm.cu", "matmul_wgmma.cu", "matmul_tma.cu"):
        assert {d.get("ACT") for g, d in variants if g == f and d.get("BIAS")} >= {1, 3}, f
    conv_acts = {(f, d.get("ACT")) for f, d in conv.build_variants()}
    for f in ("conv_simt.cu", "conv_mma.cu", "conv_depthwise.cu", "conv_winograd.cu"):
        assert {(f, a) for a in (1, 2, 3, 4)} <= conv_acts, f


# -- the CUDA kernels on the GPU ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy", reason="cupy not installed: the CUDA kernels cannot run")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # noqa: BLE001 - any CUDA failure here means: no device to test on
        pytest.skip(f"no CUDA device: {exc}")
    return cupy


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        from opruntime_cupy.memory import bfloat16

        return bfloat16()
    return np.dtype(dtype)


#: (x, weight, views): odd sizes, edges past every tile, a 1-row x, misaligned and strided operands
GPU_SHAPES = [((67, 131), (61, 131), None), ((256, 128), (192, 128), None), ((1, 64), (40, 64), None),
              ((67, 136), (61, 136), None),  # rows of y not 16-byte multiples: tma stores from registers
              ((130, 72), (264, 72), "offset"), ((33, 40), (24, 40), "transposed-x")]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cublas", "cublaslt", "simt", "simt_generic", "mma", "mma_generic", "wgmma",
                                  "tma"])
def test_every_cuda_linear_kernel_config_and_activation(cp, rng, name):
    from opruntime_cupy import linear

    kernel = next(k for k in linear.kernels() if k.name == f"cupy.linear.{name}")
    dev = opr.Device("cuda:0")
    ran, failures = 0, []
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        if dtype not in kernel.dtypes or (dtype == "bfloat16" and _np_dtype(dtype) is None):
            continue
        for xs, ws, view in GPU_SHAPES:
            for activation in (None, *EPILOGUES):
                for bias in (True, False):
                    xh = rng.standard_normal(xs).astype(_np_dtype(dtype))
                    wh = rng.standard_normal(ws).astype(_np_dtype(dtype))
                    bh = rng.standard_normal(ws[0]).astype(_np_dtype(dtype))
                    if view == "offset":  # base addresses off 16 bytes: the any-stride fallback
                        xd = cp.asarray(np.concatenate([xh.ravel(), xh.ravel()[:1]]))[1:].reshape(xs)
                        xh = cp.asnumpy(xd)
                    elif view == "transposed-x":
                        xd = cp.asarray(np.ascontiguousarray(xh.T)).T
                    else:
                        xd = cp.asarray(xh)
                    arrays = [xd, cp.asarray(wh)] + ([cp.asarray(bh)] if bias else [])
                    strides = tuple(tuple(s // a.dtype.itemsize for s in a.strides) for a in arrays)
                    p = _problem(xs, ws, bias, dtype, activation, strides, dev)
                    if not kernel.supports(p):
                        continue
                    ref = LINEAR.reference(xh.astype(np.float64), wh.astype(np.float64),
                                           bh.astype(np.float64) if bias else None, activation=activation)
                    configs = kernel.candidates(p)
                    for cfg in configs[:2] if activation not in (None, "gelu") else configs:
                        out = kernel(p, cfg, *arrays)
                        ran += 1
                        assert out.shape == p.out_shape and out.dtype == xd.dtype
                        err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
                        if not err <= TOLERANCE[dtype]:
                            failures.append(f"{dtype} {xs}x{ws} {view} bias={bias} {activation} {cfg}: {err:.2e}")
    if name == "cublaslt" and not ran:
        pytest.skip(linear.nvmath_missing() or "cuBLASLt declined every case")
    assert ran > 0
    assert not failures, "\n".join(failures[:20])


#: (x, weight, residual layout): contiguous, rows strided past N (cuBLASLt's C with its own ld),
#: off 16 bytes (the scalar pass / a smaller cuBLASLt alignment), transposed (copied for the pass,
#: refused by cuBLASLt)
RESIDUAL_SHAPES = [((67, 136), (61, 136), None), ((256, 128), (192, 128), "wide-rows"),
                   ((130, 72), (264, 72), "offset"), ((33, 40), (24, 40), "transposed"), ((1, 64), (40, 64), None)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cublas", "cublaslt", "simt", "simt_generic", "mma", "mma_generic", "wgmma",
                                  "tma"])
def test_every_cuda_linear_kernel_with_a_residual(cp, rng, name):
    """``act(x @ w.T + bias + residual)``: cuBLASLt's C (beta 1) before its epilogue, the own
    GEMMs and cuBLAS followed by one pass adding it; each kernel pinned, every config it offers
    for the first shape, float32 / float16 / bfloat16, against the float64 reference."""
    from opruntime_cupy import linear

    kernel = next(k for k in linear.kernels() if k.name == f"cupy.linear.{name}")
    dev = opr.Device("cuda:0")
    ran, failures = 0, []
    for dtype in ("float32", "float16", "bfloat16"):
        if dtype not in kernel.dtypes or _np_dtype(dtype) is None:
            continue
        for xs, ws, layout in RESIDUAL_SHAPES:
            m, n = xs[0], ws[0]
            for activation in (None, "relu", "gelu", "gelu_tanh"):
                for bias in (True, False):
                    xh, wh = (rng.standard_normal(s).astype(_np_dtype(dtype)) for s in (xs, ws))
                    bh = rng.standard_normal(n).astype(_np_dtype(dtype))
                    rh = rng.standard_normal((m, n)).astype(_np_dtype(dtype))
                    if layout == "wide-rows":
                        rd = cp.zeros((m, n + 24), rh.dtype)[:, 8:8 + n]
                        rd[...] = cp.asarray(rh)
                    elif layout == "offset":
                        rd = cp.asarray(np.concatenate([rh.ravel(), rh.ravel()[:1]]))[1:].reshape(m, n)
                        rh = cp.asnumpy(rd)
                    elif layout == "transposed":
                        rd = cp.asarray(np.ascontiguousarray(rh.T)).T
                    else:
                        rd = cp.asarray(rh)
                    arrays = [cp.asarray(xh), cp.asarray(wh)] + ([cp.asarray(bh)] if bias else []) + [rd]
                    shapes = [xs, ws] + ([(n,)] if bias else []) + [(m, n)]
                    attrs = {"activation": activation} | ({} if bias else {"_residual_only": True})
                    norm = LINEAR.normalize(shapes, attrs)
                    strides = tuple(tuple(s // a.dtype.itemsize for s in a.strides) for a in arrays)
                    p = Problem("linear", dev, norm.shapes, (dtype,) * len(shapes), strides, norm.attrs,
                                norm.out_shape, dtype)
                    if not kernel.supports(p):
                        continue
                    ref = LINEAR.reference(*(a.astype(np.float64) for a in (xh, wh)),
                                           bh.astype(np.float64) if bias else None, rh.astype(np.float64),
                                           activation=activation)
                    first = xs == RESIDUAL_SHAPES[0][0] and dtype == "float16"
                    for cfg in kernel.candidates(p) if first else kernel.candidates(p)[:1]:
                        out = kernel(p, cfg, *arrays)
                        ran += 1
                        assert out.shape == p.out_shape and out.dtype == arrays[0].dtype
                        err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
                        if not err <= TOLERANCE[dtype]:
                            failures.append(f"{dtype} {xs}x{ws} {layout} bias={bias} {activation} {cfg}: {err:.2e}")
    assert ran > 0 or name == "cublaslt" and linear.nvmath_missing()
    assert not failures, "\n".join(failures[:20])
