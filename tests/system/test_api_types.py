"""The public API as a type checker and the API reference see it.

Every public function has a return type that resolves (``typing.get_type_hints``: the package
ships ``py.typed``, so these are what users' checkers read), the operators take ``ArrayLike``
operands and a ``DeviceLike`` device, and every docstring parses as the reference renders it
(griffe, Google style): one row per parameter, each a real parameter, and one exception per
``Raises`` row. A row that packs two parameters (``x: ... w: ...``) shows as one wrong row.
"""

from __future__ import annotations

import inspect
import logging
import re
import typing
from pathlib import Path

import pytest

import opruntime as opr
from opruntime import errors
from opruntime.ops import FUNCTIONS

griffe = pytest.importorskip("griffe")  # the docs extra (mkdocstrings' parser)
Kind = griffe.DocstringSectionKind

PUBLIC = {name: getattr(opr, name) for name in opr.__all__ if inspect.isfunction(getattr(opr, name))}
METHODS = {f"Tensor.{n}": f for n, f in vars(opr.Tensor).items() if inspect.isfunction(f) and not n.startswith("_")}


def _sections(fn: typing.Callable[..., typing.Any]) -> list[typing.Any]:
    logging.getLogger("griffe").setLevel(logging.ERROR)  # "no type in the docstring": it comes from the annotation
    return griffe.Docstring(inspect.cleandoc(fn.__doc__ or ""), lineno=1).parse("google")


def test_the_package_is_typed() -> None:
    assert (Path(opr.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("name", sorted(PUBLIC) + sorted(METHODS))
def test_every_public_function_has_a_return_type(name: str) -> None:
    fn = PUBLIC.get(name) or METHODS[name]
    hints = typing.get_type_hints(fn)  # raises when an annotation names something its module lacks
    assert "return" in hints, f"{name} has no return annotation"
    assert hints["return"] is not typing.Any, f"{name} returns Any"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_operators_take_array_likes_and_return_tensors(name: str) -> None:
    fn = FUNCTIONS[name]
    op = fn.operator
    hints = typing.get_type_hints(fn)
    assert hints["return"] is opr.Tensor
    assert hints["device"] == opr.typing.DeviceLike
    for i, operand in enumerate(op.operands):
        optional = op.required is not None and i >= op.required
        want = opr.typing.ArrayLike | None if optional else opr.typing.ArrayLike
        assert hints[operand] == want, f"{name}({operand}) is {hints[operand]}"
    assert all(hints[a] is not typing.Any for a in op.attributes), f"{name} has an attribute typed Any"


def test_the_aliases_accept_what_the_operators_accept() -> None:
    np = pytest.importorskip("numpy")
    x = np.ones((2, 3), np.float32)
    assert isinstance(x, opr.typing.SupportsDLPack)  # NumPy exports DLPack, as torch, CuPy and JAX do
    assert isinstance(opr.tensor(x), opr.typing.SupportsDLPack)
    assert typing.get_args(opr.typing.DeviceLike)[-1] is type(None)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_docstring_tables_have_one_row_per_parameter(name: str) -> None:
    fn = PUBLIC[name]
    params = [p for p in inspect.signature(fn).parameters]
    sections = _sections(fn)
    for section in sections:
        if section.kind is Kind.parameters:
            rows = [p.name for p in section.value]
            assert len(rows) == len(set(rows)), f"{name}: a parameter documented twice: {rows}"
            unknown = [r for r in rows if r not in params and f"*{r}" not in params and f"**{r}" not in params]
            assert not unknown, f"{name}: Args names {unknown}, which are not parameters of {params}"
            for row in section.value:
                packed = [p for p in params if p != row.name and re.search(rf"(^|\s){p}: ", row.description)]
                assert not packed, f"{name}: the row of {row.name!r} also holds {packed}: one parameter a line"
            if fn in FUNCTIONS.values():  # an operator's table documents every parameter, or none
                assert set(rows) == set(params), f"{name}: Args lacks {sorted(set(params) - set(rows))}"
        if section.kind is Kind.raises:
            for row in section.value:
                exc = str(row.annotation)
                assert "," not in exc and isinstance(getattr(errors, exc, None), type), (
                    f"{name}: Raises row {exc!r} must be one exception of opruntime.errors")
                assert "Error:" not in row.description, f"{name}: two exceptions in the row of {exc}"
        if section.kind is Kind.returns:
            assert len(section.value) == 1, f"{name}: Returns reads as {len(section.value)} values (indent its lines)"


def test_conv2d_documents_each_parameter_in_its_own_row() -> None:
    """The issue's case: w, bias, padding and groups were folded into the rows of x, stride, dilation."""
    (args,) = [s for s in _sections(opr.conv2d) if s.kind is Kind.parameters]
    rows = {p.name: p.description for p in args.value}
    assert list(rows) == ["x", "w", "bias", "stride", "padding", "dilation", "groups", "activation", "device"]
    assert "(O, C // groups, kH, kW)" in rows["w"] and "same" in rows["padding"] and "divides" in rows["groups"]
