"""The CUDA backend's scaled_dot_product_attention kernels (``opruntime_cupy/attention.py``), each
kernel x config directly.

CPU part (runs everywhere): the kernel table, the parameter block's layout against the C struct,
the geometry (broadcast strides zeroed, GQA groups, when 16-byte copies apply), the configs that
fit in shared memory, the cost ranking, and a NumPy emulation of the flash kernel's schedule that
reads the operands through the very strides and groups the launcher passes (tiles, causal skips
and edges, the mask's index, the base-2 online softmax, rows with every key masked), checked
against the float64 reference on every case of the operator.

GPU part (``-m gpu``, skipped with the reason without CuPy or a CUDA device): every kernel and
every config in every dtype it declares against the float64 reference at odd sizes, causal and
not, boolean and additive masks broadcast every way, GQA, E in {16, 64, 96, 128, 256}, E != Ev,
transposed / strided / misaligned views, rows with every key masked (zeros) and NaN masks (NaN
rows), and S = 32768 (B=1, H=8, E=128) on a few rows. Seeds are fixed: a failure reproduces.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from cupy_stand_in import StandInDevice
from opruntime_cupy import attention

from opruntime.kernels import Problem, c_strides
from opruntime.ops import OPS
from opruntime.testing.numerics import TOLERANCE, rel_err

ATTENTION = OPS["scaled_dot_product_attention"]
STAND_IN = StandInDevice()
NAMES = {f"cupy.scaled_dot_product_attention.{v}" for v in ("flash", "flash_wgmma", "flash_f32", "simt", "composite")}


def kernel(variant: str):
    return next(k for k in attention.kernels() if k.name == f"cupy.scaled_dot_product_attention.{variant}")


def host_problem(q, k, v=None, mask=None, dtype="float16", device=STAND_IN, strides=None, **attrs) -> Problem:
    """The Problem of C-contiguous operands (``mask``: ("bool" | "float", shape))."""
    shapes = [q, k, v if v is not None else k] + ([mask[1]] if mask else [])
    if mask:
        attrs["_mask"] = mask[0]
    norm = ATTENTION.normalize(shapes, attrs)
    dtypes = (dtype,) * 3 + ((("bool" if mask[0] == "bool" else dtype),) if mask else ())
    strides = strides or tuple(c_strides(s) for s in norm.shapes)
    return Problem(ATTENTION.name, device, norm.shapes, dtypes, strides, norm.attrs, norm.out_shape, dtype)


# -- CPU: the table, the parameter block, the geometry ------------------------------------------------


def test_kernel_table_covers_every_cuda_dtype():
    from opruntime_cupy import softmax

    table = {k.name: k for k in attention.kernels()}
    assert set(table) == NAMES
    assert all(k.prepare is not None and k.run is None and k.op == ATTENTION.name for k in table.values())
    assert table["cupy.scaled_dot_product_attention.flash"].dtypes == {"float16", "bfloat16"}
    assert table["cupy.scaled_dot_product_attention.flash_f32"].dtypes == {"float32"}
    assert table["cupy.scaled_dot_product_attention.flash_wgmma"].dtypes == {"float16", "bfloat16"}
    covered = set().union(*(k.dtypes for k in table.values()))
    assert covered == softmax.DTYPES  # every dtype the backend's other kernels declare, float64 included
    assert table["cupy.scaled_dot_product_attention.simt"].dtypes == softmax.DTYPES


def test_parameter_block_matches_the_c_struct():
    """``struct AttnParams``: four i64[4], ten ints, two floats, a double; natural alignment."""
    P = attention.AttnParams
    assert [(n, getattr(P, n).offset) for n in ("sq", "sk", "sv", "sm", "B", "Ev", "gq", "gm", "scale_log2",
                                                  "scale")] == [
        ("sq", 0), ("sk", 32), ("sv", 64), ("sm", 96), ("B", 128), ("Ev", 148), ("gq", 152), ("gm", 164),
        ("scale_log2", 168), ("scale", 176)]
    assert ctypes.sizeof(P) == 184
    text = attention.cc.source(attention.SOURCE)
    struct = text[text.index("struct AttnParams {"):text.index("};", text.index("struct AttnParams {"))]
    assert [w for w in ("sq[4]", "sk[4]", "sv[4]", "sm[4]", "int B, H, L, S, E, Ev", "int gq, gk, gv, gm",
                        "float scale_log2", "float pad_", "double scale") if w not in struct] == []


def test_geometry_zeroes_broadcast_strides_and_counts_groups():
    p = host_problem((2, 8, 9, 32), (2, 2, 12, 32), (2, 2, 12, 24), enable_gqa=True, is_causal=True)
    g = attention.geometry(p)
    assert (g.B, g.H, g.L, g.S, g.E, g.Ev) == (2, 8, 9, 12, 32, 24)
    assert g.groups == (1, 4, 4, 1) and g.causal and g.mask is None
    assert g.strides[0] == (8 * 9 * 32, 9 * 32, 32, 1) and g.strides[1] == (2 * 12 * 32, 12 * 32, 32, 1)
    assert g.strides[3] == (0, 0, 0, 0)
    assert g.scale == pytest.approx(1 / math.sqrt(32))
    # broadcast batch, heads, mask rows and columns: stride 0 (b % 1 == b * 0)
    p = host_problem((2, 4, 5, 8), (1, 4, 6, 8), (2, 1, 6, 8), mask=("float", (2, 1, 1, 6)))
    g = attention.geometry(p)
    assert g.strides[1][0] == 0 and g.strides[2][1] == 0 and g.groups == (1, 1, 4, 4)
    assert g.strides[3] == (6, 0, 0, 1) and g.mask == "float"
    p = host_problem((1, 2, 33, 96), (1, 2, 70, 96), (1, 2, 70, 40), mask=("bool", (33, 1)))
    g = attention.geometry(p)
    assert g.strides[3] == (0, 0, 1, 0) and g.mask == "bool" and g.groups[3] == 2
    params = g.params()
    assert list(params.sm) == [0, 0, 1, 0] and params.gm == 2
    assert params.scale_log2 == pytest.approx(g.scale * math.log2(math.e), rel=1e-6)


def test_sixteen_byte_copies_need_unit_last_strides_and_aligned_rows():
    assert attention.geometry(host_problem((1, 2, 33, 64), (1, 2, 70, 64))).vec("float16")
    assert attention.geometry(host_problem((1, 2, 33, 40), (1, 2, 70, 40))).vec("float16")  # 80 bytes a row
    assert not attention.geometry(host_problem((1, 2, 33, 36), (1, 2, 70, 36))).vec("float16")
    assert attention.geometry(host_problem((1, 2, 33, 36), (1, 2, 70, 36), dtype="float32")).vec("float32")
    assert not attention.geometry(host_problem((2, 1, 7, 5), (2, 1, 9, 5), (2, 1, 9, 3))).vec("float16")
    # k transposed in memory (a "T" view): its last stride is not 1
    shapes = [(1, 1, 12, 16), (1, 1, 20, 16), (1, 1, 20, 16)]
    strides = (c_strides(shapes[0]), (320, 320, 1, 20), c_strides(shapes[2]))
    assert not attention.geometry(host_problem(*shapes, strides=strides)).vec("float16")
    # every other row (a "slice" view): row stride 2 E, still 16-byte copies
    strides = (c_strides(shapes[0]), (640, 640, 32, 1), c_strides(shapes[2]))
    assert attention.geometry(host_problem(*shapes, strides=strides)).vec("float16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("e,ev", [(1, 1), (16, 16), (64, 64), (96, 40), (128, 128), (200, 256), (256, 256)])
def test_flash_configs_fit_in_shared_memory(dtype, e, ev):
    k = kernel("flash_f32" if dtype == "float32" else "flash")
    p = host_problem((2, 4, 100, e), (2, 4, 300, e), (2, 4, 300, ev), dtype=dtype, is_causal=True)
    assert k.supports(p)
    d, dv = attention.flash_dims(p)
    assert d >= e and dv >= ev and d % 8 == 0 and dv % 8 == 0
    cfgs = list(k.candidates(p))
    assert cfgs and all(attention.flash_smem(dtype, d, dv, c["BM"], c["BN"]) <= attention.SMEM_MAX for c in cfgs)
    assert all(c["WARPS"] * 16 == c["BM"] for c in cfgs)
    assert all(0 < k.estimate(p, c) < 1 for c in cfgs)
    label = attention.label(k.name, p, attention.flash_defines(p, cfgs[0], True))
    assert label.startswith(k.name + "[") and "causal" in label and f"D={d}" in label


def test_head_dims_over_256_are_declined():
    for name in ("flash", "simt"):
        assert not kernel(name).supports(host_problem((1, 1, 8, 264), (1, 1, 8, 264)))
        assert not kernel(name).supports(host_problem((1, 1, 8, 64), (1, 1, 8, 64), (1, 1, 8, 300)))


def test_simt_tiles_fit_every_dtype():
    for dtype in ("float64", "float32", "float16"):
        for e in (1, 40, 128, 256):
            p = host_problem((1, 2, 50, e), (1, 2, 70, e), dtype=dtype)
            cfgs = list(kernel("simt").candidates(p))
            assert cfgs, (dtype, e)
            for c in cfgs:
                bn, smem = attention.simt_bn(p, c["WARPS"])
                assert (c["WARPS"] * 32) % bn == 0 and smem <= attention.SMEM_MAX


def test_costs_rank_flash_first_on_the_bench_shapes():
    for dtype, flash in (("float16", "flash"), ("bfloat16", "flash"), ("float32", "flash_f32")):
        for causal in (True, False):
            p = host_problem((4, 16, 4096, 128), (4, 16, 4096, 128), dtype=dtype, is_causal=causal)
            best = {name: min(kernel(name).estimate(p, c) for c in kernel(name).candidates(p))
                    for name in (flash, "simt", "composite")}
            assert best[flash] < best["composite"] < best["simt"], (dtype, causal, best)
    # the composite declines a score buffer past its limit (B=1, H=8, S=L=32768 in float32: 32 GiB)
    assert not kernel("composite").supports(host_problem((1, 8, 32768, 128), (1, 8, 32768, 128)))
    assert kernel("flash").supports(host_problem((1, 8, 32768, 128), (1, 8, 32768, 128)))


def test_build_variants_cover_each_family_and_dtype():
    variants = attention.build_variants()
    assert all(f == "attention.cu" for f, _ in variants)
    seen = {(d["FAMILY"], d["DTYPE"]) for _, d in variants}
    assert {(1, 0), (1, 1), (1, 2), (4, 1), (4, 2)} <= seen and {(2, c) for c in range(4)} <= seen and {(3, c) for c in range(4)} <= seen
    flash = [d for _, d in variants if d["FAMILY"] == 1]
    assert {d["CAUSAL"] for d in flash} == {0, 1} and {d["MASK"] for d in flash} == {0, 1, 2}
    assert {d["VEC"] for d in flash} == {0, 1} and {64, 128, 256} <= {d["D"] for d in flash}
    assert all(attention.flash_smem({0: "float32", 1: "float16", 2: "bfloat16"}[d["DTYPE"]], d["D"], d["DV"], d["BM"],
                                    d["BN"]) <= attention.SMEM_MAX for d in flash)


# -- CPU: the flash kernel's schedule, emulated --------------------------------------------------------


def _flat(x: np.ndarray) -> np.ndarray:
    """The memory under a view with non-negative strides, from its first element."""
    if x.size == 0:
        return x.reshape(-1)
    extent = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.strides)) // x.itemsize
    return np.lib.stride_tricks.as_strided(x, (extent,), (x.itemsize,))


def emulate_flash(problem: Problem, cfg, q, k, v, mask=None) -> np.ndarray:
    """The flash kernel's schedule in float64 NumPy: operands read from their memory through the
    launcher's params (strides with broadcast zeros, head groups), query tiles of BM rows in warps
    of 16, key tiles of BN, causal tiles past the block never visited and past a warp skipped,
    edges masked, the mask at base + min(i, L - 1) * sm2 + j * sm3, base-2 online softmax, l == 0
    rows zeros."""
    g = attention.geometry(problem)
    p = g.params()
    fq, fk, fv = _flat(q), _flat(k), _flat(v)
    fm = _flat(mask) if mask is not None else None
    BM, BN, L, S, E, Ev = cfg["BM"], cfg["BN"], g.L, g.S, g.E, g.Ev
    out = np.zeros((g.B * g.H, L, Ev))
    cols_e, cols_v = np.arange(E), np.arange(Ev)
    with np.errstate(invalid="ignore", over="ignore"):
        for bh in range(g.B * g.H):
            b, h = divmod(bh, g.H)
            qb = b * p.sq[0] + h // p.gq * p.sq[1]
            kb = b * p.sk[0] + h // p.gk * p.sk[1]
            vb = b * p.sv[0] + h // p.gv * p.sv[1]
            mb = b * p.sm[0] + h // p.gm * p.sm[1]
            for m0 in range(0, L, BM):
                rows = m0 + np.arange(BM)
                qt = np.where((rows < L)[:, None], fq[qb + np.minimum(rows, L - 1)[:, None] * p.sq[2] + cols_e * p.sq[3]],
                              0.0).astype(np.float64)
                n_end = min(S, m0 + BM) if g.causal else S
                m_r = np.full(BM, -np.inf)
                l_r = np.zeros(BM)
                acc = np.zeros((BM, Ev))
                for n0 in range(0, n_end, BN):
                    keys = n0 + np.arange(BN)
                    kin = np.minimum(keys, S - 1)
                    kt = np.where((keys < S)[:, None], fk[kb + kin[:, None] * p.sk[2] + cols_e * p.sk[3]], 0.0)
                    vt = np.where((keys < S)[:, None], fv[vb + kin[:, None] * p.sv[2] + cols_v * p.sv[3]], 0.0)
                    s = (qt @ kt.astype(np.float64).T) * (g.scale * attention.LOG2E)  # (float32 in the kernel)
                    if fm is not None:
                        mv = fm[mb + np.minimum(rows, L - 1)[:, None] * p.sm[2] + kin[None, :] * p.sm[3]]
                        if g.mask == "bool":
                            s = np.where(mv, s, -np.inf)
                        else:
                            s = s + mv.astype(np.float64) * attention.LOG2E
                    for w0 in range(0, BM, 16):  # per warp: skip, edge, update
                        wr0 = m0 + w0
                        if g.causal and n0 > wr0 + 15:
                            continue
                        sw = s[w0:w0 + 16]
                        if n0 + BN > S or (g.causal and n0 + BN - 1 > wr0):
                            dead = (keys[None, :] >= S) | (g.causal & (keys[None, :] > rows[w0:w0 + 16, None]))
                            sw = np.where(dead, -np.inf, sw)
                        mx = np.maximum(m_r[w0:w0 + 16], np.max(sw, axis=1, initial=-np.inf, where=~np.isnan(sw)))
                        base = np.where(mx == -np.inf, 0.0, mx)
                        alpha = np.exp2(m_r[w0:w0 + 16] - base)
                        pw = np.exp2(sw - base[:, None])
                        l_r[w0:w0 + 16] = l_r[w0:w0 + 16] * alpha + pw.sum(axis=1)
                        acc[w0:w0 + 16] = acc[w0:w0 + 16] * alpha[:, None] + pw @ vt.astype(np.float64)
                        m_r[w0:w0 + 16] = mx
                inv = np.where(l_r == 0, 0.0, 1.0 / np.where(l_r == 0, 1.0, l_r))
                n = min(BM, L - m0)
                out[bh, m0:m0 + n] = (acc * inv[:, None])[:n]
    return out.reshape(problem.out_shape)


def _host_views(case, rng):
    """The case's operands as the frontend would hand them to a kernel: host arrays (float64 for
    the emulation), each operand's view as the case says, reshaped to 4-D as the problem says."""
    arrays = []
    for i, shape in enumerate(case.shapes):
        view = case.views[i] if i < len(case.views) else None
        if i in case.bools:
            arrays.append(rng.standard_normal(shape) > -0.5)
            continue
        if view == "T":
            base = rng.standard_normal(shape[:-2] + (shape[-1], shape[-2]))
            arrays.append(np.swapaxes(base, -1, -2))
        elif view == "slice":
            base = rng.standard_normal(shape[:-1] + (2 * shape[-1],))
            arrays.append(base[..., ::2])
        else:
            arrays.append(rng.standard_normal(shape))
    return arrays


@pytest.mark.parametrize("case", ATTENTION.cases, ids=[c.id for c in ATTENTION.cases])
def test_flash_schedule_emulated_matches_the_reference(case):
    rng = np.random.default_rng(7)
    arrays = _host_views(case, rng)
    problem, norm, _ = ATTENTION.problem(arrays, STAND_IN, dict(case.attrs))
    views = [a if a.shape == s else a.reshape(s) for a, s in zip(arrays, norm.shapes)]
    ref = ATTENTION.reference(*arrays, **case.attrs).reshape(problem.out_shape)
    for cfg in ({"BM": 64, "BN": 32}, {"BM": 128, "BN": 64}, {"BM": 16, "BN": 16}):
        out = emulate_flash(problem, cfg, *views)
        assert rel_err(out, ref) < 1e-12, (case.id, cfg)


def test_emulated_rows_with_every_key_masked_are_zeros_and_nan_masks_nan_rows():
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((1, 2, 40, 16)), rng.standard_normal((1, 2, 70, 16))
    mask = rng.standard_normal((1, 2, 40, 70)) > -0.5
    mask[0, 1, 5] = False
    mask[0, 0, 39] = False
    p, norm, _ = ATTENTION.problem([q, k, k, mask], STAND_IN, {})
    out = emulate_flash(p, {"BM": 64, "BN": 32}, q, k, k, mask)
    assert not out[0, 1, 5].any() and not out[0, 0, 39].any()
    assert rel_err(out, ATTENTION.reference(q, k, k, mask)) < 1e-12
    add = rng.standard_normal((40, 70))
    add[7, 69] = np.nan
    p, _, _ = ATTENTION.problem([q, k, k, add], STAND_IN, {})
    out = emulate_flash(p, {"BM": 64, "BN": 32}, q, k, k, add[None, None])
    assert np.isnan(out[:, :, 7]).all() and not np.isnan(np.delete(out, 7, axis=2)).any()


# -- GPU -----------------------------------------------------------------------------------------------


def _gpu_reason() -> str | None:
    try:
        import cupy
    except Exception as exc:
        return f"cupy not installed ({exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no CUDA device: {exc}"
    return None if n else "no CUDA device"


@pytest.fixture(scope="module")
def cp():
    reason = _gpu_reason()
    if reason:
        pytest.skip(reason)
    import cupy

    return cupy


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def to_device(cp, x: np.ndarray, dtype: str):
    """A host float64 / bool array as a C-contiguous device array of ``dtype``."""
    if x.dtype == np.bool_:
        return cp.asarray(x)
    if dtype == "bfloat16":
        from opruntime_cupy import memory

        if memory.bfloat16() is None:
            pytest.skip("CuPy cannot hold bfloat16 arrays here")
        return cp.asarray(x.astype(np.float32).astype(_bf16()).view(np.uint16)).view(_bf16())
    return cp.asarray(x.astype(dtype))


def to_host(cp, x) -> np.ndarray:
    if x.dtype == _bf16():
        return cp.asnumpy(x.view(cp.uint16)).view(_bf16())
    return cp.asnumpy(x)


def reshape(cp, x, shape):
    if x.shape == shape:
        return x
    if x.dtype == _bf16():
        return x.view(cp.uint16).reshape(shape).view(_bf16())
    return x.reshape(shape)


def device_case(cp, rng, dtype, q, k, v=None, mask=None, views=(), **attrs):
    """(device operands, as the user passes them; attrs). ``mask``: ("bool" | "float", shape) or an
    explicit host array; ``views`` per operand: None, "T" (made transposed, seen swapped back),
    "slice" (every other row of a taller array) or "offset" (a column window starting one
    element in: a base address that is not 16-byte aligned)."""
    shapes = [q, k, v if v is not None else k]
    hosts = [rng.standard_normal(s) for s in shapes]
    if mask is not None:
        if isinstance(mask, np.ndarray):
            hosts.append(mask)
        elif mask[0] == "bool":
            hosts.append(rng.standard_normal(mask[1]) > -0.5)
        else:
            hosts.append(rng.standard_normal(mask[1]))
    out = []
    for i, h in enumerate(hosts):
        view = views[i] if i < len(views) else None
        if view == "T":
            out.append(to_device(cp, np.ascontiguousarray(np.swapaxes(h, -1, -2)), dtype).swapaxes(-1, -2))
        elif view == "slice":
            tall = np.repeat(h, 2, axis=-2)
            out.append(to_device(cp, tall, dtype)[..., ::2, :])
        elif view == "offset":
            wide = np.concatenate([h[..., :1], h, np.zeros(h.shape[:-1] + (7,))], axis=-1)
            out.append(to_device(cp, wide, dtype)[..., 1:1 + h.shape[-1]])
        else:
            out.append(to_device(cp, h, dtype))
    return out, attrs


def check(cp, name: str, cfg, datas, attrs, dtype: str, what: str = "") -> None:
    """Run ``name`` with ``cfg`` (None: its first candidate) on the device operands and compare
    with the float64 reference."""
    import opruntime as opr

    k = kernel(name)
    problem, norm, casts = ATTENTION.problem(list(datas), opr.Device("cuda:0"), dict(attrs))
    if name == "flash_wgmma" and not attention._sm90(problem):
        pytest.skip("wgmma needs an sm_90 device")
    assert problem.dtype == dtype and not any(casts), (problem, casts)
    assert k.supports(problem), f"{k.name} declines {problem}"
    cfg = cfg if cfg is not None else k.candidates(problem)[0]
    views = [reshape(cp, d, s) for d, s in zip(datas, norm.shapes)]
    cp.full(math.prod(problem.out_shape) + 64, np.nan, np.float32)  # NaN in the pool: unwritten output shows
    out = k(problem, cfg, *views)
    assert out.shape == problem.out_shape and out.dtype == datas[0].dtype
    hosts = [to_host(cp, d) for d in datas]
    ref = ATTENTION.reference(*hosts, **attrs).reshape(problem.out_shape)
    err = rel_err(to_host(cp, out).astype(np.float64), ref)
    assert err <= TOLERANCE[dtype], f"{k.name}[{cfg}] {what} {problem}: relative error {err:.2e}"


#: (kernel variant, dtype): every kernel in every dtype it declares
KERNEL_DTYPES = [("flash", "float16"), ("flash", "bfloat16"), ("flash_wgmma", "float16"), ("flash_wgmma", "bfloat16"),
                 ("flash_f32", "float32")] + [
    (name, d) for name in ("simt", "composite") for d in ("float64", "float32", "float16", "bfloat16")]

#: every config of every kernel runs these: E 64 / 128 / 96, causal and not, both masks, GQA, odd sizes
CORE = [
    dict(q=(2, 3, 67, 64), k=(2, 3, 131, 64)),
    dict(q=(1, 2, 129, 128), k=(1, 2, 77, 128), is_causal=True),
    dict(q=(2, 4, 70, 96), k=(2, 2, 70, 96), enable_gqa=True, is_causal=True),
    dict(q=(2, 2, 70, 128), k=(2, 2, 83, 128), mask=("bool", (2, 2, 70, 83))),
    dict(q=(1, 2, 33, 64), k=(1, 2, 150, 64), mask=("float", (2, 1, 1, 150))),
]

#: the first (heuristic) config runs these: head dims 16..256, E != Ev, size-1 dims, L > S
#: causal, broadcast batch / heads / mask rows / columns, views
EDGE = [
    dict(q=(1, 1, 1, 16), k=(1, 1, 1, 16)),
    dict(q=(3, 1, 5, 16), k=(3, 1, 9, 16), v=(3, 1, 9, 8)),
    dict(q=(1, 2, 13, 16), k=(1, 2, 5, 16), is_causal=True),  # rows past the last key see every key
    dict(q=(2, 8, 9, 32), k=(2, 2, 12, 32), v=(2, 2, 12, 24), enable_gqa=True, is_causal=True),
    dict(q=(2, 4, 5, 8), k=(1, 4, 6, 8), v=(2, 1, 6, 8)),
    dict(q=(1, 1, 20, 256), k=(1, 1, 19, 256), v=(1, 1, 19, 200), is_causal=True),
    dict(q=(2, 1, 130, 256), k=(2, 1, 133, 256), mask=("bool", (2, 1, 130, 133))),
    dict(q=(1, 2, 33, 96), k=(1, 2, 70, 96), v=(1, 2, 70, 40), mask=("float", (33, 1))),
    dict(q=(1, 4, 17, 64), k=(1, 2, 80, 64), mask=("float", (17, 80)), enable_gqa=True, scale=0.3),
    dict(q=(2, 3, 7, 5), k=(2, 3, 9, 5), v=(2, 3, 9, 3), mask=("bool", (1, 1, 7, 9))),
    dict(q=(2, 2, 12, 16), k=(2, 2, 20, 16), views=("T", "T", "T")),
    dict(q=(2, 2, 9, 64), k=(2, 2, 11, 64), v=(2, 2, 11, 32), views=("slice", "slice", "slice"), is_causal=True),
    dict(q=(1, 3, 40, 64), k=(1, 3, 50, 64), views=("offset", "offset", "offset")),
    dict(q=(1, 2, 300, 128), k=(1, 2, 300, 128), is_causal=True),
]


def _ids(cases):
    return ["-".join(f"{k}={v}" for k, v in c.items()).replace(" ", "") for c in cases]


def _run(cp, name, dtype, cases, every_config: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for spec in cases:
        spec = dict(spec)
        datas, attrs = device_case(cp, rng, dtype, **spec)
        import opruntime as opr

        problem, _, _ = ATTENTION.problem(list(datas), opr.Device("cuda:0"), dict(attrs))
        if name == "flash_wgmma":
            if not attention._sm90(problem):
                pytest.skip("wgmma needs an sm_90 device")
            if not attention.geometry(problem).vec(dtype):
                assert not kernel(name).supports(problem)  # element loads: flash's, not this kernel's
                continue
        cfgs = list(kernel(name).candidates(problem))
        assert cfgs, (name, spec)
        for cfg in cfgs if every_config else cfgs[:1]:
            check(cp, name, cfg, datas, attrs, dtype, str(spec))


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", KERNEL_DTYPES, ids=[f"{n}-{d}" for n, d in KERNEL_DTYPES])
@pytest.mark.parametrize("index", range(len(CORE)), ids=_ids(CORE))
def test_every_config_core_cases(cp, name, dtype, index):
    _run(cp, name, dtype, [CORE[index]], every_config=True, seed=index)


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", KERNEL_DTYPES, ids=[f"{n}-{d}" for n, d in KERNEL_DTYPES])
def test_edge_cases_first_config(cp, name, dtype):
    _run(cp, name, dtype, EDGE, every_config=False, seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", KERNEL_DTYPES, ids=[f"{n}-{d}" for n, d in KERNEL_DTYPES])
def test_fully_masked_rows_are_zeros_and_nan_masks_give_nan_rows(cp, name, dtype):
    rng = np.random.default_rng(5)
    mask = rng.standard_normal((2, 2, 70, 90)) > -0.5
    mask[0, 1, 3] = False
    mask[1, 0, 69] = False
    datas, attrs = device_case(cp, rng, dtype, (2, 2, 70, 64), (2, 2, 90, 64), mask=mask)
    check(cp, name, None, datas, attrs, dtype, "dead rows")
    add = rng.standard_normal((70, 90))
    add[4, 17] = np.nan
    datas, attrs = device_case(cp, rng, dtype, (1, 2, 70, 64), (1, 2, 90, 64), mask=add)
    check(cp, name, None, datas, attrs, dtype, "NaN mask")


LONG = [("flash", "float16"), ("flash", "bfloat16"), ("flash_wgmma", "float16"), ("flash_wgmma", "bfloat16"),
        ("flash_f32", "float32")]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", LONG, ids=[f"{n}-{d}" for n, d in LONG])
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequence_no_score_buffer(cp, name, dtype, causal):
    """S = L = 32768, B=1, H=8, E=128: runs (no L x S buffer) and a few rows of each head match."""
    import opruntime as opr
    rng = np.random.default_rng(17)
    S, E = 32768, 128
    hosts = [rng.standard_normal((1, 8, S, E)) for _ in range(3)]
    datas = [to_device(cp, h, dtype) for h in hosts]
    hosts = [to_host(cp, d).astype(np.float64) for d in datas]
    problem, _, _ = ATTENTION.problem(datas, opr.Device("cuda:0"), {"is_causal": causal})
    k = kernel(name)
    if name == "flash_wgmma" and not attention._sm90(problem):
        pytest.skip("wgmma needs an sm_90 device")
    assert not kernel("composite").supports(problem)
    out = to_host(cp, k(problem, k.candidates(problem)[0], *datas)).astype(np.float64)
    rows = [0, 1, 63, 64, 4095, 20001, S - 1]
    q, kk, v = hosts
    for h in range(8):
        for i in rows:
            n = i + 1 if causal else S
            s = kk[0, h, :n] @ q[0, h, i] / math.sqrt(E)
            p = np.exp(s - s.max())
            ref = (p / p.sum()) @ v[0, h, :n]
            err = rel_err(out[0, h, i], ref)
            assert err <= TOLERANCE[dtype], (h, i, err)


@pytest.mark.gpu
def test_frontend_picks_a_fused_kernel_on_cuda(cp):
    import opruntime as opr

    rng = np.random.default_rng(2)
    q = opr.tensor(rng.standard_normal((2, 4, 200, 64)).astype(np.float16), device="cuda:0")
    k = opr.tensor(rng.standard_normal((2, 4, 300, 64)).astype(np.float16), device="cuda:0")
    out = opr.scaled_dot_product_attention(q, k, k, is_causal=True)
    ref = ATTENTION.reference(q.numpy(), k.numpy(), k.numpy(), is_causal=True)
    assert rel_err(out.numpy().astype(np.float64), ref) <= TOLERANCE["float16"]
    chosen = opr.explain("scaled_dot_product_attention", q, k, k, is_causal=True).chosen
    assert chosen and chosen.split("[")[0].split(".")[-1] not in ("simt", "composite"), chosen  # flash or cudnn
