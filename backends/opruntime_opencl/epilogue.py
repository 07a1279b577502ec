"""The activation epilogue codes of ``epilogue.cl``: the ``ACT`` define of a kernel build, by the
frontend's activation name (``opruntime.ops.base.ACTIVATIONS``; None is no epilogue)."""

from __future__ import annotations

ACT: dict[str | None, int] = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5, "tanh": 6}
