"""max_pool2d, avg_pool2d and adaptive_avg_pool2d: agreement with torch (CPU) over many attribute
combinations on every device, torch's special semantics (NaN in a max window, windows of padding
only, ceil_mode's last-window rule, the avg divisor at the padded edge, None in output_size), the
typed errors, and the CUDA kernels' thread geometry (every output written exactly once, emulated
on the host: no GPU needed)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err

import opruntime as opr
from opruntime.errors import AttributeValueError, ShapeError, UnknownAttributeError
from opruntime.kernels import Attrs, Problem, c_strides
from opruntime.ops import OPS

torch = pytest.importorskip("torch")
F = torch.nn.functional

# (shape, attrs): every attribute alone and in combination, ceil_mode both ways, odd sizes
MAX_COMBOS = [
    ((2, 3, 8, 9), dict(kernel_size=2)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((1, 2, 7, 10), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0))),
    ((1, 2, 11, 9), dict(kernel_size=3, stride=2, padding=1, dilation=2)),
    ((1, 2, 11, 9), dict(kernel_size=(3, 2), stride=(3, 1), dilation=(2, 3), ceil_mode=True)),
    ((2, 2, 5, 5), dict(kernel_size=2, stride=2, ceil_mode=True)),
    ((2, 2, 6, 6), dict(kernel_size=3, stride=3, padding=1, ceil_mode=True)),
    ((1, 3, 13, 17), dict(kernel_size=5, stride=3, padding=2, ceil_mode=True)),
    ((1, 1, 5, 5), dict(kernel_size=1, stride=3, ceil_mode=True)),
    ((3, 6, 7), dict(kernel_size=2, stride=1, padding=1)),
    ((1, 1, 1, 1), dict(kernel_size=1)),
    ((2, 3, 9, 11), dict(kernel_size=3, stride=(), padding=1)),
]
AVG_COMBOS = [
    ((2, 3, 8, 9), dict(kernel_size=2)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((1, 2, 7, 10), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), count_include_pad=False)),
    ((1, 1, 5, 5), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((1, 1, 6, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((1, 1, 6, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((2, 2, 5, 5), dict(kernel_size=2, stride=3, padding=1, ceil_mode=True)),
    ((1, 3, 13, 17), dict(kernel_size=5, stride=3, padding=2, ceil_mode=True, count_include_pad=False)),
    ((3, 6, 7), dict(kernel_size=2, stride=1, padding=1)),
    ((1, 1, 1, 1), dict(kernel_size=1)),
]
ADAPTIVE_COMBOS = [
    ((2, 3, 9, 11), 1), ((2, 3, 9, 11), (3, 4)), ((2, 3, 10, 8), (5, 4)), ((1, 2, 5, 5), 7),
    ((2, 3, 6, 9), (None, 2)), ((2, 3, 6, 9), (4, None)), ((3, 5, 6), 2), ((1, 1, 1, 1), 1),
    ((2, 4, 7, 7), (7, 7)), ((1, 2, 40, 33), 1), ((2, 2, 8, 8), 1),
]


def _torch(fn, x, **attrs):
    return fn(torch.from_numpy(np.ascontiguousarray(x, np.float64)), **attrs).numpy()


def _dtypes(device, op):
    return [d for d in ("float32", "float64") if d in {d for k in opr.plugins.registry().kernels_for(op, device.kind)
                                                        for d in k.dtypes}]


@pytest.mark.parametrize("shape, attrs", MAX_COMBOS, ids=[f"{s}-{a}" for s, a in MAX_COMBOS])
def test_max_pool2d_agrees_with_torch(device, rng, shape, attrs):
    for dtype in _dtypes(device, "max_pool2d"):
        x = rng.standard_normal(shape).astype(dtype)
        out = opr.max_pool2d(x, device=device, **attrs).numpy()
        want = _torch(F.max_pool2d, x, **attrs)
        assert out.shape == want.shape and out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out.astype(np.float64), want)  # a max is one of the inputs: exact


@pytest.mark.parametrize("shape, attrs", AVG_COMBOS, ids=[f"{s}-{a}" for s, a in AVG_COMBOS])
def test_avg_pool2d_agrees_with_torch(device, rng, shape, attrs):
    for dtype in _dtypes(device, "avg_pool2d"):
        x = rng.standard_normal(shape).astype(dtype)
        out = opr.avg_pool2d(x, device=device, **attrs).numpy()
        want = _torch(F.avg_pool2d, x, **attrs)
        assert out.shape == want.shape and out.dtype == np.dtype(dtype)
        assert rel_err(out, want) < TOLERANCE[dtype]


@pytest.mark.parametrize("shape, size", ADAPTIVE_COMBOS, ids=[f"{s}-{a}" for s, a in ADAPTIVE_COMBOS])
def test_adaptive_avg_pool2d_agrees_with_torch(device, rng, shape, size):
    for dtype in _dtypes(device, "adaptive_avg_pool2d"):
        x = rng.standard_normal(shape).astype(dtype)
        out = opr.adaptive_avg_pool2d(x, size, device=device).numpy()
        want = _torch(F.adaptive_avg_pool2d, x, output_size=size)
        assert out.shape == want.shape and out.dtype == np.dtype(dtype)
        assert rel_err(out, want) < TOLERANCE[dtype]


def test_non_contiguous_inputs_agree_with_torch(device, rng):
    base = rng.standard_normal((2, 3, 12, 9)).astype(np.float32)
    for view in (base.transpose(0, 1, 3, 2), base[:, :, :, ::2], base[:, ::2]):
        for fn, tfn, attrs in ((opr.max_pool2d, F.max_pool2d, dict(kernel_size=3, stride=2, padding=1)),
                               (opr.avg_pool2d, F.avg_pool2d, dict(kernel_size=2, padding=1, count_include_pad=False)),
                               (opr.adaptive_avg_pool2d, F.adaptive_avg_pool2d, dict(output_size=(2, 3)))):
            want = _torch(tfn, view, **attrs)
            assert rel_err(fn(view, device=device, **attrs).numpy(), want) < TOLERANCE["float32"]


# -- special semantics ---------------------------------------------------------------------------------
def test_nan_in_a_max_window_gives_nan_as_torch(device, rng):
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan  # first tap of the first window: a max that starts from NaN
    x[0, 1, 3, 4] = np.nan  # a later tap of an inner window
    x[0, 0, 5, 5] = np.inf
    for attrs in (dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=3, stride=1)):
        out = opr.max_pool2d(x, device=device, **attrs).numpy()
        want = _torch(F.max_pool2d, x, **attrs)
        assert np.isnan(want).any()
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        np.testing.assert_array_equal(out[~np.isnan(out)], want[~np.isnan(want)])


def test_a_window_of_padding_only_is_minus_inf(device, rng):
    x = rng.standard_normal((1, 2, 2, 2)).astype(np.float32)
    out = opr.max_pool2d(x, 2, padding=1, dilation=3, device=device).numpy()
    want = _torch(F.max_pool2d, x, kernel_size=2, padding=1, dilation=3)
    assert out.shape == (1, 2, 1, 1) and np.all(want == -np.inf)
    np.testing.assert_array_equal(out, want)


def test_ceil_mode_shapes_follow_torch_rule():
    """The last window must start inside the input or its left padding."""
    op = OPS["max_pool2d"]
    for h, k, s, p, d in itertools.product((1, 2, 5, 6, 7, 10), (1, 2, 3), (1, 2, 3), (0, 1), (1, 2)):
        if p > k // 2:
            continue
        for ceil in (False, True):
            try:
                want = F.max_pool2d(torch.zeros(1, 1, h, h), k, s, p, d, ceil).shape
            except RuntimeError:
                with pytest.raises((ShapeError, AttributeValueError)):
                    op.normalize([(1, 1, h, h)], dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil))
                continue
            got = op.normalize([(1, 1, h, h)], dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil))
            assert got.out_shape == tuple(want), (h, k, s, p, d, ceil)


def test_avg_divisor_at_the_padded_edge_with_ceil_mode(device):
    """torch counts a ceil-mode window only up to the right padding (count_include_pad) or
    the input (without): ones in, the divisor's reciprocal pattern out."""
    x = np.ones((1, 1, 6, 6), np.float32)
    for include in (True, False):
        out = opr.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=include, device=device).numpy()
        want = _torch(F.avg_pool2d, x, kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=include)
        assert out.shape == (1, 1, 4, 4)
        np.testing.assert_allclose(out, want, rtol=1e-6)
    assert want[0, 0, 3, 3] == 1.0 and out[0, 0, 0, 3] == 1.0  # without the padding: a mean of ones


def test_defaults_unbatched_and_none_in_output_size(device, rng):
    x = rng.standard_normal((3, 8, 10)).astype(np.float32)
    assert opr.max_pool2d(x, 2, device=device).shape == (3, 4, 5)  # stride defaults to the kernel
    assert opr.max_pool2d(x, 2, stride=(), device=device).shape == (3, 4, 5)  # as torch's stride=[]
    assert opr.avg_pool2d(x, (2, 5), device=device).shape == (3, 4, 2)
    assert opr.adaptive_avg_pool2d(x, (None, 3), device=device).shape == (3, 8, 3)
    assert opr.adaptive_avg_pool2d(x, (None, None), device=device).shape == (3, 8, 10)
    np.testing.assert_allclose(opr.adaptive_avg_pool2d(x, (None, None), device=device).numpy(), x, rtol=1e-6)


def test_empty_results(device):
    out = opr.max_pool2d(np.zeros((0, 3, 5, 5), np.float32), 2, device=device)
    assert out.shape == (0, 3, 2, 2)
    assert opr.avg_pool2d(np.zeros((0, 3, 5, 5), np.float32), 3, padding=1, device=device).shape == (0, 3, 2, 2)
    assert opr.adaptive_avg_pool2d(np.zeros((2, 0, 4, 4), np.float32), 2, device=device).shape == (2, 0, 2, 2)
    assert opr.adaptive_avg_pool2d(np.zeros((2, 3, 4, 4), np.float32), (0, 2), device=device).shape == (2, 3, 0, 2)


def test_half_types_agree_with_the_reference(device, rng):
    import ml_dtypes

    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    for dtype, np_t in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        xd = x.astype(np_t)
        for fn, attrs in ((opr.max_pool2d, dict(kernel_size=3, stride=2, padding=1)),
                          (opr.avg_pool2d, dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
                          (opr.adaptive_avg_pool2d, dict(output_size=1)),
                          (opr.adaptive_avg_pool2d, dict(output_size=(2, 3)))):
            if dtype not in {d for k in opr.plugins.registry().kernels_for(fn.__name__, device.kind) for d in k.dtypes}:
                continue
            out = fn(xd, device=device, **attrs).numpy()
            assert out.dtype == np.dtype(np_t)
            ref = OPS[fn.__name__].reference(xd.astype(np.float64), **attrs)
            assert rel_err(out.astype(np.float64), ref) < TOLERANCE[dtype], (dtype, fn.__name__)


# -- errors --------------------------------------------------------------------------------------------
X = np.zeros((2, 3, 5, 5), np.float32)

ERRORS = [
    (lambda: opr.max_pool2d(X, 0), AttributeValueError, "max_pool2d: kernel_size must be an int or a pair"),
    (lambda: opr.max_pool2d(X, (2, 3, 4)), AttributeValueError, "kernel_size must be an int or a pair"),
    (lambda: opr.max_pool2d(X, 2.0), AttributeValueError, "kernel_size must be an int or a pair"),
    (lambda: opr.max_pool2d(X, 2, stride=0), AttributeValueError, "stride must be an int or a pair of ints, each >= 1"),
    (lambda: opr.max_pool2d(X, 2, padding=-1), AttributeValueError, "padding must be an int or a pair of ints, each >= 0"),
    (lambda: opr.max_pool2d(X, 3, padding=2), AttributeValueError,
     r"padding 2 along H is more than half the kernel size 3; use padding <= 1"),
    (lambda: opr.max_pool2d(X, 3, padding=2, dilation=2), AttributeValueError, "more than half the kernel size"),
    (lambda: opr.avg_pool2d(X, (3, 2), padding=(1, 2)), AttributeValueError, "padding 2 along W"),
    (lambda: opr.max_pool2d(X, 2, dilation=0), AttributeValueError, "dilation must be an int or a pair"),
    (lambda: opr.max_pool2d(X, 2, ceil_mode=1), AttributeValueError, "max_pool2d: ceil_mode must be a bool"),
    (lambda: opr.avg_pool2d(X, 2, count_include_pad="yes"), AttributeValueError, "count_include_pad must be a bool"),
    (lambda: opr.max_pool2d(X, 6), ShapeError, r"output would be empty \(0x0\).*smaller kernel_size"),
    (lambda: opr.max_pool2d(X, 3, dilation=3), ShapeError, "output would be empty"),
    (lambda: opr.avg_pool2d(X, 2, dilation=2), TypeError, "dilation"),
    (lambda: opr.max_pool2d(np.zeros((5, 5), np.float32), 2), ShapeError, r"4-D \(N, C, H, W\) or 3-D"),
    (lambda: opr.max_pool2d(np.zeros((2, 0, 5, 5), np.float32), 2), ShapeError,
     "C, H and W must be at least 1"),
    (lambda: opr.avg_pool2d(np.zeros((0, 5, 5), np.float32), 2), ShapeError, "C, H and W must be at least 1"),
    (lambda: opr.adaptive_avg_pool2d(X, -1), AttributeValueError,
     "adaptive_avg_pool2d: output_size must be an int >= 0 or a pair"),
    (lambda: opr.adaptive_avg_pool2d(X, (2,)), AttributeValueError, "output_size must be"),
    (lambda: opr.adaptive_avg_pool2d(X, (2, 3, 4)), AttributeValueError, "output_size must be"),
    (lambda: opr.adaptive_avg_pool2d(X, 2.0), AttributeValueError, "output_size must be"),
    (lambda: opr.adaptive_avg_pool2d(X, None), AttributeValueError, "output_size must be"),
    (lambda: opr.adaptive_avg_pool2d(np.zeros((2, 3, 0, 5), np.float32), 2), ShapeError,
     "H and W must be at least 1"),
    (lambda: opr.adaptive_avg_pool2d(np.zeros((3, 5), np.float32), 2), ShapeError, "4-D"),
    (lambda: opr.max_pool2d(np.zeros((1, 1, 4, 4), np.int32), 2), opr.errors.DtypeError, "int32"),
]


@pytest.mark.parametrize("call, exc, match", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_errors_name_the_op_the_attribute_and_the_fix(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_torch_raises_where_we_raise():
    """The validation follows torch's: every call refused above is refused by torch too."""
    tx = torch.zeros(2, 3, 5, 5)
    for fn, args, kwargs in [
        (F.max_pool2d, (0,), {}), (F.max_pool2d, (2,), dict(stride=0)), (F.max_pool2d, (3,), dict(padding=2)),
        (F.max_pool2d, (3,), dict(padding=2, dilation=2)), (F.max_pool2d, (6,), {}),
        (F.max_pool2d, (3,), dict(dilation=3)), (F.avg_pool2d, ((3, 2),), dict(padding=(1, 2))),
        (F.adaptive_avg_pool2d, (-1,), {}), (F.adaptive_avg_pool2d, ((2, 3, 4),), {}),
    ]:
        with pytest.raises((RuntimeError, ValueError, TypeError)):
            fn(tx, *args, **kwargs)
    with pytest.raises(RuntimeError):
        F.max_pool2d(torch.zeros(2, 0, 5, 5), 2)
    with pytest.raises(RuntimeError):
        F.adaptive_avg_pool2d(torch.zeros(2, 3, 0, 5), 2)


def test_unknown_attribute_is_named():
    with pytest.raises(UnknownAttributeError, match="avg_pool2d.*dilation"):
        OPS["avg_pool2d"].normalize([(1, 1, 4, 4)], dict(kernel_size=2, dilation=1))


# -- the CUDA kernels' geometry, emulated on the host -----------------------------------------------------
class _StandInProvider:
    index, sm_count = 0, 132

    def figures(self):
        from opruntime_cupy import memory

        return memory.figures_for("NVIDIA H100 80GB HBM3", self.sm_count)


class _StandIn:
    name, kind, provider = "stand-in", "cuda", _StandInProvider()


def _cuda_problem(op: str, shape, attrs, strides=None, dtype="float32") -> Problem:
    norm = OPS[op].normalize([shape], dict(attrs))
    return Problem(op, _StandIn(), norm.shapes, (dtype,), (strides or c_strides(norm.shapes[0]),),
                   Attrs(norm.attrs), norm.out_shape, dtype)


def _direct_writes(problem: Problem, config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How often the direct kernels' threads reach each output column, row and plane, following
    pool.cu's loops exactly (the three loops are independent: an output is written once when its
    column, row and plane each are reached once)."""
    from opruntime_cupy import pool

    opt = config.get("opt", 1)
    (tx, ty, tz), (gx, gy, gz) = (block := pool._block(problem, config["threads"], opt)), pool._grid(
        problem, block, opt)
    assert tx * ty * tz <= 1024 and tz <= 64 and gy <= 65535 and gz <= 65535
    n, c = problem.shapes[0][:2]
    oh_n, ow_n = problem.out_shape[2:]
    cols, rows, planes = np.zeros(ow_n, np.int64), np.zeros(oh_n, np.int64), np.zeros(n * c, np.int64)
    for t in range(gx * tx):  # ow0 = (blockIdx.x * blockDim.x + threadIdx.x) * OPT, then OPT outputs
        cols[t * opt:min(t * opt + opt, ow_n)] += 1
    for t in range(gy * ty):  # oh = blockIdx.y * blockDim.y + threadIdx.y; oh += gridDim.y * blockDim.y
        rows[t::gy * ty] += 1
    for t in range(gz * tz):  # the same over planes along z
        planes[t::gz * tz] += 1
    return cols, rows, planes


GEOMETRIES = [
    ("max_pool2d", (32, 64, 112, 112), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool2d", (2, 3, 9, 11), dict(kernel_size=3)),
    ("avg_pool2d", (1, 2, 1, 67), dict(kernel_size=(1, 3), stride=(1, 2))),
    ("avg_pool2d", (3, 7, 40, 5), dict(kernel_size=2, stride=1, padding=1)),
    ("adaptive_avg_pool2d", (2, 3, 9, 11), dict(output_size=(3, 4))),
    ("adaptive_avg_pool2d", (1, 1, 300, 2), dict(output_size=(150, 1))),
]


@pytest.mark.parametrize("op, shape, attrs", GEOMETRIES, ids=[f"{o}-{s}" for o, s, _ in GEOMETRIES])
def test_cuda_direct_kernels_write_every_output_once(op, shape, attrs):
    from opruntime_cupy import pool

    problem = _cuda_problem(op, shape, attrs)
    kernel = next(k for k in pool.kernels() if k.op == op and k.name.endswith("direct"))
    for config in kernel.candidates(problem):
        assert all(np.all(hits == 1) for hits in _direct_writes(problem, config)), config
        assert 0 < kernel.estimate(problem, config) < 1e-2


def _global_writes(problem: Problem, config) -> np.ndarray:
    """How often the warp-group global kernel writes each plane (pool.cu's GLOBAL_WARP_LOOP)."""
    from opruntime_cupy import pool

    _, _, group = pool._global_layout(problem)
    threads, planes = config["threads"], math.prod(problem.shapes[0][:2])
    resident = problem.device.provider.sm_count * max(1, 2048 // threads)
    hits = np.zeros(planes, np.int64)
    if group == 0:
        grid = min(planes, resident)
        for b in range(grid):
            hits[np.arange(b, planes, grid)] += 1
        return hits
    grid = max(1, min(-(-planes // (threads // 32 * (32 // group))), resident * pool.WAVES))
    per_warp, step = 32 // group, grid * threads // 32 * (32 // group)
    for warp in range(grid * threads // 32):
        for p0 in range(warp * per_warp, planes, step):
            for lane in range(0, 32, group):  # lane gl == 0 of each group writes
                p = p0 + lane // group
                if p < planes:
                    hits[p] += 1
    return hits


@pytest.mark.parametrize("shape, strides, want", [
    ((32, 2048, 7, 7), None, (True, False, 16)),
    ((4, 8, 8, 8), None, (True, True, 4)),
    ((1, 3, 224, 224), None, (True, False, 0)),
    ((2, 3, 9, 8), (216, 72, 1, 9), (False, False, 32)),
    ((3, 5, 1, 1), None, (True, False, 1)),
])
def test_cuda_global_pool_layout_and_coverage(shape, strides, want):
    from opruntime_cupy import pool

    problem = _cuda_problem("adaptive_avg_pool2d", shape, dict(output_size=1), strides)
    assert pool._global_layout(problem) == want
    kernel = next(k for k in pool.kernels() if k.name == "cupy.adaptive_avg_pool2d.global")
    assert kernel.supports(problem)
    direct = next(k for k in pool.kernels() if k.name == "cupy.adaptive_avg_pool2d.direct")
    for config in kernel.candidates(problem):
        assert np.all(_global_writes(problem, config) == 1), config
        assert kernel.estimate(problem, config) < direct.estimate(problem, direct.candidates(problem)[0])


def test_cuda_build_variants_name_the_source():
    from opruntime_cupy import pool

    variants = pool.build_variants()
    assert {f for f, _ in variants} == {"pool.cu"}
    assert {d["DTYPE"] for _, d in variants} == {0, 1, 2, 3}
    assert any(d["FIXED"] and d["KH"] == 3 and d["SH"] == 2 for _, d in variants)
