"""The JAX side of ``opr.mesh``: a ``jax.sharding.Mesh`` over the members, XLA's all-reduce
(``psum`` inside ``shard_map``) and ``jax.device_put`` between members.

A mesh tensor keeps one committed ``jax.Array`` per member (``opruntime.mesh``), so uneven
splits need no padding, and each member computes its piece with the kernel the selector picks
for it. Only the sum of a matmul sharded along K crosses devices: the members' partial products
(one shape, so evenly split) are stacked into one global array sharded over the mesh axis
(``jax.make_array_from_single_device_arrays`` with a ``NamedSharding``: no copy), summed by a
jitted ``shard_map`` of ``psum``, and each member's replica of the sum is taken back from the
result's addressable shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .compile import x64_scope

#: platform -> (bytes per second between two members, seconds per transfer): host memory for CPU
#: "devices" (one process), NVLink-class links for GPUs, ICI for TPUs. Rough figures for the
#: cost model, as ``compile.FIGURES``.
LINKS: dict[str, tuple[float, float]] = {"cpu": (10e9, 10e-6), "gpu": (150e9, 20e-6), "tpu": (100e9, 20e-6)}
AXIS = "members"


class JaxMesh:
    """The :class:`~opruntime.hookspecs.MeshEngine` of JAX devices (``members``: the
    ``JaxDevice`` providers, in the mesh's order)."""

    def __init__(self, members: Sequence[Any]) -> None:
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.members = list(members)
        self.mesh = Mesh(np.array([m.jdev for m in self.members]), (AXIS,))
        self.stacked = NamedSharding(self.mesh, PartitionSpec(AXIS))
        self.bandwidth, self.latency = LINKS.get(self.members[0].platform, LINKS["gpu"])
        # each member's block is (1, *shape); psum gives every member the sum, replicated
        self._sum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, AXIS), mesh=self.mesh,
                                          in_specs=PartitionSpec(AXIS), out_specs=PartitionSpec()))

    def move(self, data: Any, provider: Any) -> Any:
        import jax

        with x64_scope():
            return jax.device_put(data, provider.jdev)

    def all_reduce(self, datas: Sequence[Any]) -> list[Any]:
        import jax

        shape = tuple(datas[0].shape)
        with x64_scope():
            stacked = jax.make_array_from_single_device_arrays((len(datas), *shape), self.stacked,
                                                               [d.reshape((1, *shape)) for d in datas])
            total = self._sum(stacked)
            replicas = {s.device: s.data for s in total.addressable_shards}
            return [replicas[m.jdev].reshape(shape) for m in self.members]
