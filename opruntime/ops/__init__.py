"""The operators: one module each (``opruntime/ops/<name>.py``), found here by themselves.

:data:`OPS` maps operator names to their :class:`~.base.Operator`; :data:`FUNCTIONS` maps them to
their public functions, which are also attributes of this package (and of ``opruntime``). Adding
an operator is adding its file: nothing here or elsewhere in the frontend lists operators.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from .. import config, selector
from ..config import settings
from ..errors import NoKernelError
from . import base
from .base import FLOAT_ORDER, Case, Normalized, Operator, place, result_dtype

OPS: dict[str, Operator] = {}
FUNCTIONS: dict[str, Callable[..., Any]] = {}


def _discover() -> None:
    """Import every operator module of this package and collect its operators and functions."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            op = getattr(value, "operator", None)
            if callable(value) and isinstance(op, Operator) and value.__name__ == op.name:
                OPS[op.name] = op
                FUNCTIONS[op.name] = value
    config.OPERATORS.update(OPS)


_discover()
globals().update(FUNCTIONS)


def explain(op: str, *args: Any, device: Any = None, **attrs: Any) -> selector.Explanation:
    """Which kernel ``opr.<op>(*args, **attrs)`` would run, the candidates, and why.

    Example:
        >>> print(opr.explain("matmul", a, b))
    """
    if op not in OPS:
        close = difflib.get_close_matches(op, list(OPS), n=2)
        raise NoKernelError(f"explain: unknown operator {op!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                            + f" Operators: {', '.join(OPS)}")
    operator = OPS[op]
    s = settings()
    args, attrs = operator.operands_by_name(args, attrs)
    while args and args[-1] is None:  # trailing optional operands given as None: absent, as in the call
        args = args[:-1]
    inputs, triples = operator.adapt(tuple(args), operator.attr_key(attrs))  # the call as it runs
    if base.mesh is not None and (spread := base.mesh.explain(operator, inputs, device, triples)) is not None:
        return spread
    attrs = {k: v for k, v, _ in triples}
    datas, dev = place(op, operator.operands, inputs, device, s, operator.masks)
    try:
        key = operator.key(s, dev, datas, triples)
        cached = key in selector.plans
    except TypeError:
        cached = False
    # a cached plan shows what calls really run (kernels that failed since are marked so)
    plan = selector.plans.get(key) if cached else operator.plan(datas, dev, attrs, s)
    plan = getattr(plan, "plan", plan)
    rows = plan.rows if plan.rows else plan.order
    chosen = plan.order[0].label if plan.order else None
    return selector.Explanation(plan.problem, dev.name, rows, chosen, plan.why, cached)


__all__ = ["FLOAT_ORDER", "FUNCTIONS", "OPS", "Case", "Normalized", "Operator", "explain", "result_dtype",
           *FUNCTIONS]
