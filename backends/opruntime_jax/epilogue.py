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
    if name == "gelu":  # 0.5 x erfc(-x / sqrt 2) in jax.nn
        return jax.nn.gelu(y, approximate=False)
    if name == "gelu_tanh":  # x sigmoid(2u) = 0.5 x (1 + tanh u), without jax.nn's 1 + tanh cancellation
        return y * jax.nn.sigmoid(1.5957691216057307118 * (y + 0.044715 * y * y * y))
    if name == "silu":
        return jax.nn.silu(y)
    if name == "sigmoid":
        return jax.nn.sigmoid(y)
    if name == "tanh":
        import jax.numpy as jnp

        return jnp.tanh(y)
    raise ValueError(f"unknown activation {name!r}")
