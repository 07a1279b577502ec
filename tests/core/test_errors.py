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
    OpRuntimeError,
    ShapeError,
    UnknownDeviceError,
)

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
