"""Tensor views (``reshape``, ``permute``, ``transpose``, ``.T``, ``.mT``, basic indexing) and
``opr.concat`` on every device, against NumPy on fresh random data: views of views, size-0 and
size-1 dims, negative dims, memory shared where the device allows it (never letting the original
change), operators run on views, and the typed errors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import (
    AttributeValueError,
    DeviceMismatchError,
    DtypeError,
    IndexingError,
    InputTypeError,
    ShapeError,
)
from opruntime.ops import OPS
from opruntime.testing.numerics import compare, random_array

#: (id, the view as a function of a Tensor or an ndarray: both spell it alike). Base shape (4, 6, 5).
VIEWS: list[tuple[str, Callable]] = [
    ("reshape(6,-1)", lambda t: t.reshape(6, -1)),
    ("reshape((-1,))", lambda t: t.reshape((-1,))),
    ("reshape(1,120,1)", lambda t: t.reshape(1, 120, 1)),
    ("reshape same", lambda t: t.reshape(4, 6, 5)),
    ("T", lambda t: t.T),
    ("mT", lambda t: t.mT),
    ("permute(2,0,1)", lambda t: t.permute(2, 0, 1) if hasattr(t, "permute") else t.transpose(2, 0, 1)),
    ("permute(-1,0,-2)", lambda t: t.permute((-1, 0, -2)) if hasattr(t, "permute") else t.transpose(2, 0, 1)),
    ("transpose(0,-1)", lambda t: t.transpose(0, -1) if hasattr(t, "permute") else t.swapaxes(0, -1)),
    ("[1]", lambda t: t[1]),
    ("[-1,2]", lambda t: t[-1, 2]),
    ("[1,2,3] 0-d", lambda t: t[1, 2, 3]),
    ("[:,1:]", lambda t: t[:, 1:]),
    ("[...,::2]", lambda t: t[..., ::2]),
    ("[1:3,::4,-2]", lambda t: t[1:3, ::4, -2]),
    ("[None]", lambda t: t[None]),
    ("[:,None,2,...,None]", lambda t: t[:, None, 2, ..., None]),
    ("[-3:-1,10:2]", lambda t: t[-3:-1, 10:2]),  # an empty slice (start past stop)
    ("[:,6:]", lambda t: t[:, 6:]),
    ("[0:1,:,3:4]", lambda t: t[0:1, :, 3:4]),
    ("[:100,-100:]", lambda t: t[:100, -100:]),
    ("[...]", lambda t: t[...]),
    ("T[1:].reshape(-1)", lambda t: t.T[1:].reshape(-1)),  # a copy: the strides forbid a view
    ("[:,::2].T[2]", lambda t: t[:, ::2].T[2]),
    ("[1:,:,1:].reshape(3,-1)", lambda t: t[1:, :, 1:].reshape(3, -1)),
    ("mT[::3].reshape(2,-1,3)", lambda t: t.mT[::3].reshape(2, -1, 3)),
    ("[0:1,:,3:4].reshape(6)", lambda t: t[0:1, :, 3:4].reshape(6)),
    ("[:,6:].reshape(0,7)", lambda t: t[:, 6:].reshape(0, 7)),
    ("[2:3].reshape(-1,1,5)[None,3]", lambda t: t[2:3].reshape(-1, 1, 5)[None, 3]),
]


def host_dtypes(device: opr.Device) -> list[str]:
    from conftest import dtypes_on

    return [d for d in ("float32", "float16", "bfloat16", "float64") if d == "float32" or d in dtypes_on(device, "matmul")]


@pytest.mark.parametrize("view", [v for _, v in VIEWS], ids=[i for i, _ in VIEWS])
def test_views_match_numpy(device, rng, view):
    host = random_array(rng, (4, 6, 5), "float32")
    t = opr.tensor(host, device=device)
    got, want = view(t), view(host)
    assert isinstance(got, opr.Tensor) and got.device == device
    assert got.shape == want.shape and got.dtype == want.dtype and got.ndim == want.ndim
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(t.numpy(), host)  # the original is as it was


def test_views_of_every_dtype_and_of_size_0_and_size_1_dims(device, rng):
    for dtype in host_dtypes(device):
        for shape in [(1, 5, 1, 3), (3, 0, 2), (1,), ()]:
            host = random_array(rng, shape, dtype)
            t = opr.tensor(host, device=device)
            np.testing.assert_array_equal(t.T.numpy(), host.T)
            np.testing.assert_array_equal(t.reshape(-1).numpy(), host.reshape(-1))
            np.testing.assert_array_equal(t[None, ...].numpy(), host[None, ...])
            if host.ndim:
                np.testing.assert_array_equal(t[..., ::2].numpy(), host[..., ::2])
                np.testing.assert_array_equal(t[-1:].numpy(), host[-1:])
            if host.ndim == 4:
                np.testing.assert_array_equal(t.permute(3, 1, 0, 2)[0].reshape(5, 1).numpy(),
                                              host.transpose(3, 1, 0, 2)[0].reshape(5, 1))
                np.testing.assert_array_equal(t[0, :, 0].numpy(), host[0, :, 0])
            assert t.reshape(-1).dtype == np.dtype(dtype)


def test_views_share_memory_where_the_device_allows(device, rng):
    t = opr.tensor(random_array(rng, (6, 8), "float32"), device=device)
    prov = device.provider
    views = {"reshape": t.reshape(4, 12), "permute": t.T, "getitem": t[1:, ::2], "none": t[:, None]}
    for name, v in views.items():
        if device.kind == "jax":  # XLA buffers are immutable: a view is a new array
            assert v.data is not t.data, name
        else:
            assert prov.shares_memory(v.data, t.data), f"{name} copied on {device.name}"
    copy = t.T.reshape(-1)  # the strides forbid a view: a copy, as NumPy's
    assert not prov.shares_memory(copy.data, t.data) or device.kind == "jax"
    assert t.reshape(6, 8) is t and t[:, :] is t and t[...] is t and t.permute(0, 1) is t


def test_a_view_never_lets_the_original_change(device, rng):
    host = random_array(rng, (3, 4), "float32")
    t = opr.tensor(host, device=device)
    for v in (t.T, t[1:], t.reshape(-1), t[None]):
        out = v.numpy()
        if out.flags.writeable:  # a copy: writing into it leaves both Tensors as they are
            out[...] = 7
        else:
            with pytest.raises(ValueError, match="read-only"):
                out[...] = 7
    np.testing.assert_array_equal(t.numpy(), host)
    np.testing.assert_array_equal(t.T.numpy(), host.T)


def test_operators_run_on_views(device, rng):
    """Operators take views as operands (strided, offset, size-1 dims) and give the reference."""
    x = random_array(rng, (5, 7), "float32")
    w = random_array(rng, (6, 3), "float32")
    t = opr.tensor(x, device=device)
    for got, ref in [
        (opr.softmax(t.T), OPS["softmax"].reference(x.T.astype(np.float64), axis=-1)),
        (opr.softmax(t[:, 1::2], axis=0), OPS["softmax"].reference(x[:, 1::2].astype(np.float64), axis=0)),
        (opr.matmul(t[:, 1:], w), x[:, 1:].astype(np.float64) @ w),
        (opr.matmul(t.T[2:], t[0:2, :5].reshape(5, 2)), x.T[2:].astype(np.float64) @ x[0:2, :5].reshape(5, 2)),
        (opr.matmul(t[None, 1:3], t.T[:, 2, None]), x[None, 1:3].astype(np.float64) @ x.T[:, 2, None]),
        (t[2:].T @ t[2:], x[2:].T.astype(np.float64) @ x[2:]),
    ]:
        assert got.device == device and got.shape == ref.shape
        assert compare(got.numpy(), ref, "float32") is None, compare(got.numpy(), ref, "float32")


def test_iterating_and_len(device, rng):
    host = random_array(rng, (3, 2), "float32")
    t = opr.tensor(host, device=device)
    rows = list(t)
    assert len(rows) == len(t) == 3
    for row, want in zip(rows, host):
        np.testing.assert_array_equal(row.numpy(), want)
    with pytest.raises(TypeError, match="0-d"):
        iter(opr.tensor(1.0, device=device))


# -- the module-level functions ----------------------------------------------------------------------
def test_functions_take_tensors_host_data_and_native_arrays(device, rng):
    host = random_array(rng, (2, 3, 4), "float32")
    t = opr.tensor(host, device=device)
    np.testing.assert_array_equal(opr.reshape(t, (4, -1)).numpy(), host.reshape(4, -1))
    np.testing.assert_array_equal(opr.transpose(t, 0, 2).numpy(), host.swapaxes(0, 2))
    np.testing.assert_array_equal(opr.permute(t, (1, 2, 0)).numpy(), host.transpose(1, 2, 0))
    native = opr.permute(t.data, (2, 1, 0))  # adopted on its device, as the operators do
    assert native.device == device
    np.testing.assert_array_equal(native.numpy(), host.T)
    own = host.copy()
    placed = opr.reshape(own, (-1,), device=device)  # host data: copied onto the device
    own[...] = 0
    assert placed.device == device
    np.testing.assert_array_equal(placed.numpy(), host.reshape(-1))
    lists = opr.transpose([[1, 2, 3]], 0, 1, device=device)  # Python ints: float32, as everywhere
    assert lists.dtype == np.float32 and lists.shape == (3, 1)


def test_functions_refuse_a_device_other_than_the_tensors():
    t = opr.tensor(np.ones((2, 3), np.float32), device="cpu")
    other = next((d.name for d in opr.devices() if d.name != "cpu"), None)
    if other is None:
        pytest.skip("one device only")
    with pytest.raises(DeviceMismatchError, match=r"reshape: device=.* lives on 'cpu'; move it first with \.to"):
        opr.reshape(t, (3, 2), device=other)


# -- concat ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_matches_numpy(device, rng, axis):
    a = random_array(rng, (4, 6, 5), "float32")
    t = opr.tensor(a, device=device)
    f = opr.tensor(np.ascontiguousarray(a.T), device=device).T  # a's values, Fortran strides
    ax = axis % 3

    def part(on_axis: slice) -> tuple[slice, ...]:
        idx = [slice(None)] * 3
        idx[(ax + 1) % 3] = slice(1, None, 2)  # every part strided, at an offset, off the axis
        idx[ax] = on_axis
        return tuple(idx)

    picks = [slice(None), slice(1, None, 2), slice(0, 0), slice(2, 3)]
    parts = [t[part(p)] for p in picks] + [f[part(slice(0, 2))], opr.tensor(a[part(slice(None))], device=device)]
    want = np.concatenate([a[part(p)] for p in picks] + [a[part(slice(0, 2))], a[part(slice(None))]], axis=axis)
    got = opr.concat(parts, axis=axis)
    assert got.device == device and got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want)
    prov = device.provider
    assert not any(prov.shares_memory(got.data, p.data) for p in parts)
    np.testing.assert_array_equal(t.numpy(), a)


def test_concat_of_views_host_data_one_part_and_empty_parts(device, rng):
    a = random_array(rng, (3, 4), "float32")
    t = opr.tensor(a, device=device)
    out = opr.concat((t.T, a.T[:, :1], [[1.0], [2.0], [3.0], [4.0]]), axis=1)  # host data joins the device
    np.testing.assert_array_equal(out.numpy(), np.concatenate([a.T, a.T[:, :1], [[1], [2], [3], [4]]], axis=1))
    assert out.device == device
    one = opr.concat([t[1:]])
    np.testing.assert_array_equal(one.numpy(), a[1:])
    empty = opr.concat([t[:0], t[3:]], axis=0)
    assert empty.shape == (0, 4) and empty.device == device
    np.testing.assert_array_equal(opr.concat([t[:0], t], axis=0).numpy(), a)


def test_concat_promotes_dtypes_as_the_operators(device, rng):
    from conftest import dtypes_on

    wide = "float64" if "float64" in dtypes_on(device, "matmul") else "float32"
    a16 = random_array(rng, (2, 3), "float16")
    aw = random_array(rng, (1, 3), wide)
    out = opr.concat([opr.tensor(a16, device=device), opr.tensor(aw, device=device)])
    assert out.dtype == np.dtype(wide)
    np.testing.assert_array_equal(out.numpy(), np.concatenate([a16.astype(wide), aw]))


def test_concat_on_a_named_device_from_host_data():
    out = opr.concat([np.ones((1, 2), np.float32), np.zeros((2, 2), np.float32)], device="cpu")
    assert out.device.name == "cpu" and out.shape == (3, 2)


# -- errors ------------------------------------------------------------------------------------------
T = opr.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4), device="cpu")


@pytest.mark.parametrize("call,error,match", [
    (lambda: T.reshape(5, 5), ShapeError,
     r"reshape: cannot reshape a tensor of shape \(2, 3, 4\) \(size 24\) into shape \(5, 5\) \(size 25\); "
     r"the sizes must match \(one dim may be -1"),
    (lambda: T.reshape(5, -1), ShapeError, r"shape \(2, 3, 4\) \(size 24\) into \(5, -1\): 24 is not a multiple of 5"),
    (lambda: T[:, :0].reshape(0, -1), ShapeError, r"the other dims hold 0 elements, so -1 is ambiguous"),
    (lambda: T.reshape(-1, -1), AttributeValueError, r"reshape: at most one dim may be -1"),
    (lambda: T.reshape(4, 6.0), AttributeValueError, r"reshape: the shape must hold ints >= 0"),
    (lambda: T.reshape(-2, -12), AttributeValueError, r"ints >= 0 \(and at most one -1\); got \(-2, -12\)"),
    (lambda: opr.reshape(T, None), AttributeValueError, r"reshape: the shape must be ints or one tuple"),
    (lambda: T.transpose(0, 3), AttributeValueError, r"transpose: dim1 must be an int in \[-3, 3\) for a 3-D tensor; got 3"),
    (lambda: T.transpose(0.0, 1), AttributeValueError, r"dim0 must be an int"),
    (lambda: opr.tensor(1.0, device="cpu").transpose(0, 0), AttributeValueError, r"a 0-d tensor has no dims"),
    (lambda: T.permute(1, 0), AttributeValueError, r"permute: dims must name each of the tensor's 3 dims once; got \(1, 0\)"),
    (lambda: T.permute(0, 0, 1), AttributeValueError, r"permute: dims \(0, 0, 1\) repeat a dim"),
    (lambda: T.permute(0, 1, -4), AttributeValueError, r"dims\[2\] must be an int in \[-3, 3\)"),
    (lambda: opr.tensor([1.0], device="cpu").mT, ShapeError, r"mT: the tensor must be at least 2-D"),
    (lambda: T[[0, 1]], IndexingError, r"advanced \(integer array\) indexing is not supported .* Select on the host"),
    (lambda: T[np.array([0, 1])], IndexingError, r"advanced \(integer array\) indexing"),
    (lambda: T[T.numpy() > 3], IndexingError, r"boolean indexing is not supported"),
    (lambda: T[True], IndexingError, r"boolean indexing"),
    (lambda: T[1.0], IndexingError, r"Tensors take ints, slices with a step >= 1, \.\.\. and None"),
    (lambda: T[::-1], IndexingError, r"step <= 0 are not supported \(got step -1\); reverse on the host"),
    (lambda: T[:, 0.5:], IndexingError, r"slice starts must be ints or None"),
    (lambda: T[0, 0, 0, 0], IndexingError, r"too many indices for a 3-D tensor of shape \(2, 3, 4\): 4 were given"),
    (lambda: T[..., 0, ...], IndexingError, r"a single ellipsis"),
    (lambda: T[2], IndexingError, r"index 2 is out of range for dim 0 of size 2"),
    (lambda: T[:, -4], IndexingError, r"index -4 is out of range for dim 1 of size 3"),
    (lambda: opr.concat(T), InputTypeError, r"concat: tensors must be a list or tuple of tensors; got Tensor"),
    (lambda: opr.concat([]), ShapeError, r"concat: needs at least one tensor"),
    (lambda: opr.concat([opr.tensor(1.0, device="cpu")]), ShapeError, r"0-d tensors cannot be joined"),
    (lambda: opr.concat([T, T[0]]), ShapeError, r"every tensor must have 3 dims, as tensors\[0\] \(2, 3, 4\); "
                                                r"tensors\[1\] has shape \(3, 4\)"),
    (lambda: opr.concat([T, T[:, 1:]], axis=2), ShapeError,
     r"shapes must match except on axis 2; tensors\[0\] has \(2, 3, 4\) and tensors\[1\] has \(2, 2, 4\)"),
    (lambda: opr.concat([T, T], axis=3), AttributeValueError, r"concat: axis must be an int in \[-3, 3\)"),
    (lambda: opr.concat([T, T], axis=True), AttributeValueError, r"axis must be an int"),
    (lambda: opr.concat([T, np.ones((2, 3, 4), np.int32)]), DtypeError, r"concat: dtype int32 is not supported"),
])
def test_typed_errors_name_the_op_and_the_fix(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_an_index_error_is_an_index_error():
    """IndexingError is Python's IndexError too (``except IndexError`` and iteration keep working)."""
    with pytest.raises(IndexError):
        T[5]


def test_concat_refuses_two_devices():
    other = next((d.name for d in opr.devices() if d.name != "cpu"), None)
    if other is None:
        pytest.skip("one device only")
    with pytest.raises(DeviceMismatchError, match=r"concat: operands live on different devices \(tensors\[0\] on 'cpu', "
                                                  r"tensors\[1\] on"):
        opr.concat([T, opr.tensor(np.ones((2, 3, 4), np.float32), device=other)])


def test_the_conformance_suite_catches_wrong_view_hooks():
    """A plugin's device whose view hooks are wrong fails ``check_memory``, naming the hook."""
    import types

    from fake_backend import FakeArray, FakeDevice

    from opruntime.testing import failures, summary
    from opruntime.testing.memory import check_memory

    class Sloppy(FakeDevice):
        kind = "sloppy"

        def __init__(self):
            super().__init__(0)
            self.name = "sloppy:0"

        def getitem(self, data, index):  # forgets the steps
            return FakeArray(data.a[tuple(slice(e.start, e.stop) if isinstance(e, slice) else e for e in index)],
                             self.name)

        def concat(self, datas, axis):  # hands back the first part
            return datas[0]

    @opr.hookimpl
    def opruntime_devices():
        return [Sloppy()]

    opr.register(types.SimpleNamespace(opruntime_devices=opruntime_devices, __name__="sloppy"), name="sloppy")
    try:
        found = summary(failures(check_memory(opr.Device("sloppy:0"), dtypes=["float32"])))
    finally:
        opr.unregister("sloppy")
    assert "getitem [1:4:2, 1, ::2]: gave shape" in found
    assert "concat axis 1 (contiguous, strided, size 0): gave shape" in found
    assert "concat: the result shares memory with an operand" in found
    assert "reshape (24, 5)" not in found and "permute (2, 0, 1)" not in found  # the defaults are right


def test_a_view_checked_once_still_refuses_what_equals_its_ints():
    """Views keep their validated arguments per (shape, ints): True, 1.0 and np.int64(1) hash as 1,
    yet bools and floats are refused after t[1] / t.reshape(1, ...) ran, and a NumPy int still
    works (checked, not taken from the ints' entry)."""
    t = opr.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    for _ in range(2):  # the second time from the kept entry
        np.testing.assert_array_equal(t[1].numpy(), np.arange(12, 24).reshape(3, 4))
        assert t.reshape(1, 6, 4).shape == (1, 6, 4) and t.permute(1, 0, 2).shape == (3, 2, 4)
        assert t[1, None, ...].shape == (1, 3, 4)
    for bad in (lambda: t[True], lambda: t[1.0], lambda: t[1, True]):
        with pytest.raises(IndexingError):
            bad()
    for bad in (lambda: t.reshape(True, 6, 4), lambda: t.reshape(1.0, 6, 4), lambda: t.permute(1.0, 0, 2),
                lambda: t.permute(True, 0, 2)):
        with pytest.raises(AttributeValueError):
            bad()
    np.testing.assert_array_equal(t[np.int64(1)].numpy(), t[1].numpy())
    assert t.reshape(np.int64(1), 6, 4).shape == (1, 6, 4)
