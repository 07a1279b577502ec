"""The CUDA side of ``opr.mesh``: NCCL through CuPy (``cupy.cuda.nccl``) and peer copies.

A mesh tensor keeps one CuPy array per member GPU (``opruntime.mesh``); each member computes its
piece with the kernel the selector picks for it, launched on that GPU's current stream, so the
GPUs work at once. The one collective, the sum of a matmul sharded along K, is NCCL's
``allReduce`` over communicators made once per mesh (``NcclCommunicator.initAll`` over the
members' device ids: one process drives every GPU; a one-GPU mesh is an NCCL world of one, which
runs the same code path). The all-reduces of the members are one NCCL group (``groupStart`` /
``groupEnd``), as NCCL requires when one thread drives several devices. Moving a piece between
GPUs is a device-to-device copy (peer-to-peer over NVLink or PCIe where the GPUs allow it; CUDA
stages it through the host where they do not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .memory import empty, oom_guard

#: bytes per second between two GPUs, for the cost model: NVLink 4 (H100 / H200 SXM: 450 GB/s
#: each way, of which NCCL's ring reaches about 2/3), PCIe 5 x16 (64 GB/s, about 2/3 reached),
#: and through the host (no peer access). Latency: one NCCL call or copy, in seconds.
NVLINK, PCIE, HOST, LATENCY = 300e9, 40e9, 10e9, 15e-6


def nccl_dtype(dtype: np.dtype) -> int:
    """NCCL's data-type code for a float dtype (bfloat16: NCCL 2.10+'s ``ncclBfloat16``, 9)."""
    from cupy.cuda import nccl

    codes = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
             "bfloat16": getattr(nccl, "NCCL_BFLOAT16", 9)}
    return codes[np.dtype(dtype).name]


class CudaMesh:
    """The :class:`~opruntime.hookspecs.MeshEngine` of CUDA devices (``members``: the
    ``CudaDevice`` providers, in the mesh's order): one NCCL communicator per member."""

    def __init__(self, members: Sequence[Any]) -> None:
        import cupy
        from cupy.cuda import nccl

        self.ids = [m.index for m in members]
        self.comms = nccl.NcclCommunicator.initAll(list(self.ids))  # rank i drives GPU ids[i]
        runtime = cupy.cuda.runtime
        pairs = [(a, b) for a in self.ids for b in self.ids if a != b]
        peer = all(runtime.deviceCanAccessPeer(a, b) for a, b in pairs)
        nvlink = peer and all("H100" in m.description or "H200" in m.description or "A100" in m.description
                              for m in members)
        self.bandwidth = NVLINK if nvlink else PCIE if peer else HOST
        self.latency = LATENCY

    def move(self, data: Any, provider: Any) -> Any:
        """A copy of ``data`` on GPU ``provider.index``, ordered after the work queued on both."""
        import cupy

        with cupy.cuda.Device(data.device.id):
            src = cupy.ascontiguousarray(data)
            cupy.cuda.get_current_stream().synchronize()  # the producer's work is done before the copy
        with cupy.cuda.Device(provider.index), oom_guard(f"copy to {provider.name}", src.nbytes):
            out = empty(src.shape, src.dtype, f"copy to {provider.name}")
            if src.size:
                out.data.copy_from_device_async(src.data, src.nbytes)
            return out

    def all_reduce(self, datas: Sequence[Any]) -> list[Any]:
        """The sum of ``datas`` (one CuPy array per member) on every member: NCCL ``allReduce``,
        one call per member in one NCCL group, each on its GPU's current stream."""
        import cupy
        from cupy.cuda import nccl

        sends, outs = [], []
        for dev, x in zip(self.ids, datas):
            with cupy.cuda.Device(dev):
                sends.append(cupy.ascontiguousarray(x))
                outs.append(empty(x.shape, x.dtype, "all-reduce"))
        code = nccl_dtype(datas[0].dtype)
        nccl.groupStart()
        try:
            for comm, dev, src, dst in zip(self.comms, self.ids, sends, outs):
                with cupy.cuda.Device(dev):
                    comm.allReduce(src.data.ptr, dst.data.ptr, src.size, code, nccl.NCCL_SUM,
                                   cupy.cuda.get_current_stream().ptr)
        finally:
            nccl.groupEnd()
        return outs
