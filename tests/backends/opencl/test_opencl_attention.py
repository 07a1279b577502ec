"""The OpenCL scaled_dot_product_attention kernel (``opruntime_opencl/attention.py``): every tile
config of both menus against the float64 reference (odd sizes, size-1 dims, GQA and broadcast
batches, boolean and additive masks broadcast every way, causal with L < S and L > S, E != Ev up
to 256, strided and offset views read in place), fully masked rows, NaN in a mask, long sequences
with no L x S buffer, and the config menu's limits.

Kernels are called as the runtime calls them (``kernel.launcher(problem, config)(*views)``, the
views the frontend makes); runs on every OpenCL device present (PoCL here, the NVIDIA platform on
the GPU machine, where the tests carry the ``gpu`` marker).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err

import opruntime as opr
from opruntime.ops import OPS
from opruntime.ops.base import wide
from opruntime.plugins import registry

pytest.importorskip("pyopencl", reason="pyopencl not installed")
from opruntime_opencl import attention as cl_attention  # noqa: E402  (after the skip)

OP = "scaled_dot_product_attention"
SDPA = OPS[OP]


def _opencl_devices() -> list:
    out = []
    for d in registry().devices:
        if d.kind == "opencl":
            marks = [pytest.mark.gpu] if d.provider.accelerator else []
            out.append(pytest.param(d.name, marks=marks, id=d.name))
    return out


DEVICES = _opencl_devices()
if not DEVICES:
    pytest.skip(f"no OpenCL device: {registry().unavailable.get('opencl', 'unknown reason')}", allow_module_level=True)


@pytest.fixture(params=DEVICES)
def ocl(request) -> opr.Device:
    return registry().device(request.param)


def kernel() -> opr.Kernel:
    return registry().kernels[cl_attention.NAME]


# -- operands: placed on the device, then viewed there (strided views are read in place) -------------------
def T(x):
    """A transposed view of the last two dims: stored as (..., C, R) on the device."""
    return ("T", x)


def every_other(x):
    """Rows 1, 3, 5, ... of a buffer twice as long (dim -2): a row stride of 2 rows, an offset."""
    return ("slice", x)


def place(device: opr.Device, arrays: list) -> tuple[list, list]:
    """(device arrays, host arrays with the same values) for ``arrays``: plain host arrays, or
    ``T(host)`` / ``every_other(host)`` for views made on the device."""
    prov = device.provider
    datas, hosts = [], []
    for a in arrays:
        if isinstance(a, tuple) and a[0] == "T":
            h = a[1]
            d = prov.from_host(np.ascontiguousarray(np.swapaxes(h, -1, -2)))
            d = prov.permute(d, (*range(h.ndim - 2), h.ndim - 1, h.ndim - 2))
        elif isinstance(a, tuple) and a[0] == "slice":
            h = a[1]
            wide_ = np.zeros((*h.shape[:-2], 2 * h.shape[-2] + 1, h.shape[-1]), h.dtype)
            wide_[..., 1::2, :] = h
            d = prov.from_host(wide_)
            d = prov.getitem(d, (*(slice(0, n, 1) for n in h.shape[:-2]), slice(1, 2 * h.shape[-2] + 1, 2),
                                 slice(0, h.shape[-1], 1)))
        else:
            h, d = a, prov.from_host(a)
        assert tuple(d.shape) == h.shape
        datas.append(d)
        hosts.append(h)
    return datas, hosts


def solve(device: opr.Device, config, arrays: list, **attrs) -> tuple[np.ndarray, np.ndarray]:
    """(the kernel's result with ``config``, the float64 reference) for ``arrays`` (see :func:`place`)."""
    prov = device.provider
    datas, hosts = place(device, arrays)
    problem, norm, casts = SDPA.problem(datas, device, dict(attrs))
    assert not any(casts)
    views = [d if tuple(d.shape) == s else prov.reshape(d, s) for d, s in zip(datas, norm.shapes)]
    k = kernel()
    assert k.supports(problem)
    cfg = config if config is not None else k.candidates(problem)[0]
    out = k.launcher(problem, cfg)(*views)
    assert tuple(out.shape) == problem.out_shape and out.dtype == np.dtype(problem.dtype)
    got = prov.to_host(out).reshape(norm.result_shape)
    return got, SDPA.reference(*wide(hosts), **attrs)


def check(got: np.ndarray, want: np.ndarray, dtype: str, what: str = "") -> None:
    err = rel_err(got, want)
    assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


def fitting(device: opr.Device, shapes, dtype: str = "float32", **attrs) -> list[dict]:
    """Every config of both menus that fits ``device`` for a problem of ``shapes``."""
    p = SDPA.problem_for(device, shapes, dtype, **attrs)
    return [c for c in cl_attention.CONFIGS if cl_attention.fits(device.provider, p, c)]


# -- every config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", cl_attention.CONFIGS, ids=lambda c: "x".join(str(v) for v in c.values()))
def test_every_config_matches_the_reference(ocl, config):
    """Each tile config on problems that cross its tile edges: GQA (4 query heads on 2) with a
    boolean mask broadcast over heads, E != Ev, a transposed k and a strided, offset v; causal with
    L > S and L < S; a broadcast batch with an additive mask broadcast over the keys."""
    rng = np.random.default_rng(7)
    if config not in fitting(ocl, [(2, 4, 37, 24), (2, 2, 45, 24), (2, 2, 45, 20)], enable_gqa=True):
        pytest.skip(f"{config} does not fit {ocl.name}")
    q, k, v = random(rng, (2, 4, 37, 24), "float32"), random(rng, (2, 2, 45, 24), "float32"), \
        random(rng, (2, 2, 45, 20), "float32")
    mask = rng.random((2, 1, 37, 45)) > 0.3
    got, want = solve(ocl, config, [q, T(k), every_other(v), mask], enable_gqa=True)
    check(got, want, "float32", "gqa + bool mask + views")
    for L, S in ((70, 45), (13, 150)):  # causal rows past the last key; keys past the last row
        q, k, v = (random(rng, (1, 3, n, 16), "float32") for n in (L, S, S))
        got, want = solve(ocl, config, [q, k, v], is_causal=True)
        check(got, want, "float32", f"causal L={L} S={S}")
    q, k = random(rng, (3, 1, 29, 8), "float32"), random(rng, (1, 1, 67, 8), "float32")
    bias = random(rng, (29, 1), "float32")  # one column broadcast over the keys
    got, want = solve(ocl, config, [q, k, k, bias], scale=0.7)
    check(got, want, "float32", "broadcast batch + additive mask")


@pytest.mark.parametrize("shapes,attrs", [
    (((1, 1, 20, 256), (1, 1, 19, 256), (1, 1, 19, 200)), dict(is_causal=True)),
    (((2, 3, 9, 8), (2, 3, 33, 8), (2, 3, 33, 256)), {}),
    (((1, 1, 5, 1), (1, 1, 70, 1), (1, 1, 70, 3)), {}),
    (((1, 1, 1, 16), (1, 1, 1, 16), (1, 1, 1, 16)), {}),
    (((1, 1, 1, 64), (1, 1, 300, 64), (1, 1, 300, 64)), dict(is_causal=True)),  # one query sees one key
    (((1, 2, 200, 96), (1, 2, 3, 96), (1, 2, 3, 40)), dict(is_causal=True)),
], ids=["e256-ev200", "ev256", "e1", "one", "causal-1row", "causal-3keys"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_head_dims_and_size_one_dims(ocl, shapes, attrs, dtype):
    if not ocl.provider.dtype_ok(dtype):
        pytest.skip(f"{ocl.name} does not compute {dtype}")
    rng = np.random.default_rng(3)
    got, want = solve(ocl, None, [random(rng, s, dtype) for s in shapes], **attrs)
    check(got, want, dtype)


def test_masks_broadcast_every_way_and_read_through_strides(ocl):
    rng = np.random.default_rng(11)
    q, k, v = random(rng, (2, 4, 19, 16), "float32"), random(rng, (2, 4, 23, 16), "float32"), \
        random(rng, (2, 4, 23, 12), "float32")
    for shape in ((19, 23), (1, 23), (19, 1), (2, 1, 1, 23), (2, 4, 19, 23), (4, 1, 1)):
        keep = rng.random(shape) > 0.4
        bias = random(rng, shape, "float32")
        for mask in (keep, bias, T(keep), T(bias)):
            got, want = solve(ocl, None, [q, k, v, mask])
            check(got, want, "float32", f"mask {shape}")


# -- masked rows and NaN -----------------------------------------------------------------------------------
@pytest.mark.parametrize("small", [False, True], ids=["first-config", "smallest-tiles"])
def test_fully_masked_rows_give_zeros_and_late_keys_count(ocl, small):
    """Row 1 masks every key (zeros, bool and -inf); row 2 sees only keys past the first key tiles
    (its running maximum starts at -inf: the rescale by exp2(-inf) must not poison it); row 4 only
    the last key."""
    rng = np.random.default_rng(5)
    L, S = 9, 150
    q, k, v = random(rng, (2, 3, L, 16), "float32"), random(rng, (2, 3, S, 16), "float32"), \
        random(rng, (2, 3, S, 8), "float32")
    keep = rng.random((L, S)) > 0.3
    keep[1] = False
    keep[2, :130] = False
    keep[4] = False
    keep[4, -1] = True
    bias = np.where(keep, 0.0, -np.inf).astype(np.float32)
    configs = fitting(ocl, [q.shape, k.shape, v.shape, keep.shape], _mask="bool")
    config = min(configs, key=lambda c: c["BM"] * c["BN"]) if small else None
    for mask in (keep, bias):
        got, want = solve(ocl, config, [q, k, v, mask])
        assert (want[:, :, 1] == 0).all()
        check(got, want, "float32")
        assert (got[:, :, 1] == 0).all()


def test_nan_in_an_additive_mask_gives_nan_rows(ocl):
    rng = np.random.default_rng(6)
    q, k = random(rng, (2, 2, 7, 16), "float32"), random(rng, (2, 2, 140, 16), "float32")
    bias = random(rng, (7, 140), "float32")
    bias[2, 3] = np.nan  # in the first key tile
    bias[5, 139] = np.nan  # in the last
    got, want = solve(ocl, None, [q, k, k, bias])
    assert np.isnan(got[:, :, [2, 5]]).all()
    assert not np.isnan(np.delete(got, [2, 5], axis=2)).any()
    check(got, want, "float32")


def test_the_frontend_runs_it_on_opencl(ocl):
    rng = np.random.default_rng(8)
    q, k = random(rng, (2, 5, 16), "float32"), random(rng, (2, 9, 16), "float32")
    tq, tk = opr.tensor(q, device=ocl), opr.tensor(k, device=ocl)
    assert opr.explain(OP, tq, tk, tk, is_causal=True).chosen.startswith(cl_attention.NAME)
    out = opr.scaled_dot_product_attention(tq, tk, tk, is_causal=True)
    assert out.device == ocl
    check(out.numpy(), SDPA.reference(*wide([q, k, k]), is_causal=True), "float32")


# -- long sequences: no L x S buffer -----------------------------------------------------------------------
def _long(device: opr.Device, H: int, L: int, S: int, E: int, causal: bool, rows: list[int]) -> None:
    """Run the kernel the heuristic picks on (1, H, L, E) x (1, H, S, E); check ``rows`` of the
    output against a float64 reference of those rows only, and that the one allocation the call
    makes is the output (no L x S buffer, no gathered copies)."""
    rng = np.random.default_rng(9)
    prov = device.provider
    q, k, v = (random(rng, (1, H, n, E), "float32") for n in (L, S, S))
    datas = [prov.from_host(x) for x in (q, k, v)]
    problem, _, _ = SDPA.problem(datas, device, dict(is_causal=causal))
    kern = kernel()
    launch = kern.launcher(problem, kern.candidates(problem)[0])
    sizes = []
    empty = prov.empty

    def counting(shape, dtype):
        sizes.append(math.prod(shape) * np.dtype(dtype).itemsize)
        return empty(shape, dtype)

    prov.empty = counting
    try:
        out = launch(*datas)
        prov.synchronize()
    finally:
        del prov.empty  # the instance attribute: the class's method again
    assert sizes == [H * L * E * 4], f"allocations {sizes}"
    got = prov.to_host(out)[:, :, rows]
    want = SDPA.reference(q[:, :, rows].astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    if causal:  # row i sees keys 0..i
        want = np.stack([SDPA.reference(q[:, :, [i]].astype(np.float64), k[:, :, :i + 1].astype(np.float64),
                                        v[:, :, :i + 1].astype(np.float64))[:, :, 0] for i in rows], axis=2)
    check(got, want, "float32", f"S={S}")


def test_a_long_sequence_8192(ocl):
    """S = 8192 keys (and queries), 2 heads: the L x S float32 scores would be 512 MiB."""
    _long(ocl, H=2, L=8192, S=8192, E=128, causal=False, rows=[0, 1, 4097, 8191])
    _long(ocl, H=2, L=8192, S=8192, E=64, causal=True, rows=[0, 63, 64, 5000, 8191])


@pytest.mark.slow
def test_a_long_sequence_32768(ocl):
    """The issue's size: B = 1, H = 8, E = 128, L = S = 32768, causal (2.2 TFLOP: ~1.5-2 min on 2
    PoCL cores, well under a second on a GPU): 32 GiB of scores as an L x S buffer."""
    _long(ocl, H=8, L=32768, S=32768, E=128, causal=True, rows=[0, 1, 12345, 32767])


# -- the menu ---------------------------------------------------------------------------------------------
def test_configs_fit_the_device_and_rank_by_cost(ocl):
    prov = ocl.provider
    for shapes, dtype in (([(1, 8, 4096, 128)] * 3, "float32"), ([(2, 4, 33, 256), (2, 4, 70, 256), (2, 4, 70, 256)],
                                                                  "float64"),
                          ([(1, 1, 64, 512), (1, 1, 64, 512), (1, 1, 64, 512)], "float32")):
        if not prov.dtype_ok(dtype):
            continue
        p = SDPA.problem_for(ocl, shapes, dtype)
        cands = kernel().candidates(p)
        assert cands, f"no config for {shapes} {dtype}"
        costs = [kernel().estimate(p, c) for c in cands]
        assert all(math.isfinite(c) and c > 0 for c in costs) and costs == sorted(costs)
        for c in cands:
            assert cl_attention.local_bytes(p, c) <= prov.local_mem
            assert c["TPR"] * c["BM"] // c["RM"] <= prov.max_wg


def test_float16_needs_the_extension(ocl):
    p = SDPA.problem_for(ocl, [(1, 1, 8, 16)] * 3, "float16")
    assert kernel().supports(p) == ocl.provider.has_fp16


def test_causal_skips_key_tiles_past_the_diagonal():
    assert cl_attention._key_tiles(128, 128, 64, 32, False) == 2 * 4
    assert cl_attention._key_tiles(128, 128, 64, 32, True) == 2 + 4
    assert cl_attention._key_tiles(200, 40, 64, 32, True) == 2 + 2 + 2 + 2  # every tile past S sees all keys
