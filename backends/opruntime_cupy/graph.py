"""CUDA graphs for ``opr.capture`` (:meth:`CudaDevice.capture`).

The function runs once more, uncaptured, on a private stream (so that state a backend makes per
stream, such as cuBLASLt's workspace, exists before the recording), then once under
``cudaStreamBeginCapture`` (relaxed mode) on that stream; CuPy's ``end_capture`` gives the graph.
Every allocation of those two runs comes from a memory pool private to the graph, as torch's CUDA
graphs do: an intermediate freed during the recording goes back to that pool only, so no later
allocation outside the graph can take memory a replay will write. The pool lives as long as the
graph.

A replay copies the caller's arrays into the graph's input buffers (C-contiguous copies of the
first inputs), launches the graph on CuPy's current stream and copies the results out into new
arrays from the ordinary pool: three operations queued on one stream, so they run in order and the
host does not wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .cudnn import words


def _copy(dst: Any, src: Any) -> None:
    """``dst[...] = src`` on the current stream (one memcpy when both are C-contiguous)."""
    import cupy

    if dst.flags.c_contiguous and src.flags.c_contiguous:
        if src.nbytes:
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToDevice,
                                          cupy.cuda.get_current_stream().ptr)
    else:
        words(dst)[...] = words(src)


class CudaGraph:
    """A recorded call: the graph, its input buffers, its result arrays and its memory pool."""

    def __init__(self, dev: int, fn: Callable[[list[Any]], list[Any]], inputs: Sequence[Any]) -> None:
        import cupy

        self.dev = dev
        self.pool = cupy.cuda.MemoryPool()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with cupy.cuda.Device(dev):
            cupy.cuda.get_current_stream().synchronize()  # the inputs are written
            with cupy.cuda.using_allocator(self.pool.malloc), self.stream:
                self.inputs = [cupy.empty(x.shape, x.dtype) for x in inputs]
                for dst, src in zip(self.inputs, inputs):
                    _copy(dst, src)
                fn(self.inputs)  # per-stream state made outside the recording
                self.stream.synchronize()
                self.stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    self.outputs = fn(self.inputs)
                finally:
                    self.graph = self.stream.end_capture()
        upload = getattr(self.graph, "upload", None)  # (CuPy 13: the graph instantiated on the device now)
        if upload is not None:
            upload(self.stream)

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        import cupy

        with cupy.cuda.Device(self.dev):
            for dst, src in zip(self.inputs, inputs):
                _copy(dst, src)
            self.graph.launch(cupy.cuda.get_current_stream())
            outs = []
            for r in self.outputs:
                out = cupy.empty(r.shape, r.dtype)
                _copy(out, r)
                outs.append(out)
            return outs
