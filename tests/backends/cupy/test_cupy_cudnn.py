"""cuDNN's candidates on CUDA (``opruntime_cupy.cudnn``) and cuBLASLt's linear (``linear.py``).

CPU part (runs everywhere): the module imports without CuPy or cuDNN; a missing frontend or
library is a reason (``supports`` answers a false :class:`~opruntime_cupy.cudnn.Refusal`, ``info``
says why) and never an error; what each kernel accepts; the strides it gives cuDNN; the graph
build deselects TF32 engines for float32; costs are finite seconds on a stand-in H100.

GPU part (``-m gpu``, skipped with the reason without CuPy, a GPU or cuDNN): each kernel and config
against the float64 reference at odd sizes, size-1 dims, every attribute and mask form, strided and
misaligned operands; fully masked and NaN rows; float32 convolution without TF32; S = 32768 with
no L x S buffer; cuBLASLt's linear on misaligned operands.
"""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
from cupy_stand_in import StandInDevice

import opruntime as opr
from opruntime.kernels import Problem, c_strides
from opruntime.ops import OPS
from opruntime.testing.numerics import TOLERANCE, rel_err

ATT, CONV = OPS["scaled_dot_product_attention"], OPS["conv2d"]
STAND_IN = StandInDevice()
SDPA_NAME, CONV_NAME = "cupy.scaled_dot_product_attention.cudnn", "cupy.conv2d.cudnn"


def att_problem(q, k, v, mask=None, dtype="float16", device=STAND_IN, **attrs) -> Problem:
    """The Problem the frontend builds for these shapes (C-contiguous) or arrays (their strides)."""
    shapes = [tuple(getattr(a, "shape", a)) for a in (q, k, v) + ((mask,) if mask is not None else ())]
    kind = None if mask is None else ("bool" if getattr(mask, "dtype", None) == np.bool_ else "float")
    norm = ATT.normalize(shapes, {**attrs, "_mask": kind})
    strides = []
    for a, shape in zip((q, k, v, mask), norm.shapes):
        st = getattr(a, "strides", None)
        strides.append(c_strides(shape) if st is None else tuple(x // a.dtype.itemsize for x in a.reshape(shape).strides))
    dtypes = (dtype,) * 3 + (("bool" if kind == "bool" else dtype),) * (mask is not None)
    return Problem(ATT.name, device, norm.shapes, dtypes, tuple(strides), norm.attrs, norm.out_shape, dtype)


def conv_problem(xs, ws, bias=False, dtype="float32", device=STAND_IN, strides=None, **attrs) -> Problem:
    shapes = [xs, ws] + ([(ws[0],)] if bias else [])
    norm = CONV.normalize(shapes, dict(attrs))
    strides = strides or tuple(c_strides(s) for s in norm.shapes)
    return Problem("conv2d", device, norm.shapes, (dtype,) * len(shapes), strides, norm.attrs, norm.out_shape, dtype)


@pytest.fixture
def cudnn_mod():
    from opruntime_cupy import cudnn

    return cudnn


@pytest.fixture
def present(monkeypatch, cudnn_mod):
    """cuDNN taken as present (the frontend and library are not needed for the checks that use it)."""
    monkeypatch.setattr(cudnn_mod, "cudnn_missing", lambda: "")
    monkeypatch.setattr(cudnn_mod, "_tf32_knob", lambda: True)
    monkeypatch.setattr(cudnn_mod.memory, "bfloat16", lambda: np.dtype("float32"))  # "CuPy holds bfloat16"
    return cudnn_mod


# -- no GPU needed ---------------------------------------------------------------------------------
def test_the_table_is_registered_with_the_cuda_backend(cudnn_mod):
    from opruntime.plugins import registry

    table = {k.name: k for k in cudnn_mod.kernels()}
    assert set(table) == {SDPA_NAME, CONV_NAME}
    assert all(k.vendor and k.prepare is not None and k.run is None for k in table.values())
    assert table[SDPA_NAME].dtypes == {"float16", "bfloat16"}
    assert table[CONV_NAME].dtypes == {"float32", "float16", "bfloat16"}
    assert cudnn_mod.build_variants() == []
    if "cupy" in registry().records and registry().records["cupy"].status == "ok":
        assert {SDPA_NAME, CONV_NAME} <= set(registry().kernels)


def test_importing_the_module_imports_neither_cupy_nor_cudnn():
    import subprocess

    code = ("import sys, opruntime_cupy.cudnn, opruntime_cupy.linear; "
            "bad = [m for m in ('cupy', 'cudnn', 'nvmath') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_frontend_is_a_reason_not_an_error(monkeypatch, cudnn_mod):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn -> ImportError
    why = cudnn_mod.probe()
    assert "cuDNN frontend is not importable" in why and "pip install nvidia-cudnn-frontend" in why
    monkeypatch.setattr(cudnn_mod, "cudnn_missing", lambda: why)
    for k in cudnn_mod.kernels():
        p = att_problem((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)) if "attention" in k.name else \
            conv_problem((1, 3, 8, 8), (4, 3, 3, 3))
        ans = k.supports(p)
        assert not ans and isinstance(ans, cudnn_mod.Refusal) and str(ans) == why
    assert cudnn_mod.info() == {"cudnn": f"unavailable: {why}"}


def test_a_missing_library_is_a_reason_not_an_error(monkeypatch, cudnn_mod):
    """The frontend imports without libcudnn; its first call fails: that is the reason given."""
    fake = types.ModuleType("cudnn")

    def backend_version():
        raise RuntimeError("Unable to find symbol cudnnGetVersion")

    fake.backend_version = backend_version
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    why = cudnn_mod.probe()
    assert "cuDNN library is not loadable" in why and "cudnnGetVersion" in why
    fake.backend_version = lambda: 8907
    assert "older than 9.0" in cudnn_mod.probe()
    fake.backend_version = lambda: 91900
    assert cudnn_mod.probe() == ""


def test_a_refusal_is_false_and_the_selector_skips_it(cudnn_mod):
    r = cudnn_mod.Refusal("no cuDNN here")
    assert not r and r == "no cuDNN here" and isinstance(r, str)


@pytest.mark.parametrize(("q", "k", "v", "attrs", "ok"), [
    ((2, 4, 7, 16), (2, 4, 11, 16), (2, 4, 11, 16), {"is_causal": True}, True),
    ((2, 8, 9, 32), (2, 2, 12, 32), (2, 2, 12, 24), {"enable_gqa": True}, True),   # GQA, E != Ev
    ((1, 1, 1, 8), (1, 1, 1, 8), (1, 1, 1, 8), {}, True),                       # size-1 everything
    ((1, 1, 20, 256), (1, 1, 19, 256), (1, 1, 19, 200), {"is_causal": True}, True),
    ((2, 4, 5, 8), (1, 4, 6, 8), (2, 1, 6, 8), {}, False),                      # broadcast batch and heads
    ((2, 1, 5, 8), (2, 4, 6, 8), (2, 4, 6, 8), {}, False),                      # q's heads broadcast
    ((7, 5), (9, 5), (9, 3), {}, False),                                        # head dims not multiples of 8
    ((1, 1, 4, 264), (1, 1, 4, 264), (1, 1, 4, 264), {}, False),                # head dim over 256
])
def test_sdpa_supports(present, q, k, v, attrs, ok):
    ans = present.supports_sdpa(att_problem(q, k, v, **attrs))
    assert bool(ans) is ok
    if not ok:
        assert isinstance(ans, present.Refusal) and str(ans)


def test_sdpa_takes_every_mask_form(present):
    for mask in [np.zeros((7, 11), bool), np.zeros((2, 1, 1, 11), np.float16), np.zeros((7, 1), np.float16),
                 np.zeros((2, 4, 7, 11), bool), np.zeros((1, 1), bool)]:
        assert present.supports_sdpa(att_problem((2, 4, 7, 16), (2, 4, 11, 16), (2, 4, 11, 16), mask))


def test_conv_supports_every_attribute_and_refuses_float32_without_the_tf32_knob(present, monkeypatch):
    for case in CONV.cases:
        p = conv_problem(*case.shapes[:2], bias=len(case.shapes) > 2, **case.attrs)
        assert present.supports_conv(p), case
    monkeypatch.setattr(present, "_tf32_knob", lambda: False)
    ans = present.supports_conv(conv_problem((1, 3, 8, 8), (4, 3, 3, 3)))
    assert not ans and "TF32" in ans
    assert present.supports_conv(conv_problem((1, 3, 8, 8), (4, 3, 3, 3), dtype="float16"))


def test_strides_given_to_cudnn(cudnn_mod):
    u = cudnn_mod.usable
    assert u((2, 3, 5, 16), (240, 80, 16, 1), 2) == (240, 80, 16, 1)
    assert u((2, 5, 3, 16), (240, 16, 80, 1), 2) == (240, 16, 80, 1)  # BSHD memory seen as BHSD
    assert u((2, 3, 5, 16), None, 2) == (240, 80, 16, 1)
    assert u((2, 1, 5, 16), (80, 999, 16, 1), 2) == (80, 80, 16, 1)  # a size-1 dim's stride: the packed one
    assert u((2, 3, 5, 12), (180, 60, 12, 1), 2) is None  # 24-byte rows: not 16-byte multiples
    assert u((2, 3, 5, 16), (240, 80, 1, 5), 2) is None  # the last dim strided
    assert u((2, 3, 5, 16), (240, 80, -16, 1), 2) is None  # negative
    assert u((4, 3, 3, 3), (27, 9, 3, 1), 4) is None  # 12-byte rows
    assert u((4, 4, 3, 4), (48, 12, 4, 1), 4) == (48, 12, 4, 1)


class FakeGraph:
    """Records the build calls (the frontend's pygraph surface that ``build`` uses)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a, **kw: self.calls.append((name, a, kw))


def fake_cudnn(monkeypatch) -> types.ModuleType:
    fake = types.ModuleType("cudnn")
    fake.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    fake.numerical_note = types.SimpleNamespace(**{n: n for n in (
        "TENSOR_CORE", "DOWN_CONVERT_INPUTS", "FFT", "REDUCED_PRECISION_REDUCTION", "WINOGRAD")})
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    return fake


@pytest.mark.parametrize(("dtype", "notes"), [("float32", ["TENSOR_CORE", "DOWN_CONVERT_INPUTS", "FFT"]),
                                              ("float16", ["REDUCED_PRECISION_REDUCTION", "FFT"]),
                                              ("bfloat16", ["REDUCED_PRECISION_REDUCTION", "FFT"])])
def test_the_build_deselects_tf32_and_reduced_precision_engines(monkeypatch, cudnn_mod, dtype, notes):
    fake_cudnn(monkeypatch)
    monkeypatch.setattr(cudnn_mod, "_python_engines", lambda: ["sdpa_fwd_prefill_sm90"])
    g = FakeGraph()
    cudnn_mod.build(g, dtype)
    names = [c[0] for c in g.calls]
    assert names == ["validate", "build_operation_graph", "create_execution_plans", "deselect_numeric_notes",
                     "deselect_engines", "check_support", "build_plans"]
    assert g.calls[2][1] == (["A", "FALLBACK"],)
    assert g.calls[3][1] == (notes,)  # after planning: the filters act on the plans made
    assert g.calls[4][1] == (["sdpa_fwd_prefill_sm90"],)


def test_costs_are_finite_seconds_and_rank_the_layouts(present):
    att = next(k for k in present.kernels() if k.name == SDPA_NAME)
    conv = next(k for k in present.kernels() if k.name == CONV_NAME)
    big = att_problem((4, 16, 4096, 128), (4, 16, 4096, 128), (4, 16, 4096, 128), is_causal=True)
    full = att_problem((4, 16, 4096, 128), (4, 16, 4096, 128), (4, 16, 4096, 128))
    assert 0 < att.estimate(big, {}) < att.estimate(full, {}) < 1
    # 4 * 16 * 4096^2 * 256 * 2 flops at half the H100's 989 TFLOP/s: ~0.7 ms
    assert 0.5e-3 < att.estimate(full, {}) < 1.5e-3
    masked = att_problem((2, 4, 128, 64), (2, 4, 128, 64), (2, 4, 128, 64), np.zeros((2, 1, 128, 128), bool))
    plain = att_problem((2, 4, 128, 64), (2, 4, 128, 64), (2, 4, 128, 64))
    assert att.estimate(masked, {}) > att.estimate(plain, {})
    for dtype in ("float32", "float16"):
        p = conv_problem((32, 64, 56, 56), (64, 64, 3, 3), True, dtype, padding=1, activation="relu")
        cfgs = conv.candidates(p)
        costs = [conv.estimate(p, c) for c in cfgs]
        assert {c["layout"] for c in cfgs} == {"nhwc", "nchw"} and costs == sorted(costs)
        assert all(0 < c < 1 for c in costs)
        assert cfgs[0]["layout"] == "nchw"  # measured on the H100: in place beat channels-last on every layer


# -- the GPU ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cp():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # noqa: BLE001 - no CuPy or no device: nothing to run on
        pytest.skip(f"no CUDA device: {exc}")
    from opruntime_cupy import cudnn

    if cudnn.cudnn_missing():
        pytest.skip(cudnn.cudnn_missing())
    return cupy


@pytest.fixture(scope="module")
def cuda(cp):
    return opr.Device("cuda:0")


def np_dt(dtype: str):
    if dtype == "bfloat16":
        from opruntime_cupy.memory import bfloat16

        return bfloat16()
    return np.dtype(dtype)


def on_gpu(cp, host: np.ndarray, view: str | None = None):
    """``host`` on the GPU, as a plain array, a transposed layout of the same values ('T': the last
    two dims swapped in memory), or at an address 2 bytes off 16 ('offset')."""
    if view == "T":
        return cp.asarray(np.ascontiguousarray(np.swapaxes(host, -1, -2))).swapaxes(-1, -2)
    if view == "bshd":  # (B, H, L, E) values in (B, L, H, E) memory
        return cp.asarray(np.ascontiguousarray(host.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
    if view == "offset":
        flat = np.concatenate([host.ravel()[:1], host.ravel()])
        return cp.asarray(flat)[1:].reshape(host.shape)
    return cp.asarray(host)


def run_sdpa(cp, cuda, rng, qs, ks, vs, dtype, mask=None, views=(None, None, None, None), **attrs):
    """The kernel on random operands (``mask``: a host array, used as given), the float64 reference,
    the relative error and the launch."""
    from opruntime_cupy import cudnn

    dt = np_dt(dtype)
    hosts = [(rng.standard_normal(s) * 0.5).astype(dt) for s in (qs, ks, vs)]
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dt)
    devs = [on_gpu(cp, h, v) for h, v in zip(hosts, views)]
    if mask is not None:
        devs.append(on_gpu(cp, mask, views[3]))
    p = att_problem(*devs[:3], devs[3] if mask is not None else None, dtype=dtype, device=cuda, **attrs)
    assert cudnn.supports_sdpa(p), cudnn.supports_sdpa(p)
    launch = cudnn.prepare_sdpa(p, {})
    out = launch(*(d.reshape(s) for d, s in zip(devs, p.shapes)))
    assert out.shape == p.out_shape and out.dtype == dt
    # the output in q's order of heads and queries (as torch's): (B, L, H, Ev) memory for a "bshd" q
    heads_inner = views[0] == "bshd" and p.shapes[0][1] > 1 and p.shapes[0][2] > 1
    assert (out.transpose(0, 2, 1, 3) if heads_inner else out).flags.c_contiguous
    ref = ATT.reference(*(h.astype(np.float64) for h in hosts),
                        None if mask is None else (mask if mask.dtype == np.bool_ else mask.astype(np.float64)),
                        **attrs).reshape(p.out_shape)
    got = cp.asnumpy(out).astype(np.float64)
    return got, ref, launch


SDPA_CASES = [  # q, k, v, attrs: odd lengths, L < S and L > S causal, GQA, E != Ev, size-1 dims
    ((2, 3, 7, 16), (2, 3, 11, 16), (2, 3, 11, 16), {"is_causal": True}),
    ((1, 2, 13, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"is_causal": True}),  # rows past the last key see them all
    ((2, 8, 9, 32), (2, 2, 12, 32), (2, 2, 12, 24), {"enable_gqa": True, "is_causal": True}),
    ((1, 3, 67, 64), (1, 3, 67, 64), (1, 3, 67, 64), {"scale": 0.3, "is_causal": True}),
    ((2, 1, 130, 128), (2, 1, 133, 128), (2, 1, 133, 128), {}),
    ((1, 1, 1, 8), (1, 1, 1, 8), (1, 1, 1, 8), {}),
    ((3, 1, 1, 64), (3, 1, 300, 64), (3, 1, 300, 64), {}),  # one query (decode)
    ((1, 1, 20, 256), (1, 1, 19, 256), (1, 1, 19, 200), {"is_causal": True}),
    ((1, 4, 17, 64), (1, 2, 80, 64), (1, 2, 80, 64), {"enable_gqa": True}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", range(len(SDPA_CASES)))
def test_sdpa_against_the_reference(cp, cuda, rng, dtype, case):
    qs, ks, vs, attrs = SDPA_CASES[case]
    got, ref, _ = run_sdpa(cp, cuda, rng, qs, ks, vs, dtype, **attrs)
    assert rel_err(got, ref) <= TOLERANCE[dtype]


MASKS = {  # name: (mask shape for q (2, 4, 7, 32), k / v (2, 4, 11, 32)), kind
    "bool full": ((2, 4, 7, 11), "bool"), "bool one row": ((2, 1, 1, 11), "bool"), "bool 2-D": ((7, 11), "bool"),
    "bool one column": ((7, 1), "bool"), "float full": ((2, 4, 7, 11), "float"),
    "float per head": ((1, 4, 7, 11), "float"), "float one row": ((2, 1, 1, 11), "float"),
    "float one column": ((2, 4, 7, 1), "float"), "float 1x1": ((1, 1), "float"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(MASKS))
def test_sdpa_masks_with_dead_and_nan_rows(cp, cuda, rng, dtype, name):
    """Every mask form; a row whose every key is masked is zeros, a NaN / +inf in a row makes it NaN
    (the operator's contract, whatever the fused kernel does with -inf)."""
    shape, kind = MASKS[name]
    if kind == "bool":
        mask = rng.random(shape) < 0.7
        mask[..., -1, :] = False  # a dead row (in every batch and head the mask reaches)
    else:
        mask = rng.standard_normal(shape)
        mask[..., -1, :] = -np.inf
        if shape[-1] > 1 and shape[-2] > 2:
            mask[..., 0, 3] = np.nan
            mask[..., 1, 2] = np.inf
        elif shape[-2] > 2:
            mask[..., 0, :] = np.nan
    got, ref, _ = run_sdpa(cp, cuda, rng, (2, 4, 7, 32), (2, 4, 11, 32), (2, 4, 11, 32), dtype, mask)
    assert rel_err(got, ref) <= TOLERANCE[dtype]
    assert np.array_equal(np.isnan(got), np.isnan(ref))


@pytest.mark.gpu
@pytest.mark.parametrize("views", [("bshd", "bshd", "bshd", None), ("offset", "offset", "offset", "offset"),
                                   (None, "T", None, "T"), ("bshd", None, "offset", None)])
def test_sdpa_strided_and_misaligned_operands(cp, cuda, rng, views):
    mask = rng.standard_normal((2, 4, 24, 24))
    got, ref, _ = run_sdpa(cp, cuda, rng, (2, 4, 24, 64), (2, 4, 24, 64), (2, 4, 24, 64), "float16", mask,
                           views=views)
    assert rel_err(got, ref) <= TOLERANCE["float16"]


@pytest.mark.gpu
def test_heads_split_from_a_projection_join_again_without_a_copy(cp, cuda, rng):
    """The transformer block's pattern: q, k, v split by views from one (B, L, 3, H, E) projection;
    cuDNN writes the result in q's (B, L, H, E) order, so joining the heads is a view of it."""
    B, L, H, E = 2, 40, 4, 64
    qkv = (rng.standard_normal((B, L, 3, H, E)) * 0.5).astype(np.float16)
    t = opr.tensor(qkv, device=cuda).permute(2, 0, 3, 1, 4)
    with opr.override(ops={ATT.name: {"kernel": SDPA_NAME}}, strict=True):
        y = opr.scaled_dot_product_attention(t[0], t[1], t[2], is_causal=True)
    joined = y.permute(0, 2, 1, 3).reshape(B, L, H * E)
    assert cp.shares_memory(joined._data, y._data)
    hosts = [np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)).astype(np.float64) for i in range(3)]
    ref = ATT.reference(*hosts, is_causal=True).transpose(0, 2, 1, 3).reshape(B, L, H * E)
    assert rel_err(joined.numpy().astype(np.float64), ref) <= TOLERANCE["float16"]


@pytest.mark.gpu
def test_sdpa_long_sequence_without_an_l_by_s_buffer(cp, cuda, rng):
    """S = L = 32768, 8 heads of 128, causal: runs within a few hundred MiB of CuPy's pool (an
    L x S score buffer of one head alone would be 2 GiB), rows checked against float64."""
    from opruntime_cupy import cudnn

    B, H, S, E = 1, 8, 32768, 128
    dt = np.float16
    q, k, v = (cp.asarray((rng.standard_normal((B, H, S, E)) * 0.5).astype(dt)) for _ in range(3))
    p = att_problem(q, k, v, dtype="float16", device=cuda, is_causal=True)
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    before = pool.total_bytes()
    out = cudnn.prepare_sdpa(p, {})(q, k, v)
    cp.cuda.Device().synchronize()
    grown = pool.total_bytes() - before
    assert grown < 512 * 2**20, f"the pool grew {grown / 2**20:.0f} MiB"
    rows = [0, 1, 4095, 20000, S - 1]
    qh, kh, vh = (cp.asnumpy(a[0, ::3]).astype(np.float64) for a in (q, k, v))  # heads 0, 3, 6
    got = cp.asnumpy(out[0, ::3][:, rows]).astype(np.float64)
    for j, i in enumerate(rows):
        s = qh[:, i:i + 1] @ kh[:, : i + 1].swapaxes(-1, -2) / math.sqrt(E)
        e = np.exp(s - s.max(-1, keepdims=True))
        ref = (e / e.sum(-1, keepdims=True)) @ vh[:, : i + 1]
        assert rel_err(got[:, j:j + 1], ref) <= TOLERANCE["float16"], i


@pytest.mark.gpu
def test_sdpa_through_the_frontend_pinned(cp, cuda, rng):
    q, k, v = (rng.standard_normal((2, 4, 33, 64)).astype(np.float16) for _ in range(3))
    with opr.override(ops={ATT.name: {"kernel": SDPA_NAME}}, strict=True):
        out = opr.scaled_dot_product_attention(q, k, v, is_causal=True, device=cuda)
        assert opr.explain(ATT.name, q, k, v, is_causal=True, device=cuda).chosen.split("[")[0] == SDPA_NAME
    ref = ATT.reference(q, k, v, is_causal=True)
    assert rel_err(out.numpy().astype(np.float64), ref) <= TOLERANCE["float16"]


CONV_CASES = [  # x, w, bias, attrs: every attribute alone and together
    ((2, 3, 9, 11), (4, 3, 3, 3), False, {}),
    ((2, 3, 9, 11), (4, 3, 3, 3), True, {"stride": 2, "padding": 1}),
    ((1, 4, 10, 7), (6, 4, 3, 2), True, {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}),
    ((2, 4, 8, 8), (4, 2, 3, 3), False, {"groups": 2, "padding": "same"}),
    ((2, 4, 8, 9), (5, 4, 2, 4), True, {"padding": "same", "dilation": 2}),  # odd total: bottom / right pad
    ((1, 6, 7, 7), (6, 1, 3, 3), True, {"groups": 6, "padding": 1, "activation": "gelu"}),
    ((2, 8, 5, 6), (4, 8, 1, 1), True, {"activation": "gelu_tanh"}),
    ((2, 4, 8, 9), (6, 2, 3, 3), False, {"groups": 2, "stride": 2, "activation": "silu"}),
    ((2, 5, 9, 11), (6, 5, 3, 3), True, {"padding": 1, "activation": "relu"}),
    ((1, 1, 1, 1), (1, 1, 1, 1), False, {}),
    ((1, 3, 13, 17), (7, 3, 5, 5), True, {"stride": 3, "padding": 2}),
    ((2, 16, 14, 14), (32, 16, 3, 3), True, {"padding": 1, "activation": "relu"}),  # channels cuDNN fuses
    ((2, 32, 12, 12), (64, 32, 1, 1), True, {"activation": "silu"}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_conv_every_attribute_and_layout(cp, cuda, rng, dtype, layout):
    from opruntime_cupy import cudnn

    dt, failures, fused = np_dt(dtype), [], 0
    for xs, ws, bias, attrs in CONV_CASES:
        hosts = [rng.standard_normal(s).astype(dt) for s in (xs, ws) + (((ws[0],),) if bias else ())]
        p = conv_problem(xs, ws, bias, dtype, cuda, **attrs)
        launch = cudnn.prepare_conv(p, {"layout": layout})
        fused += launch.fused
        out = launch(*(cp.asarray(h) for h in hosts))
        assert out.shape == p.out_shape and out.dtype == dt and out.flags.c_contiguous
        ref = CONV.reference(*(h.astype(np.float64) for h in hosts), **attrs)
        err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
        if not err <= TOLERANCE[dtype]:
            failures.append(f"{xs} {ws} bias={bias} {attrs}: {err:.2e}")
    assert not failures, "\n".join(failures)
    print(f"{dtype} {layout}: {fused} of the cases with an epilogue fused in cuDNN's graph")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_conv_float32_is_not_tf32(cp, cuda, rng, layout):
    """A reduction of 2304 products: TF32's 10-bit mantissa would give ~1e-3, float32 ~1e-6."""
    from opruntime_cupy import cudnn

    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 256, 20, 20), (256, 256, 3, 3), (256,)))
    p = conv_problem(x.shape, w.shape, True, "float32", cuda, padding=1)
    out = cudnn.prepare_conv(p, {"layout": layout})(cp.asarray(x), cp.asarray(w), cp.asarray(b))
    ref = CONV.reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), padding=1)
    assert rel_err(cp.asnumpy(out).astype(np.float64), ref) <= TOLERANCE["float32"]


@pytest.mark.gpu
def test_conv_strided_and_misaligned_operands(cp, cuda, rng):
    from opruntime_cupy import cudnn

    for dtype in ("float32", "float16"):
        dt = np.dtype(dtype)
        x, w, b = (rng.standard_normal(s).astype(dt) for s in ((2, 8, 9, 10), (16, 8, 3, 3), (16,)))
        xd = on_gpu(cp, x, "T")  # H and W swapped in memory
        wd = on_gpu(cp, w, "offset")
        bd = cp.asarray(np.stack([b, b], 1))[:, 0]  # stride 2
        strides = tuple(tuple(s // dt.itemsize for s in a.strides) for a in (xd, wd, bd))
        p = conv_problem(x.shape, w.shape, True, dtype, cuda, strides=strides, padding=1, activation="relu")
        ref = CONV.reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), padding=1,
                             activation="relu")
        for layout in ("nhwc", "nchw"):
            out = cudnn.prepare_conv(p, {"layout": layout})(xd, wd, bd)
            assert rel_err(cp.asnumpy(out).astype(np.float64), ref) <= TOLERANCE[dtype], (dtype, layout)


@pytest.mark.gpu
def test_cublaslt_linear_on_misaligned_operands(cp, cuda, rng):
    """cuBLASLt's heuristic assumes 256-byte aligned operands unless told: a call on operands off
    16 bytes (element-aligned views) runs the algorithm planned for their alignment (an algorithm
    planned for 256 bytes failed with CUBLAS_STATUS_NOT_SUPPORTED on the H100)."""
    from opruntime_cupy import linear

    if linear.nvmath_missing():
        pytest.skip(linear.nvmath_missing())
    kernel = next(k for k in linear.kernels() if k.name == "cupy.linear.cublaslt")
    lin = OPS["linear"]
    for dtype in ("float16", "bfloat16", "float32"):
        dt = np_dt(dtype)
        x, w, b = (rng.standard_normal(s).astype(dt) for s in ((130, 72), (264, 72), (264,)))
        xd, wd, bd = on_gpu(cp, x, "offset"), on_gpu(cp, w, "offset"), on_gpu(cp, b, "offset")
        for act, bias in ((None, True), ("relu", True), ("gelu_tanh", False)):
            arrays = [xd, wd] + ([bd] if bias else [])
            shapes = [a.shape for a in arrays]
            norm = lin.normalize(shapes, {"activation": act})
            strides = tuple(tuple(s // a.dtype.itemsize for s in a.strides) for a in arrays)
            p = Problem("linear", cuda, norm.shapes, (dtype,) * len(arrays), strides, norm.attrs, norm.out_shape,
                        dtype)
            assert kernel.supports(p)
            out = kernel(p, {}, *arrays)
            ref = lin.reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64) if bias else None,
                                activation=act)
            assert rel_err(cp.asnumpy(out).astype(np.float64), ref) <= TOLERANCE[dtype], (dtype, act, bias)
