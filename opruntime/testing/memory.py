"""Conformance of a device's memory: round trips of every dtype and shape (size 0, specials),
NumPy views, allocation, conversion, ownership, the view hooks (reshape, permute, getitem,
concat), DLPack, synchronisation and the timer."""

# ruff: noqa: BLE001 - whatever a plugin (or a thread) raises is reported, never let through

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..devices import Device
from ..ops.base import FLOAT_ORDER
from ..plugins import Registry, registry
from .findings import Finding, _exc
from .numerics import np_dtype, random_array, same_bits, with_specials

#: Shapes every device must round-trip, size 0 included.
SHAPES = [(), (0,), (1,), (7,), (1031,), (3, 0, 2), (5, 13), (1, 1, 1, 1), (2, 3, 4, 5)]


def supported_dtypes(device: Device, reg: Registry | None = None) -> list[str]:
    """The dtypes some kernel computes on ``device`` (float32 always), narrow to wide."""
    reg = reg or registry()
    names = {d for k in reg.kernels.values() if k.device_kind == device.kind for d in k.dtypes} | {"float32"}
    return [d for d in FLOAT_ORDER if d in names]


def check_memory(device: Device, dtypes: Sequence[str] | None = None, rng: np.random.Generator | None = None,
                 reg: Registry | None = None) -> list[Finding]:
    """Host round trips of every dtype and shape (size 0 and specials included), allocation,
    conversion, ownership, DLPack, synchronisation and the timer."""
    from ..tensor import Tensor

    reg = reg or registry()
    rng = rng or np.random.default_rng()
    prov = device.provider
    out: list[Finding] = []
    dtypes = list(dtypes or supported_dtypes(device, reg))

    def fail(subject: str, msg: str, failed: bool = True) -> None:
        out.append(Finding("memory", f"{device.name} {subject}", msg, failed))

    for dtype in dtypes:
        dt = np_dtype(dtype)
        for shape in SHAPES:
            subject = f"{dtype}{list(shape)}"
            host = with_specials(random_array(rng, shape, dtype))
            try:
                data = prov.from_host(host)
                back = prov.to_host(data)
            except Exception as exc:
                fail(subject, f"from_host / to_host raised {_exc(exc)}")
                continue
            if not isinstance(back, np.ndarray):
                fail(subject, f"to_host returned {type(back).__name__}, not a numpy array")
            elif not same_bits(np.asarray(back), host):
                fail(subject, f"round trip changed the data (got shape {back.shape} {back.dtype})")
            if tuple(data.shape) != shape or np.dtype(data.dtype) != dt:
                fail(subject, f"native data has shape {tuple(data.shape)} dtype {data.dtype}")
            if not prov.owns(data):
                fail(subject, "owns() is False for data from from_host: operators cannot adopt native arrays")
            for other in reg.devices:
                if other is not device and other.provider.owns(data):
                    fail(subject, f"{other.name} also claims to own this device's data")
            for alloc in ("empty", "zeros"):
                try:
                    a = getattr(prov, alloc)(shape, dt)
                    if tuple(a.shape) != shape or np.dtype(a.dtype) != dt:
                        fail(subject, f"{alloc}() gave shape {tuple(a.shape)} dtype {a.dtype}")
                    elif alloc == "zeros" and not same_bits(prov.to_host(a), np.zeros(shape, dt)):
                        fail(subject, "zeros() is not all +0.0")
                except Exception as exc:
                    fail(subject, f"{alloc}() raised {_exc(exc)}")
        out += _check_views_and_casts(device, dtype, dtypes, rng)
        out += _check_view_hooks(device, dtype, rng)
        out += _check_random(device, dtype)
    out += _check_dlpack_and_timer(device, rng)
    out += _check_extension_points(device, rng)
    t = Tensor._wrap(prov.from_host(np.arange(6, dtype=np.float32).reshape(2, 3)), device)
    if not np.array_equal(np.asarray(t), np.arange(6).reshape(2, 3)):
        fail("Tensor", "np.asarray(Tensor) does not give the values back")
    return out


def _check_views_and_casts(device: Device, dtype: str, dtypes: Sequence[str], rng: np.random.Generator) -> list[Finding]:
    prov, out = device.provider, []
    host = random_array(rng, (6, 10), dtype)
    for label, view in (("transposed", host.T), ("strided", host[:, ::3]), ("reversed", host[::-1])):
        try:  # operators pass any numpy array a user gives straight to from_host
            back = prov.to_host(prov.from_host(view))
            if not same_bits(np.asarray(back), np.ascontiguousarray(view)):
                out.append(Finding("memory", f"{device.name} {dtype}", f"from_host of a {label} numpy view "
                                   "gives wrong values"))
        except Exception as exc:
            out.append(Finding("memory", f"{device.name} {dtype}", f"from_host of a {label} numpy view raised {_exc(exc)}"))
    data = prov.from_host(host)
    for target in dtypes:
        want = host.astype(np_dtype(target))
        try:
            got = prov.to_host(prov.astype(data, np_dtype(target)))
            if not same_bits(np.asarray(got), want):
                out.append(Finding("memory", f"{device.name} astype {dtype}->{target}",
                                   "differs from numpy's conversion (round to nearest even)"))
        except Exception as exc:
            out.append(Finding("memory", f"{device.name} astype {dtype}->{target}", f"raised {_exc(exc)}"))
    return out


def _check_view_hooks(device: Device, dtype: str, rng: np.random.Generator) -> list[Finding]:
    """``reshape``, ``permute``, ``getitem`` and ``concat`` (the Tensor's views and ``opr.concat``)
    give NumPy's values, on arrays of the device, of views of views too, leaving their operands as
    they were; ``concat`` gives a new array."""
    prov, out = device.provider, []

    def fail(what: str, msg: str) -> None:
        out.append(Finding("memory", f"{device.name} {dtype} {what}", msg))

    host = random_array(rng, (4, 6, 5), dtype)
    try:
        data = prov.from_host(host)
    except Exception as exc:
        return [Finding("memory", f"{device.name} {dtype} views", f"from_host raised {_exc(exc)}")]
    full = (slice(0, 4, 1), slice(0, 6, 1), slice(0, 5, 1))
    steps: list[tuple[str, object, np.ndarray]] = []  # (label, native result or exception, expected)

    def run(label: str, fn: object, want: np.ndarray) -> object:
        try:
            got = fn()  # type: ignore[operator]
        except Exception as exc:
            fail(label, f"raised {_exc(exc)}")
            return None
        steps.append((label, got, want))
        return got

    moved = run("permute (2, 0, 1)", lambda: prov.permute(data, (2, 0, 1)), host.transpose(2, 0, 1))
    run("reshape (24, 5)", lambda: prov.reshape(data, (24, 5)), host.reshape(24, 5))
    run("reshape (4, 30, 1)", lambda: prov.reshape(data, (4, 30, 1)), host.reshape(4, 30, 1))
    sliced = run("getitem [1:4:2, 1, ::2]", lambda: prov.getitem(data, (slice(1, 4, 2), 1, slice(0, 5, 2))),
                 host[1:4:2, 1, ::2])
    run("getitem [2, 3, 4] (0-d)", lambda: prov.getitem(data, (2, 3, 4)), host[2, 3, 4])
    run("getitem [:, 6:6] (size 0)", lambda: prov.getitem(data, (full[0], slice(6, 6, 1), full[2])), host[:, 6:6])
    if moved is not None:
        run("reshape of a permuted view (a copy)", lambda: prov.reshape(moved, (5, 24)),
            host.transpose(2, 0, 1).reshape(5, 24))
        run("getitem of a permuted view", lambda: prov.getitem(moved, (slice(1, 5, 3), slice(0, 4, 1), 2)),
            host.transpose(2, 0, 1)[1::3, :, 2])
    if sliced is not None:
        run("permute of a sliced view", lambda: prov.permute(sliced, (1, 0)), host[1:4:2, 1, ::2].T)
    part = prov.getitem(data, (full[0], slice(1, 6, 2), full[2])) if sliced is not None else data
    joined = run("concat axis 1 (contiguous, strided, size 0)",
                 lambda: prov.concat([data, part, prov.getitem(data, (full[0], slice(0, 0, 1), full[2]))], 1),
                 np.concatenate([host, host[:, 1::2]], axis=1))
    run("concat axis 2 of one", lambda: prov.concat([data], 2), host)
    for label, got, want in steps:
        try:
            back = np.asarray(prov.to_host(got))
            if tuple(got.shape) != want.shape or np.dtype(got.dtype) != want.dtype:
                fail(label, f"gave shape {tuple(got.shape)} dtype {got.dtype}; NumPy gives {want.shape} {want.dtype}")
            elif not same_bits(back, want):
                fail(label, "gives values other than NumPy's")
            elif not prov.owns(got):
                fail(label, "owns() is False for the result: operators could not adopt it")
        except Exception as exc:
            fail(label, f"reading the result back raised {_exc(exc)}")
    try:
        if not same_bits(np.asarray(prov.to_host(data)), host):
            fail("views", "changed the array they were made from")
        if joined is not None and prov.shares_memory(joined, data):
            fail("concat", "the result shares memory with an operand; it must be a new array")
    except Exception as exc:
        fail("views", f"checking the operand afterwards raised {_exc(exc)}")
    return out


def _check_extension_points(device: Device, rng: np.random.Generator) -> list[Finding]:
    """``copy`` gives a new array, ``shares_memory`` sees an array overlap itself and not a copy,
    ``free_memory`` is bytes or None (the frontend refuses results larger than it)."""
    prov, out = device.provider, []

    def fail(what: str, msg: str) -> None:
        out.append(Finding("memory", f"{device.name} {what}", msg))

    host = random_array(rng, (5, 7), "float32")
    try:
        data = prov.from_host(host)
        other = prov.copy(data)
        if not same_bits(np.asarray(prov.to_host(other)), host) or other is data:
            fail("copy", "must return a new array with the same values")
        if not prov.shares_memory(data, data):
            fail("shares_memory", "an array must share memory with itself (results are checked with it)")
        if prov.shares_memory(data, other):
            fail("shares_memory", "an array and its copy must not share memory")
    except Exception as exc:
        fail("copy / shares_memory", f"raised {_exc(exc)}")
    try:
        free = prov.free_memory()
        if free is not None and (not isinstance(free, int) or free < 0):
            fail("free_memory", f"must return bytes (an int >= 0) or None, got {free!r}")
    except Exception as exc:
        fail("free_memory", f"raised {_exc(exc)}")
    return out


def _check_random(device: Device, dtype: str) -> list[Finding]:
    """``random_normal``: the shape and dtype asked for, finite and non-zero values, and two seeds
    giving two draws (the autotuner times kernels on these)."""
    prov, dt, subject = device.provider, np_dtype(dtype), f"{device.name} random_normal {dtype}"
    try:
        draws = [prov.to_host(prov.random_normal(shape, dt, seed)) for shape, seed in (((5, 13), 1), ((5, 13), 2), ((0, 3), 1))]
    except Exception as exc:
        return [Finding("memory", subject, f"raised {_exc(exc)}")]
    for d, shape in zip(draws, [(5, 13), (5, 13), (0, 3)]):
        if tuple(d.shape) != shape or d.dtype != dt:
            return [Finding("memory", subject, f"gave shape {tuple(d.shape)} dtype {d.dtype} for {shape} {dtype}")]
    a, b = (d.astype(np.float64) for d in draws[:2])
    if not (np.isfinite(a).all() and (a != 0).all()) or np.array_equal(a, b) or np.ptp(a) == 0:
        return [Finding("memory", subject, "values must be finite, non-zero, varied, and differ between seeds")]
    return []


def _check_dlpack_and_timer(device: Device, rng: np.random.Generator) -> list[Finding]:
    from ..tensor import Tensor

    prov, out = device.provider, []
    host = random_array(rng, (4, 5), "float32")
    data = prov.from_host(host)
    try:
        dev_type, dev_id = prov.dlpack_device(data)
        if not (isinstance(dev_type, int) and isinstance(dev_id, int)):
            raise TypeError(f"got {(dev_type, dev_id)!r}")
    except Exception as exc:
        out.append(Finding("memory", f"{device.name} dlpack_device", f"must return two ints: {_exc(exc)}"))
    try:
        again = prov.from_dlpack(Tensor._wrap(data, device))
        if not same_bits(np.asarray(prov.to_host(again)), host):
            out.append(Finding("memory", f"{device.name} DLPack", "to_dlpack -> from_dlpack changed the data"))
    except (NotImplementedError, BufferError) as exc:
        out.append(Finding("memory", f"{device.name} DLPack", f"not supported: {_exc(exc)}", failed=False))
    except Exception as exc:
        out.append(Finding("memory", f"{device.name} DLPack", f"to_dlpack -> from_dlpack raised {_exc(exc)}"))
    try:
        prov.synchronize()
        calls = []
        times = prov.time(lambda: calls.append(1), repeats=3, warmup=1)
        if len(times) != 3 or not all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in times):
            out.append(Finding("memory", f"{device.name} time()", f"must return 3 finite seconds >= 0, got {times!r}"))
        if len(calls) != 4:
            out.append(Finding("memory", f"{device.name} time()", f"called fn {len(calls)} times for warmup=1 repeats=3"))
    except Exception as exc:
        out.append(Finding("memory", f"{device.name} synchronize / time", f"raised {_exc(exc)}"))
    return out
