"""A stand-in for a CUDA device, for the CUDA backend's tests without a GPU (imported by its tests
as ``fake_backend`` is: pytest puts the test folder on ``sys.path``)."""

from __future__ import annotations


class StandInProvider:
    """What the kernels read of a CudaDevice: an H100's figures."""

    index = 0
    sm_count = 132

    def figures(self):
        from opruntime_cupy import memory

        return memory.figures_for("NVIDIA H100 80GB HBM3", self.sm_count)

    def reshape(self, data, shape):  # the frontend's view of an operand (host arrays stand in here)
        return data.reshape(shape)


class StandInDevice:
    """A device whose name no kernel could parse: kernels must read ``provider`` only."""

    name, kind, provider = "stand-in", "cuda", StandInProvider()
