"""The activation epilogues on JAX devices, by the frontend's activation name
(``opruntime.ops.base.ACTIVATIONS``; None is no epilogue): ``activate(name, y)`` returns the
activated ``y`` (inside a jitted kernel XLA fuses it into the producer). NaN stays NaN."""

from __future__ import annotations

from typing import Any


def activate(name: str | None, y: Any) -> Any:
    import jax

    if name is None:
        return y
    if name == "relu":
        return jax.nn.relu(y)
    if name in ("gelu", "gelu_tanh"):
        return jax.nn.gelu(y, approximate=name == "gelu_tanh")
    if name == "silu":
        return jax.nn.silu(y)
    if name == "sigmoid":
        return jax.nn.sigmoid(y)
    if name == "tanh":
        import jax.numpy as jnp

        return jnp.tanh(y)
    raise ValueError(f"unknown activation {name!r}")
