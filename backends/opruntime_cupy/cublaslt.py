"""cuBLASLt on CUDA, called directly: the GEMM with its fused epilogues (bias, ReLU, GELU).

torch's ``F.linear`` on CUDA is one ``cublasLtMatmul`` with the bias epilogue; this module makes
the same call available as a candidate. It goes through nvmath-python's *low-level* bindings
(``nvmath.bindings.cublasLt``: one Cython function per C function), not through
``nvmath.linalg.advanced.Matmul``: that object costs about 40 us of host time per call
(``reset_operands`` + ``execute`` in Python), and its plan, made on stand-in operands, ran the
GPT-2 MLP's GEMM 3.4x slower than cuBLAS on the H100.

:class:`GemmNT` is planned once per problem (shapes and strides): the descriptors, and the
heuristic's first algorithm for each alignment class met. A call writes the bias pointer into the
descriptor and issues one ``cublasLtMatmul`` on CuPy's current stream (a few microseconds of
host time). The layout is torch's: row-major ``y (m, n) = x (m, k) @ w (n, k).T`` is column-major
``y.T (n, m) = w @ x.T``, so ``w`` is cuBLASLt's A (transposed when its rows are unit-stride), ``x``
its B, the bias runs along D's rows (cuBLASLt's bias is per row of D) and nothing is copied.

Alignment is part of the plan: cuBLASLt's heuristic assumes 256-byte aligned operands unless told
otherwise (``MIN_ALIGNMENT_*_BYTES``), and an algorithm chosen under that assumption may fail, or
fault, on an offset view. The alignment of each call (the largest power of two, up to 256, that
divides every pointer and leading-dimension byte count) picks the algorithm planned for it;
algorithms for a smaller alignment are found when first needed.

Types: float16 and bfloat16 in and out with float32 accumulation (``CUBLAS_COMPUTE_32F``), float32
as true float32 (``CUBLAS_COMPUTE_32F``, not the TF32 compute type), float64 in float64. One handle
per device, and one workspace (:data:`WORKSPACE_BYTES`, from CuPy's pool, held for the process) per
stream that calls it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

from opruntime.kernels import itemsize

#: cublasLtEpilogue_t names by (activation, bias?); cuBLASLt's GELU is the tanh approximation
EPILOGUE = {(None, False): "DEFAULT", (None, True): "BIAS", ("relu", False): "RELU", ("relu", True): "RELU_BIAS",
            ("gelu_tanh", False): "GELU", ("gelu_tanh", True): "GELU_BIAS"}
#: cudaDataType_t and cublasComputeType_t (library_types.h, cublas_api.h)
CUDA_R = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
COMPUTE = {"float32": 68, "float64": 70, "float16": 68, "bfloat16": 68}  # 32F / 64F (no TF32)
OP_N, OP_T = 0, 1
#: the workspace cuBLASLt may use (torch gives it 32 MiB on Hopper: its large-tile kernels want it)
WORKSPACE_BYTES = 32 << 20


@cache
def missing() -> str:
    """Why cuBLASLt cannot be called ("" when it can): nvmath-python's bindings and the library."""
    try:
        from nvmath.bindings import cublasLt

        cublasLt.get_version()
    except Exception as exc:  # noqa: BLE001 - any failure to load makes the candidate absent
        return f"cuBLASLt is not callable ({type(exc).__name__}: {exc}); pip install nvmath-python"
    return ""


class _DeviceState:
    """One cuBLASLt handle per device, and one workspace per stream that calls it (two streams
    running at once must not share one): made on first use, kept."""

    _lock = threading.Lock()
    _by_device: dict[int, _DeviceState] = {}

    def __init__(self, dev: int) -> None:
        import cupy
        from nvmath.bindings import cublasLt

        self.dev = dev
        with cupy.cuda.Device(dev):
            self.handle = cublasLt.create()
        self.workspaces: dict[int, Any] = {}

    def workspace(self, stream: int) -> int:
        """The workspace's address for ``stream`` (a CuPy stream's pointer): from CuPy's default
        pool whatever allocator is current (a graph's private pool must not own it)."""
        ws = self.workspaces.get(stream)
        if ws is None:
            import cupy

            with self._lock, cupy.cuda.Device(self.dev):
                ws = self.workspaces[stream] = cupy.get_default_memory_pool().malloc(WORKSPACE_BYTES)
        return ws.ptr

    @classmethod
    def of(cls, dev: int) -> _DeviceState:
        with cls._lock:
            st = cls._by_device.get(dev)
            if st is None:
                st = cls._by_device[dev] = cls(dev)
            return st


def _set(setter: Any, obj: int, attr: Any, dtype_of: Any, value: Any) -> None:
    buf = np.asarray(value, dtype=dtype_of(attr))
    setter(obj, attr, buf.ctypes.data, buf.nbytes)


def _operand(rows: int, cols: int, strides: Sequence[int]) -> tuple[int, int] | None:
    """(op, ld) describing a row-major-indexed (rows, cols) matrix of element ``strides`` as
    cuBLASLt's column-major operand of shape (cols, rows) (op N) or (rows, cols) read transposed
    (op T): row-major rows are column-major columns. None for a layout with no unit stride."""
    s0, s1 = strides
    if s1 == 1 or cols == 1:  # rows are unit-stride: column-major (cols, rows), ld = row stride
        return OP_N, max(s0 if rows > 1 else cols, cols, 1)
    if s0 == 1 or rows == 1:  # columns are unit-stride: column-major (rows, cols), read transposed
        return OP_T, max(s1 if cols > 1 else rows, rows, 1)
    return None


def layout_ok(shape: Sequence[int], strides: Sequence[int] | None) -> bool:
    """A 2-D operand cuBLASLt reads in place: one unit stride, none negative."""
    if strides is None:
        return True
    return all(s >= 0 for s in strides) and _operand(shape[0], shape[1], strides) is not None


def row_stride(shape: Sequence[int], strides: Sequence[int] | None) -> int | None:
    """The leading dimension of a row-major (m, n) matrix of element ``strides`` read as
    cuBLASLt's column-major (n, m) C (a residual): its row stride, when its rows are unit-stride
    and do not overlap; None otherwise (C order when ``strides`` is None)."""
    m, n = shape
    if strides is None:
        return max(n, 1)
    s0, s1 = strides
    if n > 1 and s1 != 1:
        return None
    ld = s0 if m > 1 else max(n, 1)
    return ld if ld >= max(n, 1) else None


class GemmNT:
    """``run(x, w, bias, y, residual=None)``: ``y = act(x @ w.T + bias + residual)`` by one
    ``cublasLtMatmul`` on the current stream, for the problem's shapes and element strides (``x``
    (m, k), ``w`` (n, k), ``y`` (m, n) C-contiguous, ``bias`` (n,) contiguous or None, the
    residual (m, n) with row stride ``residual_ld`` (cuBLASLt's C, beta 1) when that is given).
    Raises ``cuBLASLtError`` when no algorithm serves the call's alignment (the selector then
    drops the candidate for the problem)."""

    def __init__(self, dtype: str, dev: int, m: int, n: int, k: int, x_strides: Sequence[int],
                 w_strides: Sequence[int], activation: str | None, bias: bool, residual_ld: int | None = None) -> None:
        import cupy
        from nvmath.bindings import cublasLt as lt

        self._lt = lt
        self._state = _DeviceState.of(dev)
        isz = itemsize(dtype)
        self._stream = cupy.cuda.get_current_stream
        scalar = np.float64 if dtype == "float64" else np.float32
        # host scalars, kept alive; beta 1 adds C (the residual)
        self._alpha, self._beta = np.ones(1, scalar), np.full(1, 0 if residual_ld is None else 1, scalar)
        # their addresses read once: ndarray.ctypes builds an object per read (1-2 us of a call's host time)
        self._alpha_p, self._beta_p = self._alpha.ctypes.data, self._beta.ctypes.data
        # A = w read as (n, k); B = x.T as (k, m); D = y.T (n, m), column-major, ld n
        wa = _operand(n, k, w_strides)  # w row-major (n, k) is column-major (k, n): op T gives (n, k)
        xb = _operand(m, k, x_strides)  # x row-major (m, k) is column-major (k, m): op N gives (k, m)
        if wa is None or xb is None:
            raise ValueError(f"cuBLASLt: operand strides {x_strides} / {w_strides} have no unit stride")
        op_a = OP_T if wa[0] == OP_N else OP_N
        op_b = OP_N if xb[0] == OP_N else OP_T
        # the leading dims' byte counts bound the alignment too (a row of A starts lda elements on)
        self._ld_bits = 256 | (wa[1] * isz) | (xb[1] * isz) | (n * isz) | ((residual_ld or n) * isz)
        t = CUDA_R[dtype]
        self._desc = lt.matmul_desc_create(COMPUTE[dtype], CUDA_R["float64" if dtype == "float64" else "float32"])
        setd, dt = lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype
        A = lt.MatmulDescAttribute
        _set(setd, self._desc, A.TRANSA, dt, op_a)
        _set(setd, self._desc, A.TRANSB, dt, op_b)
        _set(setd, self._desc, A.EPILOGUE, dt, getattr(lt.Epilogue, EPILOGUE[(activation, bias)]))
        self._bias_attr = A.BIAS_POINTER
        self._bias_buf = np.zeros(1, dt(A.BIAS_POINTER))
        self._bias_p = self._bias_buf.ctypes.data
        # column-major layouts: A stored (k, n) for op T or (n, k) for op N, B (k, m) or (m, k), D (n, m)
        self._a = lt.matrix_layout_create(t, *((k, n) if op_a == OP_T else (n, k)), wa[1])
        self._b = lt.matrix_layout_create(t, *((k, m) if op_b == OP_N else (m, k)), xb[1])
        self._d = lt.matrix_layout_create(t, n, m, n)
        self._c = self._d if residual_ld in (None, n) else lt.matrix_layout_create(t, n, m, residual_ld)
        self._algos: dict[int, int] = {}  # alignment -> the algorithm's address (its result held below)
        self._results: list[Any] = []
        self._lock = threading.Lock()
        self.algorithm(256)  # the common case planned now: a failure shows at prepare, not at a call

    def algorithm(self, align: int) -> int:
        """The address of the heuristic's first algorithm for operands aligned to ``align`` bytes
        (cached)."""
        algo = self._algos.get(align)
        if algo is not None:
            return algo
        lt = self._lt
        pref = lt.matmul_preference_create()
        try:
            setp, dt = lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype
            P = lt.MatmulPreferenceAttribute
            _set(setp, pref, P.MAX_WORKSPACE_BYTES, dt, WORKSPACE_BYTES)
            for attr in (P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                         P.MIN_ALIGNMENT_D_BYTES):
                _set(setp, pref, attr, dt, align)
            results = lt.MatmulHeuristicResult(1)
            count = np.zeros(1, np.int32)
            lt.matmul_algo_get_heuristic(self._state.handle, self._desc, self._a, self._b, self._c, self._d, pref, 1,
                                         results.ptr, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        if not count[0]:
            raise lt.cuBLASLtError(15)  # CUBLAS_STATUS_NOT_SUPPORTED: no algorithm for this alignment
        self._results.append(results)  # held: the address below points into it
        self._algos[align] = ptr = int(results.ptr)
        return ptr

    def __call__(self, x: Any, w: Any, bias: Any, y: Any, residual: Any = None) -> None:
        xp, wp, yp = x.data.ptr, w.data.ptr, y.data.ptr
        cp = yp if residual is None else residual.data.ptr
        bits = xp | wp | yp | cp | self._ld_bits
        align = bits & -bits
        algo = self._algos.get(align) or self.algorithm(align)
        st = self._state
        stream = self._stream().ptr
        ws = st.workspace(stream)
        with self._lock:  # the bias pointer lives in the shared descriptor until the launch is queued
            if bias is not None and bias.data.ptr != self._bias_buf[0]:  # a model's layer: the same bias each call
                self._bias_buf[0] = bias.data.ptr
                self._lt.matmul_desc_set_attribute(self._desc, self._bias_attr, self._bias_p, 8)
            self._lt.matmul(st.handle, self._desc, self._alpha_p, wp, self._a, xp, self._b,
                            self._beta_p, cp, self._c, yp, self._d, algo, ws, WORKSPACE_BYTES,
                            stream)

    def __del__(self) -> None:
        lt = getattr(self, "_lt", None)
        if lt is None:
            return
        try:
            for layout in {self._a, self._b, self._c, self._d}:
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(self._desc)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: the library may be gone
            pass
