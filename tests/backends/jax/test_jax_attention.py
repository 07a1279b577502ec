"""scaled_dot_product_attention on JAX: the three kernels (``xla``: jax.nn.dot_product_attention,
``blocked``: jnp / lax online softmax, ``pallas``: a Pallas flash kernel) against the float64
reference, pinned through the frontend and called directly in every config; the contract's edges
(fully masked rows give zeros, a NaN in the mask a NaN row); the long sequence (S = 32768) on the
blocked kernel; the cost ranking; and every Pallas kernel of the backend lowered for TPUs (Mosaic)
and GPUs (Triton) on this machine through ``jax.export``.

On a CPU-only machine everything runs on ``jax:cpu:0`` (Pallas interpreted); tests on a GPU or TPU
carry ``@pytest.mark.gpu``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

import opruntime as opr
from opruntime.kernels import Attrs, Problem, c_strides
from opruntime.ops import OPS
from opruntime.plugins import registry
from opruntime.testing.numerics import TOLERANCE, np_dtype, rel_err
from opruntime.testing.numerics import random_array as random

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from opruntime_jax import attention, matmul, pallas_attention, pallas_matmul, pallas_softmax

OP = "scaled_dot_product_attention"
ATT = OPS[OP]
KERNELS = [f"jax.{OP}.{v}" for v in ("xla", "blocked", "pallas")]
JAX_DEVICES = [d for d in registry().devices if d.kind == "jax"]
ALL = [pytest.param(d.name, id=d.name, marks=[pytest.mark.gpu] if d.provider.accelerator else []) for d in JAX_DEVICES]
COMPILED = [pytest.param(d.name, id=d.name, marks=[pytest.mark.gpu]) for d in JAX_DEVICES if d.provider.accelerator]


def pinned(kernel: str):
    """``kernel`` pinned, strict: a kernel that cannot run raises, never falls back."""
    return opr.override(ops={OP: {"kernel": kernel}}, strict=True)


def _ref(q, k, v, mask=None, **attrs) -> np.ndarray:
    """The float64 reference of the operands as given (half-precision values taken exactly)."""
    wide = [np.asarray(x, np.float64) for x in (q, k, v)]
    m = None if mask is None else (mask if mask.dtype == np.bool_ else np.asarray(mask, np.float64))
    return ATT.reference(*wide, m, **attrs)


def _check(out: np.ndarray, ref: np.ndarray, dtype: str, what: str = "") -> None:
    err = rel_err(np.asarray(out, np.float64), ref)
    assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


def _skip_dtype(kernel: str, dtype: str) -> None:
    if dtype not in registry().kernels[kernel].dtypes:
        pytest.skip(f"{kernel} has no {dtype}")


def _problem(dev, shapes, dtype: str, mask: str | None = None, **attrs) -> Problem:
    """The Problem the frontend builds for C-contiguous operands of these shapes (``dev`` a
    Device, a device name, or a stub for the cost functions and the exports)."""
    dev = registry().device(dev) if isinstance(dev, str) else dev
    norm = ATT.normalize([tuple(s) for s in shapes], {**attrs, "_mask": mask if len(shapes) > 3 else None})
    dtypes = (dtype,) * 3 + (("bool" if mask == "bool" else dtype),) * (len(shapes) > 3)
    return Problem(OP, dev, norm.shapes, dtypes, tuple(c_strides(s) for s in norm.shapes), norm.attrs,
                   norm.out_shape, dtype)


def solve(kernel: str, dev: str, hosts: list, dtype: str, config=None, **attrs) -> np.ndarray:
    """Run ``kernel`` directly on host operands (already 4-D, as the frontend hands them over)."""
    k, device = registry().kernels[kernel], registry().device(dev)
    prov = device.provider
    mask = None if len(hosts) < 4 else "bool" if hosts[3].dtype == np.bool_ else "float"
    p = _problem(device, [h.shape for h in hosts], dtype, mask, **attrs)
    assert k.supports(p), f"{kernel} declines {p}"
    out = k(p, k.candidates(p)[0] if config is None else config, *(prov.from_host(h) for h in hosts))
    assert prov.owns(out) and out.shape == p.out_shape and out.dtype == np_dtype(dtype)
    return prov.to_host(out)


# -- every kernel pinned through the frontend ---------------------------------------------------------
#: (q, k, v, mask, attrs): causal with L > S and L < S, GQA with E != Ev, broadcast batch and heads,
#: boolean and additive masks broadcast over rows / heads / batches, an explicit scale, 3-D operands
PINNED = [
    ((2, 3, 19, 16), (2, 3, 11, 16), (2, 3, 11, 16), None, {"is_causal": True}),
    ((1, 2, 9, 32), (1, 2, 40, 32), (1, 2, 40, 32), None, {"is_causal": True, "scale": 0.37}),
    ((2, 8, 9, 32), (2, 2, 12, 32), (2, 2, 12, 24), None, {"enable_gqa": True, "is_causal": True}),
    ((2, 4, 5, 8), (1, 4, 6, 8), (2, 1, 6, 8), None, {}),
    ((2, 2, 7, 24), (2, 2, 11, 24), (2, 2, 11, 40), ("bool", (2, 1, 7, 11)), {}),
    ((2, 4, 7, 16), (2, 4, 11, 16), (2, 4, 11, 16), ("float", (2, 1, 1, 11)), {}),
    ((3, 13, 20), (3, 17, 20), (3, 17, 12), ("float", (13, 17)), {}),
]


def _operands(rng, q, k, v, mask, dtype):
    hosts = [random(rng, s, dtype) for s in (q, k, v)]
    if mask is not None:
        kind, shape = mask
        hosts.append(rng.random(shape) > 0.4 if kind == "bool" else random(rng, shape, dtype))
    return hosts


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", range(len(PINNED)))
def test_pinned_through_the_frontend(kernel, dtype, case, rng):
    _skip_dtype(kernel, dtype)
    q, k, v, mask, attrs = PINNED[case]
    hosts = _operands(rng, q, k, v, mask, dtype)
    args = hosts[:3] + ([hosts[3]] if mask else [])
    with pinned(kernel):
        assert opr.explain(OP, *args, device="jax:cpu", **attrs).chosen.startswith(kernel)
        out = opr.scaled_dot_product_attention(*args, device="jax:cpu", **attrs)
    assert out.device.name == "jax:cpu:0" and out.dtype == np_dtype(dtype)
    _check(out.numpy(), _ref(*args, **attrs), dtype, kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_strided_views_through_the_frontend(kernel, rng):
    """Transposed and sliced host views (the frontend places them; JAX arrays are contiguous)."""
    q = random(rng, (2, 16, 12), "float32").swapaxes(-1, -2)  # (2, 12, 16)
    k = random(rng, (2, 16, 20), "float32").swapaxes(-1, -2)
    v = random(rng, (2, 40, 10), "float32")[:, ::2, 1:9]
    mask = random(rng, (20, 12), "float32").T
    with pinned(kernel):
        out = opr.scaled_dot_product_attention(q, k, v, mask, device="jax:cpu")
    _check(out.numpy(), _ref(q, k, v, mask), "float32", kernel)


# -- every config, called directly ----------------------------------------------------------------------
def _block_configs(kernel: str, p: Problem) -> list[dict]:
    """The kernel's own configs, and for the blocked / Pallas kernels small blocks that make many
    query and key blocks (edge blocks, the causal skip, padding past S and L)."""
    cfgs = list(registry().kernels[kernel].candidates(p))
    if kernel.endswith("blocked"):
        cfgs += [{"block_k": 16, "tile": 1}, {"block_k": 32, "tile": 16 * 32 * 6}]
    elif kernel.endswith("pallas"):
        cfgs += [{"block_q": 16, "block_k": 16}, {"block_q": 32, "block_k": 16}]
    return cfgs


DIRECT = [
    ((1, 3, 67, 64), (1, 3, 67, 64), (1, 3, 67, 64), None, {"causal": True}),
    ((1, 2, 70, 16), (1, 2, 45, 16), (1, 2, 45, 8), None, {"causal": True}),  # L > S: the last rows see every key
    ((2, 2, 33, 32), (2, 1, 70, 32), (2, 1, 70, 40), ("bool", (2, 2, 33, 70)), {}),
    ((1, 4, 40, 16), (1, 2, 50, 16), (1, 2, 50, 16), ("float", (1, 1, 40, 1)), {}),
    ((2, 2, 37, 16), (1, 1, 51, 16), (1, 1, 51, 16), ("float", (1, 2, 1, 51)), {}),
]


@pytest.mark.parametrize("dev", ALL)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", range(len(DIRECT)))
def test_every_config(dev, kernel, case, rng):
    q, k, v, mask, attrs = DIRECT[case]
    hosts = _operands(rng, q, k, v, mask, "float32")
    causal = attrs.get("causal", False)
    ref = _ref(*hosts[:3], hosts[3] if mask else None, is_causal=causal, enable_gqa=True)
    p = _problem(dev, [h.shape for h in hosts], "float32", mask and mask[0], is_causal=causal, enable_gqa=True)
    for cfg in _block_configs(kernel, p):
        out = solve(kernel, dev, hosts, "float32", config=cfg, is_causal=causal, enable_gqa=True)
        _check(out, ref, "float32", f"{kernel} {cfg}")


# -- the contract's edges --------------------------------------------------------------------------------
@pytest.mark.parametrize("dev", ALL)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_rows_give_zeros_and_nan_gives_nan(dev, kernel, dtype, rng):
    """jax.nn.dot_product_attention gives such rows the mean of the values (boolean mask) or NaN
    (an all -inf additive row); the contract, as torch, wants zeros. A NaN in the mask: NaN."""
    _skip_dtype(kernel, dtype)
    q, k, v = (random(rng, s, dtype) for s in ((2, 2, 9, 16), (2, 2, 13, 16), (2, 2, 13, 8)))
    keep = rng.random((2, 2, 9, 13)) > 0.3
    keep[0, 1, 3] = False
    keep[1, :, 0] = False
    out = solve(kernel, dev, [q, k, v, keep], dtype)
    assert not out[0, 1, 3].any() and not out[1, :, 0].any()
    _check(out, _ref(q, k, v, keep), dtype, kernel)
    bias = random(rng, (2, 1, 9, 13), dtype)
    bias[0, 0, 2] = -np.inf
    bias[1, 0, 5, :7] = -np.inf
    bias[1, 0, 7, 4] = np.nan
    out = solve(kernel, dev, [q, k, v, bias], dtype)
    assert not out[0, :, 2].any()
    assert np.isnan(out[1, :, 7]).all() and not np.isnan(np.delete(out[1], 7, axis=1)).any()
    _check(out, _ref(q, k, v, bias), dtype, kernel)  # NaN where the reference has NaN, checked exactly


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_key_one_query(kernel, rng):
    q, k, v = (random(rng, (1, 1, 1, 1), "float32") for _ in range(3))
    for causal in (False, True):
        out = solve(kernel, "jax:cpu:0", [q, k, v], "float32", is_causal=causal)
        assert np.array_equal(out, v)


def test_blocked_float64_is_float64(rng):
    q, k, v = (random(rng, s, "float64") for s in ((1, 2, 50, 24), (1, 2, 70, 24), (1, 2, 70, 24)))
    out = solve(f"jax.{OP}.blocked", "jax:cpu:0", [q, k, v], "float64", config={"block_k": 16, "tile": 1},
                is_causal=True)
    assert out.dtype == np.float64
    _check(out, _ref(q, k, v, is_causal=True), "float64")
    assert "float64" not in registry().kernels[f"jax.{OP}.xla"].dtypes  # jax.nn's softmax is float32


# -- long sequences ------------------------------------------------------------------------------------
LONG = (1, 8, 32768, 128)


def test_long_sequence_goes_to_the_blocked_kernel():
    """S = 32768: the XLA kernel would hold 32 GiB of scores, Pallas is interpreted on the CPU."""
    p = _problem("jax:cpu:0", (LONG, LONG, LONG), "float32", is_causal=True)
    status = {k.name: bool(k.supports(p)) for k in registry().kernels_for(OP, "jax")}
    assert status == {f"jax.{OP}.xla": False, f"jax.{OP}.blocked": True, f"jax.{OP}.pallas": False}
    bq, bk = attention.blocked_blocks(p, attention.blocked_configs(p)[0])
    assert bq * bk * LONG[1] * 4 <= 8 << 20  # one step's scores: a few MB, not L x S


@pytest.mark.slow
def test_long_sequence_on_the_blocked_kernel():
    """B=1, H=8, L=S=32768, E=128, causal, through the frontend (the blocked kernel is its choice);
    rows checked against a float64 NumPy reference of those rows (the whole one would be 8 GiB)."""
    rng = np.random.default_rng(7)
    q, k, v = (random(rng, LONG, "float32") for _ in range(3))
    ts = [opr.tensor(x, device="jax:cpu") for x in (q, k, v)]
    assert opr.explain(OP, *ts, is_causal=True).chosen.startswith(f"jax.{OP}.blocked")
    out = opr.scaled_dot_product_attention(*ts, is_causal=True).numpy()
    assert out.shape == LONG and np.isfinite(out).all()
    for r in (0, 1, 255, 256, 4097, 20000, LONG[2] - 1):
        ref = _ref(q[:, :, r:r + 1], k[:, :, :r + 1], v[:, :, :r + 1])
        _check(out[:, :, r:r + 1], ref, "float32", f"row {r}")


# -- cost ranking ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Platform:
    platform: str


@dataclass(frozen=True)
class _StubDevice:
    """Enough of a Device for the cost functions and the builders (they read ``provider.platform``)."""

    name: str
    kind: str
    provider: _Platform


def _stub(plat: str) -> _StubDevice:
    return _StubDevice(f"jax:{plat}:0", "jax", _Platform(plat))


def _ranked(plat: str, B: int, H: int, L: int, S: int, E: int, dtype: str = "float32", causal: bool = False):
    p = _problem(_stub(plat), ((B, H, L, E), (B, H, S, E), (B, H, S, E)), dtype, is_causal=causal)
    est = {k.name.rsplit(".", 1)[1]: k.estimate(p, k.candidates(p)[0])
           for k in registry().kernels_for(OP, "jax") if k.supports(p) and dtype in k.dtypes}
    return min(est, key=est.get), est


def test_estimates():
    """CPU: jax.nn for the tiniest problems only (the blocked kernel measured faster from 64 x 64
    up, 2-3.5x at 1024 x 1024, see attention.XLA_EFF), blocked for long sequences; interpreted
    Pallas never. GPU / TPU: the Pallas flash kernel once the L x S scores are large."""
    assert _ranked("cpu", 1, 1, 16, 16, 16)[0] == "xla"
    for shape in ((1, 8, 256, 256, 64), (1, 8, 1024, 1024, 64), (1, 8, 32768, 32768, 128)):
        for causal in (False, True):
            assert _ranked("cpu", *shape, causal=causal)[0] == "blocked", shape
    assert "pallas" not in _ranked("cpu", 1, 1, 64, 64, 64)[1] or \
        _ranked("cpu", 1, 1, 64, 64, 64)[1]["pallas"] > 10 * _ranked("cpu", 1, 1, 64, 64, 64)[1]["blocked"]
    for plat in ("gpu", "tpu"):
        for dtype in ("float16", "bfloat16"):
            assert _ranked(plat, 1, 1, 8, 8, 16, dtype)[0] != "blocked"
            for shape in ((4, 16, 1024, 1024, 128), (4, 16, 4096, 4096, 128)):
                assert _ranked(plat, *shape, dtype, True)[0] == "pallas"
    assert _ranked("gpu", 1, 8, 32768, 32768, 128, "bfloat16")[0] == "pallas"
    assert _ranked("tpu", 1, 8, 32768, 32768, 128, "bfloat16")[0] == "blocked"  # its keys do not fit VMEM


def test_xla_declines_a_gib_of_scores():
    ok = _problem("jax:cpu:0", ((1, 16, 4096, 64), (1, 16, 4096, 64), (1, 16, 4096, 64)), "float32")  # 1 GiB
    big = _problem("jax:cpu:0", ((1, 16, 4097, 64), (1, 16, 4096, 64), (1, 16, 4096, 64)), "float32")
    xla = registry().kernels[f"jax.{OP}.xla"]
    assert xla.supports(ok) and not xla.supports(big)


# -- Pallas lowers for TPUs (Mosaic) and GPUs (Triton) -------------------------------------------------
def _export(fn, structs, plat: str) -> str:
    """The module text of ``jax.export`` of ``fn`` for ``plat`` (lowering only: no device needed)."""
    checks = []
    if plat == "cuda":  # Triton calls carry no compatibility guarantee: allowed for this check only
        checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    return jax.export.export(jax.jit(fn), platforms=[plat], disabled_checks=checks)(*structs).mlir_module()


def _structs(p: Problem) -> list:
    return [jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in zip(p.shapes, p.dtypes)]


EXPORT_ATTENTION = [
    (((2, 4, 256, 64), (2, 4, 256, 64), (2, 4, 256, 64)), None, {"is_causal": True}),
    (((1, 8, 200, 128), (1, 2, 300, 128), (1, 2, 300, 96)), None, {"enable_gqa": True, "is_causal": True}),
    (((2, 4, 200, 64), (1, 4, 300, 64), (2, 1, 300, 40), (2, 1, 200, 300)), "bool", {}),
    (((2, 4, 130, 64), (2, 4, 500, 64), (2, 4, 500, 64), (1, 1, 1, 500)), "float", {}),
    (((1, 2, 7, 16), (1, 2, 5, 16), (1, 2, 5, 16), (1, 2, 7, 1)), "float", {}),
]
EXPORTS = [("tpu", "tpu_custom_call"), ("cuda", "__gpu$xla.gpu.triton")]


@pytest.mark.parametrize("plat,marker", EXPORTS, ids=[e[0] for e in EXPORTS])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", range(len(EXPORT_ATTENTION)))
def test_pallas_attention_lowers(plat, marker, dtype, case):
    """Every config of the Pallas attention kernel lowers for TPUs (Mosaic: TPU-legal blocks) and
    GPUs (Triton), checked on this machine by exporting it."""
    if plat == "tpu" and dtype == "float16":
        pytest.skip("TPUs have no float16 arithmetic")
    shapes, mask, attrs = EXPORT_ATTENTION[case]
    p = _problem(_stub("gpu" if plat == "cuda" else plat), shapes, dtype, mask, **attrs)
    assert pallas_attention.supports(p)
    for cfg in pallas_attention.configs(p):
        text = _export(pallas_attention.build(p, cfg), _structs(p), plat)
        assert marker in text, (cfg, text[:2000])


@pytest.mark.parametrize("plat,marker", EXPORTS, ids=[e[0] for e in EXPORTS])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pallas_matmul_and_softmax_lower(plat, marker, dtype):
    """The backend's other Pallas kernels lower for TPUs and GPUs too, in every config."""
    dev = _stub("gpu" if plat == "cuda" else plat)
    for sa, sb in (((256, 512), (512, 384)), ((3, 100, 70), (70, 130))):
        out = (*sa[:-1], sb[-1])
        p = Problem("matmul", dev, (sa, sb), (dtype, dtype), (c_strides(sa), c_strides(sb)), Attrs(), out, dtype)
        assert pallas_matmul.supports(p)
        for cfg in matmul.pallas_configs(p):
            assert marker in _export(pallas_matmul.build(p, cfg), _structs(p), plat), cfg
    for shape, axis in (((512, 1000), 1), ((100, 33), 0), ((4, 3, 2048), 2)):
        for log in (False, True):
            op = "log_softmax" if log else "softmax"
            p = Problem(op, dev, (shape,), (dtype,), (c_strides(shape),), Attrs(axis=axis), shape, dtype)
            for cfg in pallas_softmax.configs(p):
                assert marker in _export(pallas_softmax.build(p, cfg, log=log), _structs(p), plat), cfg


def test_tpu_blocks_are_tpu_legal():
    """Mosaic wants block_q a multiple of 8 (32 for the int8 boolean mask) and keys along the
    128 lanes; head dims padded to 128."""
    for shapes in (((1, 1, 5, 8), (1, 1, 3, 8), (1, 1, 3, 8)), ((2, 4, 1000, 64), (2, 4, 777, 64), (2, 4, 777, 80))):
        p = _problem(_stub("tpu"), shapes, "bfloat16")
        for cfg in pallas_attention.configs(p):
            bq, bk = pallas_attention.blocks(p, cfg)
            assert bq % 32 == 0 and bk % 128 == 0, cfg
        assert all(d % 128 == 0 for d in pallas_attention.head_dims(p))


def test_tpu_declines_keys_past_vmem():
    long = (1, 1, 128, 128)
    p = _problem(_stub("tpu"), (long, (1, 1, 65536, 128), (1, 1, 65536, 128)), "bfloat16")
    assert not pallas_attention.supports(p)
    p = _problem(_stub("tpu"), (long, (1, 1, 4096, 128), (1, 1, 4096, 128)), "bfloat16")
    assert pallas_attention.supports(p)


# -- compiled Pallas (GPU / TPU) ---------------------------------------------------------------------------
@pytest.mark.parametrize("dev", COMPILED or [pytest.param("jax:gpu:0", marks=[
    pytest.mark.gpu, pytest.mark.skip(reason="no jax GPU/TPU device here")])])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_compiled_pallas_attention(dev, dtype, rng):
    """On the GPU machine: the compiled kernel, every config, against the reference (long enough
    for many blocks, causal, GQA, masks)."""
    kernel = f"jax.{OP}.pallas"
    for q, k, v, mask, attrs in DIRECT + [((2, 4, 1024, 128), (2, 4, 1024, 128), (2, 4, 1024, 128), None,
                                           {"causal": True}),
                                          ((1, 8, 777, 64), (1, 2, 1500, 64), (1, 2, 1500, 64), None, {})]:
        hosts = _operands(rng, q, k, v, mask, dtype)
        causal = attrs.get("causal", False)
        ref = _ref(*hosts[:3], hosts[3] if mask else None, is_causal=causal, enable_gqa=True)
        p = _problem(dev, [h.shape for h in hosts], dtype, mask and mask[0], is_causal=causal, enable_gqa=True)
        for cfg in registry().kernels[kernel].candidates(p):
            out = solve(kernel, dev, hosts, dtype, config=cfg, is_causal=causal, enable_gqa=True)
            _check(out, ref, dtype, f"{kernel} {cfg} {q}")


def test_flops_of_a_causal_problem_match_the_blocked_steps():
    """The blocked kernel's step count (its cost) skips whole key blocks past the diagonal."""
    p = _problem("jax:cpu:0", ((1, 1, 1024, 64),) * 3, "float32", is_causal=True)
    cfg = {"block_k": 256, "tile": 256 * 256}
    assert attention.blocked_blocks(p, cfg) == (256, 256)
    assert attention.blocked_steps(p, cfg) == 1 + 2 + 3 + 4
    assert attention.blocked_steps(_problem("jax:cpu:0", ((1, 1, 1024, 64),) * 3, "float32"), cfg) == 16
    assert math.isfinite(attention.blocked_cost(p, cfg))
