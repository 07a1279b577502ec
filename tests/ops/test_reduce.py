"""sum, mean and amax: the errors (typed, naming the op, the operand and the fix), the edge
semantics (0-D input, ``axis=()``, sums and means over nothing, NaN through amax), agreement with
NumPy in float64 on every device, float32 accumulation of float16, and the layout the CUDA and
OpenCL kernels read (the collapse to ``(outer, n, inner)``, and the CUDA launch geometry covering
every element exactly once, checked here without a GPU)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err, skip_unless_dtype

import opruntime as opr
from opruntime.errors import AttributeValueError, ShapeError, UnknownAttributeError
from opruntime.kernels import Attrs, Problem, c_strides, reduction_plan
from opruntime.kernels import reduction_layout as canonical
from opruntime.ops.reduce import axes_of

OPS = {"sum": opr.sum, "mean": opr.mean, "amax": opr.amax}
NUMPY = {"sum": np.sum, "mean": np.mean, "amax": np.max}


# -- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize(("axis", "words"), [
    ((0, 0), ["twice", "give each axis once"]),
    ((1, -2), ["twice"]),
    (3, ["out of range", "-3..2"]),
    (-4, ["out of range"]),
    (1.0, ["an int, a tuple of ints or None"]),
    (True, ["an int, a tuple of ints or None"]),
    ((0, "1"), ["no int"]),
    ("0", ["an int, a tuple of ints or None"]),
])
def test_bad_axes_are_typed_and_say_how_to_fix(op, axis, words):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(AttributeValueError) as info:
        OPS[op](x, axis=axis)
    msg = str(info.value)
    assert msg.startswith(f"{op}:") and all(w in msg for w in words), msg


@pytest.mark.parametrize("op", list(OPS))
def test_other_attribute_errors(op):
    with pytest.raises(AttributeValueError, match="keepdims must be True or False"):
        OPS[op](np.ones(3, np.float32), keepdims=1)
    with pytest.raises(AttributeValueError, match="0-D input.*axis=None"):
        OPS[op](np.float32(2.0), axis=0)
    with pytest.raises(UnknownAttributeError, match="dim"):
        OPS[op].operator(np.ones(3, np.float32), dim=0)


def test_amax_over_nothing_is_a_shape_error_naming_the_axis():
    with pytest.raises(ShapeError) as info:
        opr.amax(np.ones((3, 0, 2), np.float32), axis=(0, 1))
    msg = str(info.value)
    assert "amax: axis 1" in msg and "(3, 0, 2)" in msg and "non-zero size" in msg
    with pytest.raises(ShapeError):
        opr.amax(np.ones((0,), np.float32))
    # a size-0 kept axis is no error: the result is empty
    assert opr.amax(np.ones((0, 4), np.float32), axis=1).shape == (0,)


def test_axes_of_normalises_every_form():
    assert axes_of("sum", (2, 3, 4), None) == (0, 1, 2)
    assert axes_of("sum", (2, 3, 4), -1) == (2,)
    assert axes_of("sum", (2, 3, 4), (2, 0)) == (0, 2)
    assert axes_of("sum", (2, 3, 4), [-1, 1]) == (1, 2)
    assert axes_of("sum", (2, 3, 4), np.int64(1)) == (1,)
    assert axes_of("sum", (2, 3, 4), ()) == ()
    assert axes_of("sum", (), None) == ()


# -- edge semantics, on every device ---------------------------------------------------------------
def test_sum_and_mean_over_nothing(device):
    x = np.ones((3, 0, 2), np.float32)
    s = opr.sum(x, axis=1, device=device)
    assert s.shape == (3, 2) and s.device == device and (s.numpy() == 0).all()
    m = opr.mean(x, axis=(1,), keepdims=True, device=device)
    assert m.shape == (3, 1, 2) and np.isnan(m.numpy()).all() and m.dtype == np.float32
    assert float(opr.sum(np.ones((0,), np.float32), device=device).numpy()) == 0.0
    assert np.isnan(float(opr.mean(np.ones((0, 5), np.float32), device=device).numpy()))
    assert opr.sum(np.ones((0, 4), np.float32), axis=1, device=device).shape == (0,)


@pytest.mark.parametrize("op", list(OPS))
def test_zero_d_input_reduces_to_itself(device, op):
    for axis in (None, ()):
        out = OPS[op](np.float32(-2.5), axis=axis, device=device)
        assert out.shape == () and float(out.numpy()) == -2.5


@pytest.mark.parametrize("op", list(OPS))
def test_empty_axis_tuple_reduces_nothing(device, op):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out = OPS[op](x, axis=(), device=device)
    assert out.shape == (3, 4) and np.array_equal(out.numpy(), x)


def test_nan_propagates_through_amax(device):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    rows = opr.amax(x, axis=1, device=device).numpy()
    assert np.isnan(rows[1]) and rows[2] == np.inf and rows[0] == 5 and rows[3] == 23
    cols = opr.amax(x, axis=0, device=device).numpy()
    assert np.isnan(cols[3]) and not np.isnan(np.delete(cols, 3)).any()
    assert np.isnan(float(opr.amax(x, device=device).numpy()))
    neg = -np.ones((5, 7), np.float32) * np.inf
    assert (opr.amax(neg, axis=1, device=device).numpy() == -np.inf).all()


def test_sum_and_mean_propagate_specials(device):
    x = np.ones((3, 5), np.float32)
    x[0, 1], x[1, 2], x[2, 0], x[2, 4] = np.nan, np.inf, np.inf, -np.inf
    s = opr.sum(x, axis=1, device=device).numpy()
    assert np.isnan(s[0]) and s[1] == np.inf and np.isnan(s[2])


# -- agreement with NumPy ----------------------------------------------------------------------------
SHAPES = [((5, 7, 9), None, False), ((5, 7, 9), 1, True), ((5, 7, 9), (0, 2), False), ((5, 7, 9), (-1, -2), True),
          ((1, 1, 9), (0, 1), False), ((2, 3, 4, 5), (1, 3), False), ((4099,), 0, False), ((3, 2051), -1, False),
          ((2051, 3), 0, True)]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize(("shape", "axis", "keepdims"), SHAPES)
def test_float64_agrees_with_numpy(device, op, shape, axis, keepdims):
    skip_unless_dtype(device, op, "float64")
    x = np.random.default_rng(1).standard_normal(shape)
    out = OPS[op](x, axis=axis, keepdims=keepdims, device=device)
    want = NUMPY[op](x, axis=axis, keepdims=keepdims)
    assert out.shape == want.shape and out.dtype == np.float64
    assert rel_err(out.numpy(), want) <= TOLERANCE["float64"]
    if op == "amax":
        assert np.array_equal(out.numpy(), want)  # a maximum is exact


@pytest.mark.parametrize("op", list(OPS))
def test_transposed_and_sliced_views(device, op):
    x = np.random.default_rng(2).standard_normal((6, 5, 8)).astype(np.float32)
    data = device.provider.from_host(x)
    views = {}
    try:
        views["T"] = (data.transpose((2, 0, 1)), x.transpose((2, 0, 1)))
        views["slice"] = (data[:, 1:, ::2], x[:, 1:, ::2])
    except Exception:  # noqa: BLE001 - an array type without such views (JAX makes copies)
        pytest.skip(f"{device.name} arrays cannot make these views")
    for data_v, host_v in views.values():
        for axis in (None, 0, (1, 2), (0, 2), -1):
            out = OPS[op](opr.Tensor._wrap(data_v, device), axis=axis)
            assert rel_err(out.numpy(), NUMPY[op](host_v.astype(np.float64), axis=axis)) <= TOLERANCE["float32"]


# -- 16-bit accumulation -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_accumulates_in_float32(device, dtype):
    """fp16 sums of ones stall at 2048 (2049 is no fp16), bf16 at 256: a float32 accumulator
    reaches 4096 exactly, which both types represent."""
    skip_unless_dtype(device, "sum", dtype)
    from opruntime.kernels import np_dtype

    ones = np.ones((3, 4096), np_dtype(dtype))
    s = opr.sum(ones, axis=1, device=device)
    assert s.dtype == np_dtype(dtype) and (s.numpy().astype(np.float64) == 4096).all()
    assert float(opr.sum(ones[0], device=device).numpy()) == 4096
    assert float(opr.sum(ones.T.copy(), axis=0, device=device).numpy()[0]) == 4096
    assert (opr.mean(ones, axis=1, device=device).numpy().astype(np.float64) == 1).all()


# -- the layout kernels read -----------------------------------------------------------------------
def test_canonical_collapses_adjacent_dims():
    c = c_strides
    assert canonical((4, 5, 6), c((4, 5, 6)), (2,)) == (20, 6, 1, 6, 1, 0)
    assert canonical((4, 5, 6), c((4, 5, 6)), (0,)) == (1, 4, 30, 0, 30, 1)
    assert canonical((4, 5, 6, 7), c((4, 5, 6, 7)), (1, 2)) == (4, 30, 7, 210, 7, 1)
    assert canonical((4, 1, 6), c((4, 1, 6)), (0, 1)) == (1, 4, 6, 0, 6, 1)
    assert canonical((4, 5, 6), c((4, 5, 6)), (0, 2)) is None  # a kept dim between
    assert canonical((40, 24), (1, 40), (0, 1)) == (1, 960, 1, 0, 1, 0)  # a transpose, fully reduced
    assert canonical((40, 24), (1, 40), (1,)) == (40, 24, 1, 1, 40, 0)
    assert canonical((3, 4, 5), (40, 10, 2), (1,)) == (3, 4, 5, 40, 10, 2)
    assert canonical((3, 4, 5), (1, 15, 3), (2,)) is None  # kept dims that do not merge
    assert canonical((), (), ()) == (1, 1, 1, 0, 0, 0)


def _cuda_problem(op: str, shape: tuple[int, ...], strides: tuple[int, ...], axes: tuple[int, ...], dtype: str):
    provider = types.SimpleNamespace(sm_count=132, index=0, figures=lambda: (60e12, 990e12, 3.35e12))
    out = tuple(n for i, n in enumerate(shape) if i not in axes)
    return Problem(op, types.SimpleNamespace(provider=provider), (shape,), (dtype,), (strides,),
                   Attrs(axis=axes, keepdims=False), out, dtype)


def _emulate_cuda(problem: Problem, family: str, config: dict, x: np.ndarray) -> np.ndarray:
    """The CUDA kernels' index arithmetic (reduce.cu) run on the host with the geometry
    reduce.py computes: every (output, chunk) task and its element range, the partials' layout
    and the finish pass. It checks the host side of the launch without a GPU."""
    import opruntime_cupy.reduce as cuda

    lay, perm = reduction_plan(problem)
    if perm is not None:
        x = np.ascontiguousarray(x.transpose(perm))
    outer, n, inner, so, sn, si = lay
    outputs = outer * inner
    flat = np.ascontiguousarray(x).reshape(-1)  # the problem's strides are C strides (or the copy's)
    if family == "rows":
        splits, chunk = cuda._row_split(problem, lay, config)
    else:
        _, _, splits, chunk = cuda._columns_geometry(problem, lay, config)
    assert 1 <= splits and chunk * splits >= n and chunk * (splits - 1) < n  # every element, no empty chunk
    seen = np.zeros(outputs * n, np.int64)
    part = np.zeros((splits, outputs))
    for o in range(outputs):
        base = (o // inner) * so + (o % inner) * si
        for s in range(splits):
            k0 = s * chunk
            ks = np.arange(k0, min(n, k0 + chunk))
            idx = base + ks * sn
            part[s, o] = flat[idx].astype(np.float64).sum()
            seen[o * n + ks] += 1
    assert (seen == 1).all()
    return part.sum(0)


@pytest.mark.parametrize(("shape", "axes"), [((3, 20001), (1,)), ((20001,), (0,)), ((5000, 7), (0,)),
                                             ((33, 1025), (1,)), ((2, 3, 5), (0, 2)), ((4, 6, 8), (1,))])
@pytest.mark.parametrize("family", ["rows", "columns"])
def test_cuda_launch_geometry_covers_every_element_once(shape, axes, family):
    import opruntime_cupy.reduce as cuda

    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    problem = _cuda_problem("sum", shape, c_strides(shape), axes, "float32")
    for config in (cuda.ROW_CONFIGS if family == "rows" else cuda.COLUMN_CONFIGS):
        got = _emulate_cuda(problem, family, dict(config), x)
        want = x.astype(np.float64).sum(axis=axes).reshape(-1)
        assert np.allclose(got, want)


def test_cuda_vector_loads_only_on_aligned_rows():
    import opruntime_cupy.reduce as cuda

    p = _cuda_problem("sum", (33, 1025), c_strides((33, 1025)), (1,), "float32")
    lay, _ = reduction_plan(p)
    assert not cuda._vec_ok(p, lay, 1, lay[1])  # rows 1025 floats apart: not 16-byte steps
    p = _cuda_problem("sum", (33, 1024), c_strides((33, 1024)), (1,), "float16")
    lay, _ = reduction_plan(p)
    assert cuda._vec_ok(p, lay, 1, lay[1])
    splits, chunk = cuda._row_split(_cuda_problem("sum", (1 << 22,), (1,), (0,), "float16"),
                                    (1, 1 << 22, 1, 0, 1, 0), cuda.ROW_CONFIGS[1])
    assert splits > 1 and chunk % 8 == 0
