"""Every class of bad input raises a typed error whose message names the problem."""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import (
    AttributeValueError,
    DeviceMismatchError,
    DeviceUnavailableError,
    DtypeError,
    InputTypeError,
    OpRuntimeError,
    ShapeError,
    UnknownDeviceError,
)
from opruntime.ops import OPS

f32 = np.float32


def ones(*shape, dtype=f32):
    return np.ones(shape, dtype)


@pytest.mark.parametrize("call,error,match", [
    (lambda: opr.matmul(ones(2, 3), ones(4, 5)), ShapeError, r"inner dimensions differ: a \(2, 3\) has K=3 but b \(4, 5\) has K=4"),
    (lambda: opr.matmul(ones(3), ones(4)), ShapeError, r"inner dimensions differ"),
    (lambda: opr.matmul(np.float32(2), ones(2, 2)), ShapeError, r"at least 1-D"),
    (lambda: opr.matmul(ones(2, 2, 3), ones(3, 3, 4)), ShapeError, r"batch dims \(2,\) of a .* and \(3,\) of b .* do not broadcast"),
    (lambda: opr.matmul(ones(2, 2, dtype=np.int64), ones(2, 2)), DtypeError, r"matmul: dtype int64 is not supported"),
    (lambda: opr.matmul(ones(2, 2, dtype=bool), ones(2, 2)), DtypeError, r"dtype bool"),
    (lambda: opr.matmul(ones(2, 2, dtype=np.complex64), ones(2, 2)), DtypeError, r"complex64"),
    (lambda: opr.conv2d(ones(3, 8, 8), ones(4, 3, 3)), ShapeError, r"w must be 4-D"),
    (lambda: opr.conv2d(ones(8, 8), ones(4, 3, 3, 3)), ShapeError, r"x must be 4-D .* got shape \(8, 8\)"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 2, 3, 3)), ShapeError, r"expects 2 channels per group but x .* has C=3"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 3, 3, 3), stride=0), AttributeValueError, r"stride must be .* >= 1; got 0"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 3, 3, 3), stride=(1, 2, 3)), AttributeValueError, r"stride must be an int or a pair"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 3, 3, 3), padding=-1), AttributeValueError, r"padding must be .* >= 0"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 3, 3, 3), padding="full"), AttributeValueError, r"'same' or 'valid'; got 'full'"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 3, 3, 3), padding="same", stride=2), AttributeValueError, r"'same' needs stride 1"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 3, 3, 3), dilation=0), AttributeValueError, r"dilation must be"),
    (lambda: opr.conv2d(ones(1, 4, 8, 8), ones(4, 2, 3, 3), groups=3), AttributeValueError, r"groups=3 must divide both"),
    (lambda: opr.conv2d(ones(1, 4, 8, 8), ones(4, 2, 3, 3), groups=0), AttributeValueError, r"groups must be an int >= 1"),
    (lambda: opr.conv2d(ones(1, 3, 8, 8), ones(4, 3, 3, 3), ones(3)), ShapeError, r"bias must have shape \(4,\)"),
    (lambda: opr.conv2d(ones(1, 3, 2, 2), ones(4, 3, 3, 3)), ShapeError, r"output would be empty"),
    (lambda: opr.softmax(np.float32(1)), ShapeError, r"softmax: the input must be at least 1-D"),
    (lambda: opr.softmax(ones(2, 3), axis=2), AttributeValueError, r"axis 2 is out of range for a 2-D input"),
    (lambda: opr.log_softmax(ones(2, 3), axis=1.0), AttributeValueError, r"axis must be an int"),
    (lambda: opr.softmax(ones(2, 3), dim=1), TypeError, r"unexpected keyword argument 'dim'"),
    (lambda: opr.matmul(ones(2, 2), ones(2, 2), device="cdua:0"), UnknownDeviceError, r"unknown device 'cdua:0'. Did you mean 'cuda"),
    (lambda: opr.matmul(ones(2, 2), ones(2, 2), device="gpu"), UnknownDeviceError, r"unknown device 'gpu'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, OpRuntimeError) or error is TypeError


def test_unavailable_device_says_why():
    kinds = opr.registry().unavailable
    if not kinds:
        pytest.skip("every backend is available here")
    kind = next(iter(kinds))
    with pytest.raises(DeviceUnavailableError, match="is not available: "):
        opr.matmul(ones(2, 2), ones(2, 2), device=f"{kind}:0")


def test_missing_index_of_present_kind():
    with pytest.raises(DeviceUnavailableError, match="'cpu:3' is not present; cpu devices here: cpu"):
        opr.Device("cpu:3")


def test_tensors_on_two_devices(fake):
    a = opr.tensor(ones(2, 2), device="fake:0")
    b = opr.tensor(ones(2, 2), device="fake:1")
    with pytest.raises(DeviceMismatchError, match=r"a on 'fake:0', b on 'fake:1'.*never copies"):
        opr.matmul(a, b)
    with pytest.raises(DeviceMismatchError, match=r"device='fake:1' was asked but the operands live on 'fake:0'"):
        opr.matmul(a, ones(2, 2), device="fake:1")


def test_dtype_no_kernel_on_device(fake):
    with pytest.raises(DtypeError, match="no kernel computes float16 on fake:0; dtypes there: float32, float64"):
        opr.matmul(ones(2, 2, dtype=np.float16), ones(2, 2, dtype=np.float16), device="fake:0")


def test_lists_of_ints_become_float32():
    out = opr.matmul([[1, 2]], [[3], [4]], device="cpu")
    assert out.dtype == np.float32 and out.numpy().tolist() == [[11.0]]


def test_errors_do_not_poison_the_cache():
    with pytest.raises(ShapeError):
        opr.matmul(ones(2, 3), ones(4, 5))
    with pytest.raises(ShapeError):  # validated again, not served from a cache
        opr.matmul(ones(2, 3), ones(4, 5))


# -- findings: attribute types, host data, device arguments ------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("bad", [1.0, True, np.float32(1), "1", (1,)], ids=repr)
def test_finding_7_a_bad_axis_is_refused_after_a_good_call(device, op, bad):
    """Finding 7: ``softmax(x, axis=1.0)`` (and ``axis=True``) was served the plan that
    ``axis=1`` had made: the plan-cache key holds each attribute's type, so it is validated and
    refused, on the host-data path and on the Tensor fast path alike."""
    x = ones(3, 4)
    t = opr.tensor(x, device=device)
    fn = getattr(opr, op)
    for _ in range(2):  # the second call takes the cached plan
        fn(x, axis=1, device=device)
        fn(t, axis=1)
    with pytest.raises(AttributeValueError, match=f"{op}: axis must be an int"):
        fn(x, axis=bad, device=device)
    with pytest.raises(AttributeValueError, match=f"{op}: axis must be an int"):
        fn(t, axis=bad)
    assert fn(t, axis=np.int64(1)).shape == (3, 4)  # NumPy ints are ints


CONV_BAD = [("stride", 1.0), ("stride", True), ("stride", (1, 1.0)), ("stride", (True, 1)),
            ("padding", 1.0), ("padding", True), ("padding", (1, 1.0)), ("dilation", (1.0, 1)), ("dilation", False),
            ("groups", 1.0), ("groups", True)]


@pytest.mark.parametrize("name,bad", CONV_BAD, ids=lambda v: repr(v))
def test_finding_7_conv2d_attributes_must_be_ints_after_a_good_call(device, name, bad):
    x, w = ones(1, 2, 5, 5), ones(2, 2, 3, 3)
    tx, tw = opr.tensor(x, device=device), opr.tensor(w, device=device)
    good = {"stride": 1, "padding": 1, "dilation": 1, "groups": 1}[name]
    for _ in range(2):
        opr.conv2d(x, w, device=device, **{name: good})
        opr.conv2d(tx, tw, **{name: good})
        opr.conv2d(tx, tw, **{name: (good, good)} if name != "groups" else {name: good})
    with pytest.raises(AttributeValueError, match=f"conv2d: {name} must be"):
        opr.conv2d(x, w, device=device, **{name: bad})
    with pytest.raises(AttributeValueError, match=f"conv2d: {name} must be"):
        opr.conv2d(tx, tw, **{name: bad})


@pytest.mark.parametrize("data", [[[1.0, 2.0], [3.0]], [[1, 2], [3, [4]]], [np.ones(2), np.ones(3)]],
                         ids=["ragged", "nested-ragged", "arrays-of-two-lengths"])
def test_finding_14_ragged_lists_are_a_shape_error(device, data):
    """Finding 14: ragged nested lists raised NumPy's bare ValueError; a ShapeError says what to give."""
    with pytest.raises(ShapeError, match="softmax: the operand is not a rectangular array"):
        opr.softmax(data, device=device)
    with pytest.raises(ShapeError, match="tensor: the operand is not a rectangular array"):
        opr.tensor(data, device=device)


@pytest.mark.parametrize("bad", [123, 1.5, object(), {"cpu": 1}, ["cpu", 7], b"cpu"], ids=repr)
def test_finding_14_a_device_that_is_not_a_name_is_an_unknown_device(bad):
    """Finding 14: ``device=123`` raised AttributeError from deep inside; it is an UnknownDeviceError."""
    with pytest.raises(UnknownDeviceError, match="device"):
        opr.softmax(ones(3), device=bad)
    with pytest.raises(UnknownDeviceError, match="device"):
        opr.tensor(ones(3), device=bad)
    with pytest.raises(UnknownDeviceError):
        opr.Device(bad)


@pytest.mark.parametrize("op", list(OPS))
def test_finding_15_masked_arrays_are_refused_on_every_device(device, op):
    """Findings 14 and 15: a masked array was computed with its mask ignored on one device and
    dropped on another; every device refuses it the same way, before anything runs, for every
    operator (each operand in turn masked, the others plain; shapes from the operator's cases)."""
    case = OPS[op].cases[OPS[op].quick[0]]
    for i in range(len(case.shapes)):
        args = [ones(*s) for s in case.shapes]
        args[i] = np.ma.masked_array(args[i], mask=np.zeros(case.shapes[i], bool))
        if args[i].size:
            args[i].mask.flat[0] = True
        with pytest.raises(InputTypeError, match=f"{op}: masked arrays are not supported.*x.filled"):
            getattr(opr, op)(**dict(zip(OPS[op].operands, args)), device=device, **case.attrs)  # by name: torch's order
        with pytest.raises(InputTypeError, match="tensor: masked arrays are not supported"):
            opr.tensor(args[i], device=device)
        if i:  # beside a Tensor (host data joins the Tensor's device): refused too
            with pytest.raises(InputTypeError, match="masked"):
                getattr(opr, op)(**dict(zip(OPS[op].operands, [opr.tensor(args[0], device=device), *args[1:]])),
                                 **case.attrs)


@pytest.mark.parametrize("data", [np.array(["a", "b"]), np.array([object(), 1.0], dtype=object),
                                  np.array([np.datetime64("2020-01-01")])], ids=["str", "object", "datetime"])
def test_non_numeric_arrays_are_an_input_type_error(data):
    with pytest.raises(InputTypeError, match="operands must be numeric arrays"):
        opr.softmax(data, device="cpu")


def test_bfloat16_host_arrays_are_numbers_not_an_input_type_error():
    """ml_dtypes' bfloat16 is a NumPy dtype of kind "V" (as structured arrays): host data in it
    was refused as "not an array of numbers"; it is taken, and a device without bfloat16
    kernels says so with a DtypeError."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.ones((2, 3), ml_dtypes.bfloat16)
    t = opr.tensor(x, device="cpu")
    assert t.dtype == np.dtype(ml_dtypes.bfloat16) and t.shape == (2, 3)
    with pytest.raises(DtypeError, match="no kernel computes bfloat16 on cpu"):
        opr.softmax(x, device="cpu")
    with pytest.raises(InputTypeError, match="numeric"):
        opr.softmax(np.zeros(3, [("a", np.float32)]), device="cpu")  # a structured array stays refused
