"""cuDNN on CUDA, through its Python graph API (``nvidia-cudnn-frontend``): two vendor candidates.

* ``cupy.scaled_dot_product_attention.cudnn``: cuDNN's fused flash attention (``graph.sdpa``,
  inference: no softmax statistics), float16 / bfloat16 with float32 accumulation. Causal is
  cuDNN's top-left diagonal (``use_causal_mask``: key j is seen by query i when j <= i, as torch
  and the operator say); GQA is cuDNN's own (k / v with fewer heads that divide q's). An additive
  float mask is cuDNN's ``bias`` (batch and heads 1 or full, one row broadcast over the queries by a
  zero stride); a boolean mask becomes that bias (0 where True, -inf where False) in one pass.
  A mask with one column adds one value per row, which the softmax does not see: no bias at all,
  only the rows' fix below. Rows whose every key is masked are zeros and rows a NaN (or +inf)
  reaches are NaN, whatever the fused kernel gives for them: one pass over the mask finds them and
  one over the output sets them, so the contract never rests on the engine's handling of -inf. No
  L x S buffer anywhere (S = 32768 runs). What cuDNN cannot express is refused in ``supports``:
  head dims that are not multiples of 8 or over 256, a broadcast batch, q with fewer heads than
  the output, k and v with different head counts. On the H100: 4 x 16 x 4096 x 128 float16 in
  491 us causal and 833 us full (torch's 491 and 832), S = 32768 causal on 8 heads in 3.5 ms.
* ``cupy.conv2d.cudnn``: ``graph.conv_fprop`` with the bias and the activation fused in the same
  graph as pointwise nodes (bias, relu, gelu (erf), gelu_approx_tanh, swish with beta 1 for silu),
  every attribute of the operator (stride, 4-sided padding as pre / post padding, dilation, groups
  from the weight's channel dim). float32 is true float32: engines with TF32 tensor cores or
  down-converted inputs (and FFT) are deselected (``deselect_numeric_notes``), and a frontend
  without that knob makes ``supports`` refuse float32; float16 / bfloat16 accumulate in float32
  (reduced-precision reductions deselected). ``prepare`` builds the fused graph and the
  convolution alone (its bias and activation then one pass after it, ``linear.cu``'s
  ``bias_act``), the first four plans of each, times every plan on scratch operands and keeps the
  fastest: cuDNN's heuristic order is not its speed order (its fused float16 1x1 convolution of
  ResNet-50 took 106 us on the H100, the convolution alone plus the pass 36 us; torch 57 us). Two
  configs: ``nchw`` describes the operands in place through their strides; ``nhwc`` transposes
  input and weight to channels-last inside its launch (cuDNN's fast layout; ``layout.py``'s
  copies) and the result back, so its time includes the layout change: on ResNet-50's layers it
  still loses to ``nchw`` (73.7 vs 60.3 us on the 64-channel 3x3 layer in fp16, H100), so it
  ranks second.

The plumbing: the frontend is imported lazily (importing this module imports neither CuPy nor
cuDNN). A missing frontend or library is a reason (:func:`cudnn_missing`, shown by
``opruntime info``) and each kernel's ``supports`` answers a :class:`Refusal` (a false string
that carries it), never an error. One cuDNN handle per device and thread, set to CuPy's current
stream on every call. Each ``prepare(problem, config)`` builds the graph once (heuristics A then
FALLBACK; python-side engines of the frontend deselected, so the plan is cuDNN's own library) and
keeps it with its workspace (``cupy.empty`` from CuPy's pool) in the launch the runtime caches. A
launch passes raw device pointers to the C++ graph (:func:`_executor`: the 1.3x frontend's Python
``execute`` costs 50-150 us of host time per call). Operands whose layout cuDNN cannot take (a
stride that is not a multiple of 16 bytes, a negative one) are copied to a contiguous layout
described that way at build time; an operand whose base address is not 16-byte aligned is copied
to an aligned buffer of the same strides at the call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from opruntime.errors import KernelError
from opruntime.kernels import Kernel, Problem, Refusal, c_strides, itemsize

from . import memory
from .conv_launch import Conv, int32_ok

HALVES = frozenset({"float16", "bfloat16"})
CONV_DTYPES = frozenset({"float32", "float16", "bfloat16"})
#: numerical notes of the engines each dtype must not run: TF32 tensor cores / down-converted
#: inputs for float32 (the operator's float32 is float32), float16 accumulation, and FFT (its
#: rounding is not a direct convolution's)
DESELECT = {"float32": ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "FFT"),
            "float16": ("REDUCED_PRECISION_REDUCTION", "FFT"),
            "bfloat16": ("REDUCED_PRECISION_REDUCTION", "FFT")}
#: the frontend's python-side engine families, never planned here (this candidate is cuDNN's library)
PY_FAMILIES = ("frost_sdpa_fwd", "frost_conv")
CUDNN_TYPE = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BFLOAT16"}
ALIGN = 16  # bytes: the alignment cuDNN's engines assume of every operand's base and strides
#: the 16-bit words of -inf, +inf and a quiet NaN per dtype (bfloat16 has no CuPy arithmetic)
BITS = {"float16": (0xFC00, 0x7C00, 0x7E00), "bfloat16": (0xFF80, 0x7F80, 0x7FC0)}
#: host seconds per call, overlapping the GPU's work (a call costs the larger): the C++ graph's
#: execute, the operands' checks and the output (35 us measured on the H100's host); a mask's bias
#: and rows' fix add four CuPy launches (170 us with a boolean mask)
HOST_S, HOST_MASK_S = 35e-6, 140e-6
#: of the tensor-core peak, cuDNN's fused attention on an H100 (4 x 16 x 4096 x 128 float16: 0.57
#: causal, 0.67 full), scaled by (E / 128) ** 0.6 below 128: head dim 64 (B*S = 16384, H = 32)
#: ran at 0.41 full, 0.31 causal at S=1024 to 0.43 at S=16384
SDPA_EFF = 0.6
#: of the peak (tensor cores for 16-bit, the float32 FMA rate for float32), the GPU suite's ResNet-50
#: convolutions on an H100 in place (NCHW), 2026-11-24: 16-bit 60-62 us on the 3x3 layers, float32
#: 255-275 us (0.41 of the FMA peak); scaled by (C / 32) ** CONV_SMALL_C below 32 channels per group
#: (the 3-channel 7x7 stem: 337 us in 16-bit, 390 us in float32)
CONV_EFF = {"half": 0.124, "float32": 0.41}
CONV_SMALL_C = {"half": 0.72, "float32": 0.15}
TRANSPOSE_EFF = 0.5  # of the memory bandwidth: layout.cu's copies to and from channels-last (the nhwc config)
CONV_CONFIGS = ({"layout": "nhwc"}, {"layout": "nchw"})
MEASURE_PLANS = 4  # convolution plans built and timed in prepare (cuDNN's first is often not its fastest)
SOURCE = "cudnn graph API (nvidia-cudnn-frontend), opruntime_cupy/cudnn.py v1"


# -- availability ---------------------------------------------------------------------------------
def probe() -> str:
    """Why cuDNN cannot be used here ("" when it can): the frontend's import, then the library."""
    try:
        import cudnn
    except Exception as exc:  # noqa: BLE001 - any import failure (missing wheel, broken CUDA) is a reason
        return f"the cuDNN frontend is not importable ({type(exc).__name__}: {exc}); pip install nvidia-cudnn-frontend"
    try:
        version = int(cudnn.backend_version())
    except Exception as exc:  # noqa: BLE001 - the frontend imports without the library; its first call fails
        return (f"the cuDNN library is not loadable ({type(exc).__name__}: {exc}); pip install nvidia-cudnn-cu13 "
                f"(or cu12, as CuPy's CUDA)")
    if version < 90000:
        return f"cuDNN {version} is older than 9.0 (the graph API's fused attention and runtime fusion)"
    return ""


@cache
def cudnn_missing() -> str:
    """:func:`probe`, once per process."""
    return probe()


def info() -> dict[str, str]:
    """The ``cudnn`` line of ``opruntime info`` for a CUDA device: versions, or why it is absent."""
    why = cudnn_missing()
    if why:
        return {"cudnn": f"unavailable: {why}"}
    import cudnn

    try:
        backend = cudnn.backend_version_string()
    except Exception:  # noqa: BLE001 - older frontends: the number only
        backend = str(cudnn.backend_version())
    return {"cudnn": f"{backend} (frontend {getattr(cudnn, '__version__', '?')})"}


def _tf32_knob() -> bool:
    """Whether the frontend can deselect engines by numerical note (how float32 stays float32)."""
    import cudnn

    return hasattr(cudnn.pygraph, "deselect_numeric_notes") and hasattr(cudnn, "numerical_note")


# -- the handle, the graph, the call ---------------------------------------------------------------
_LOCAL = threading.local()


def handle(dev: int) -> Any:
    """The cuDNN handle of device ``dev`` for the calling thread (cuDNN's handles are per thread)."""
    handles = getattr(_LOCAL, "handles", None)
    if handles is None:
        handles = _LOCAL.handles = {}
    h = handles.get(dev)
    if h is None:
        import cudnn
        import cupy

        with cupy.cuda.Device(dev):
            h = handles[dev] = cudnn.create_handle()
    return h


def _python_engines() -> list[str]:
    """Names of the frontend's python-side engines of :data:`PY_FAMILIES` (none before 1.2x)."""
    try:
        from cudnn.engines import manifest
    except Exception:  # noqa: BLE001 - a frontend without python engines
        return []
    return [name for fam in getattr(manifest, "MANIFEST", ()) if fam.name in PY_FAMILIES for name in fam.slots]


def build(graph: Any, dtype: str, measure: int = 1) -> list[int | None]:
    """Validate, plan (heuristics A, then FALLBACK) with the engines of :data:`DESELECT` and the
    python-side ones taken out, and build: the first plan that builds (``[None]``: the graph's own
    selection), or with ``measure`` > 1 the first ``measure`` plans that build (their indices in
    the ranked list), for :meth:`Runner.choose` to time."""
    import cudnn

    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    notes = [getattr(cudnn.numerical_note, n) for n in DESELECT.get(dtype, ()) if hasattr(cudnn.numerical_note, n)]
    if notes:
        graph.deselect_numeric_notes(notes)
    py = _python_engines()
    if py:
        graph.deselect_engines(py)
    graph.check_support()
    if measure <= 1:
        graph.build_plans()
        return [None]
    built: list[int | None] = []
    errors = []
    for i in range(graph.get_execution_plan_count()):
        try:
            graph.build_plan_at_index(i)
        except Exception as exc:  # noqa: BLE001 - a deselected or unbuildable plan: the next one
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        built.append(i)
        if len(built) == measure:
            break
    if not built:
        raise KernelError("cuDNN built none of its plans: " + " | ".join(errors[-3:]))
    return built


def new_graph(dtype: str, h: Any) -> Any:
    import cudnn

    io = getattr(cudnn.data_type, CUDNN_TYPE[dtype])
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                         compute_data_type=cudnn.data_type.FLOAT, handle=h)


def _executor(graph: Any, plan: int | None) -> Callable[[dict[int, int], int, Any], None]:
    """``run(pack, workspace, handle)`` for one built plan (None: the graph's selection), ``pack``
    uid -> device pointer. Frontends from 1.3 keep a Python graph over the C++ one, and their
    ``execute`` costs 50-150 us of host time per call (more than a small convolution takes on the
    GPU): for a plan of cuDNN's own library the C++ graph is called directly, as that ``execute``
    ends up doing; any other frontend, or a plan served otherwise, goes through ``execute``."""
    lowered = vars(graph).get("_lowered_graph") if hasattr(graph, "__dict__") else None
    if lowered is not None and hasattr(graph, "_materialize_backend_plan") and hasattr(graph, "_engine_for"):
        index = graph._plan_index if plan is None else plan
        if graph._engine_for(graph._plans[index]) is None:  # a backend plan
            cpp = graph._materialize_backend_plan(index).cpp_index
            if cpp is None:
                return lambda pack, ws, h: lowered._execute(pack, ws, h.backend_handle, None, None, None)
            return lambda pack, ws, h: lowered._execute_plan_at_index(pack, ws, cpp, h.backend_handle, None, None, None)
    if plan is None:
        return lambda pack, ws, h: graph.execute(pack, ws, handle=h)
    return lambda pack, ws, h: graph.execute_plan_at_index(pack, ws, plan, handle=h)


class Runner:
    """One built graph and what its calls need: its tensors' uids, the plan to run, the workspace,
    a lock (a built graph is run by one thread at a time; its kernels are queued on the caller's
    stream, set on the calling thread's handle)."""

    def __init__(self, graph: Any, dev: int, tensors: Sequence[Any], plans: Sequence[int | None]) -> None:
        import cupy

        self.graph, self.dev, self.lock = graph, dev, threading.Lock()
        self.tensors = tuple(tensors)
        self.uids = tuple(None if t is None else t.get_uid() for t in tensors)
        self.plans = tuple(plans)
        self.runs = [_executor(graph, p) for p in plans]
        self.run = self.runs[0]
        size = max(int(graph.get_workspace_size() if p is None else graph.get_workspace_size_plan_at_index(p))
                   for p in plans)
        with cupy.cuda.Device(dev):
            self.workspace = cupy.empty(max(size, 1), cupy.uint8)
        self.stream = cupy.cuda.get_current_stream().ptr
        self.times: list[float] = []

    def pack(self, ptrs: Sequence[int | None]) -> dict[int, int]:
        return {u: p for u, p in zip(self.uids, ptrs) if u is not None and p is not None}

    def __call__(self, ptrs: Sequence[int | None]) -> None:
        """Run on the operands at ``ptrs`` (in the order of ``tensors``; None for an absent one)."""
        import cudnn
        import cupy

        stream = cupy.cuda.get_current_stream().ptr
        ws = self.workspace
        if stream != self.stream:  # another stream: a workspace of its own (kernels may overlap)
            ws = cupy.empty(ws.size, cupy.uint8)
        pack = self.pack(ptrs)
        with self.lock:
            h = handle(self.dev)
            cudnn.set_stream(h, stream)
            self.run(pack, ws.data.ptr, h)

    def choose(self, ptrs: Sequence[int | None], repeats: int = 3) -> float:
        """Time each built plan on the operands at ``ptrs`` (scratch buffers of the problem's
        layout), keep the fastest and return its milliseconds: cuDNN's heuristic order is not its
        speed order (on the H100 its first plans for some graphs took 2x its best)."""
        import cudnn
        import cupy

        pack, h = self.pack(ptrs), handle(self.dev)
        cudnn.set_stream(h, cupy.cuda.get_current_stream().ptr)
        ws = self.workspace.data.ptr
        times = []
        for run in self.runs:
            try:
                times.append(_time_ms(lambda run=run: run(pack, ws, h), repeats))
            except Exception:  # noqa: BLE001 - a plan that fails to run is not chosen
                times.append(math.inf)
        best = min(range(len(times)), key=times.__getitem__)
        if math.isinf(times[best]):
            raise KernelError(f"cuDNN: none of the plans {self.plans} ran")
        self.run, self.times = self.runs[best], times
        return times[best]


def usable(shape: Sequence[int], strides: Sequence[int] | None, isz: int) -> tuple[int, ...] | None:
    """The element strides cuDNN is given for an operand seen in place: its own, a size-1 dim's
    made the packed value (cuDNN reads none through it), or None when a stride is negative, the
    last dim's is not 1, or one is not a multiple of :data:`ALIGN` bytes (then: a contiguous copy)."""
    if strides is None:
        return c_strides(shape)
    out = list(strides)
    packed = c_strides(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        if n == 1:
            out[i] = packed[i]
        elif s < 0 or (i == len(shape) - 1 and s != 1) or (i < len(shape) - 1 and (s * isz) % ALIGN):
            return None
    return tuple(out)


def words(a: Any) -> Any:
    """``a`` seen as unsigned integers of its itemsize: CuPy copies every dtype so (bfloat16 too)."""
    import cupy

    return a.view({2: cupy.uint16, 4: cupy.uint32, 8: cupy.uint64}[a.dtype.itemsize])


def like(a: Any, strides: Sequence[int] | None) -> Any:
    """``a`` at a 16-byte aligned address with the element ``strides`` (C order when None): itself
    when it already is, else a copy (how an offset view or an odd layout reaches cuDNN)."""
    import cupy

    want = c_strides(a.shape) if strides is None else tuple(strides)
    isz = a.dtype.itemsize
    same = all(n == 1 or s == w * isz for n, s, w in zip(a.shape, a.strides, want))
    if same and not a.data.ptr % ALIGN:
        return a
    span = 1 + sum((n - 1) * w for n, w in zip(a.shape, want))
    base = cupy.empty(span, words(a).dtype)
    out = cupy.lib.stride_tricks.as_strided(base, a.shape, tuple(w * isz for w in want))
    out[...] = words(a)
    return out.view(a.dtype)


def _time_ms(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Milliseconds per call of ``fn`` on the current stream (after one warm-up call)."""
    import cupy

    fn()
    stream = cupy.cuda.get_current_stream()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(repeats):
        fn()
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats


def _dtype(name: str) -> Any:
    return memory.bfloat16() if name == "bfloat16" else name


# -- scaled_dot_product_attention ---------------------------------------------------------------------
MAX_HEAD_DIM = 256


def supports_sdpa(problem: Problem) -> bool | Refusal:
    """cuDNN present, and a problem its fused attention expresses (see the module doc)."""
    why = cudnn_missing()
    if why:
        return Refusal(why)
    (bq, hq, _, e), (bk, hk, _, _), (bv, hv, _, ev) = problem.shapes[:3]
    b, h = problem.out_shape[:2]
    if (bq, bk, bv) != (b, b, b):
        return Refusal(f"a broadcast batch (q {bq}, k {bk}, v {bv} of {b}): cuDNN's attention takes each operand's "
                       f"batch whole")
    if hq != h or hk != hv or h % hk:
        return Refusal(f"heads q {hq}, k {hk}, v {hv} of {h}: cuDNN takes q's heads whole and k / v with one head "
                       f"count that divides them (GQA)")
    if e % 8 or ev % 8 or max(e, ev) > MAX_HEAD_DIM:
        return Refusal(f"head dims E={e}, Ev={ev}: cuDNN's fused attention takes multiples of 8 up to {MAX_HEAD_DIM}")
    if problem.dtype == "bfloat16" and memory.bfloat16() is None:
        return Refusal("CuPy cannot hold ml_dtypes.bfloat16 here")
    return True


def cost_sdpa(problem: Problem, config: Mapping[str, Any]) -> float:
    b, h, L, ev = problem.out_shape
    s, e = problem.shapes[1][-2:]
    pairs = L * s
    if problem.attrs["causal"]:
        m = min(L, s)
        pairs = m * (m + 1) // 2 + max(L - s, 0) * s
    f32, f16, bw = problem.device.provider.figures()
    flops = 2.0 * b * h * pairs * (e + ev)
    io = sum(math.prod(sh) for sh in problem.shapes[:3]) * 2 + b * h * L * ev * 2
    gpu, host = max(flops / (f16 * SDPA_EFF * min(1.0, max(e, ev) / 128) ** 0.6), io / bw), HOST_S
    if problem.attrs["mask"] is not None:  # the bias made or read, the rows' fix over mask and output
        gpu += 3.0 * math.prod(problem.shapes[3]) * 2 / bw + 2.0 * b * h * L * ev * 2 / bw + 3 * 4e-6
        host += HOST_MASK_S
    return max(gpu, host)


def prepare_sdpa(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    """Build cuDNN's attention graph for the problem once; ``launch(q, k, v, mask=None)``."""
    import cupy

    dev = problem.device.provider.index
    dtype = problem.dtype
    np_dt = _dtype(dtype)
    (b, hq, L, _), (_, _, s, _), (_, _, _, ev) = problem.shapes[:3]
    mask_kind = problem.attrs["mask"]
    mshape = problem.shapes[3] if mask_kind is not None else None
    layouts = [usable(sh, st, 2) or c_strides(sh) for sh, st in zip(problem.shapes[:3], problem.strides[:3])]
    out_shape = (b, hq, L, ev)
    # the output in q's order of heads and queries, as torch's attention does: a (B, L, H, Ev) buffer
    # when q is a view of one (heads split from a (B, L, 3*H*E) projection), so that joining the heads
    # after (y.permute(0, 2, 1, 3).reshape(B, L, H*Ev)) is a view, not a copy
    heads_inner = hq > 1 and L > 1 and layouts[0][1] < layouts[0][2]
    out_phys = (b, L, hq, ev) if heads_inner else out_shape
    out_strides = (L * hq * ev, ev, hq * ev, 1) if heads_inner else c_strides(out_shape)
    with_bias = mshape is not None and mshape[3] == s  # one column: no bias, only the rows' fix
    in_place = usable(mshape, problem.strides[3], 2) if with_bias and mask_kind == "float" else None

    def bias_form(expand: bool) -> tuple[list[int], tuple[int, ...] | None]:
        """(cuDNN's strides of the (Bm, Hm, L, S) bias, the shape of the buffer a launch fills or
        None for the caller's mask in place): one row broadcast over the queries by a zero stride,
        or (``expand``) written out L times; a filled buffer's rows 16-byte aligned."""
        bm, hm, lm, _ = mshape
        if in_place is not None and not expand:
            return [in_place[0], in_place[1], 0 if lm == 1 else in_place[2], 1], None
        rows = L if expand else lm
        s8 = -(-s // 8) * 8
        return [hm * rows * s8, rows * s8, 0 if rows == 1 else s8, 1], (bm, hm, rows, s8)

    def make(expand: bool) -> Runner:
        import cudnn

        g = new_graph(dtype, handle(dev))
        io = getattr(cudnn.data_type, CUDNN_TYPE[dtype])
        tq, tk, tv = (g.tensor(name=n, dim=list(sh), stride=list(st), data_type=io)
                      for n, sh, st in zip("qkv", problem.shapes[:3], layouts))
        kw: dict[str, Any] = {"attn_scale": float(problem.attrs["scale"])}
        if problem.attrs["causal"]:
            kw["use_causal_mask"] = True  # top-left: key j for query i when j <= i
        tb = None
        if with_bias:
            tb = g.tensor(name="bias", dim=[mshape[0], mshape[1], L, s], stride=bias_form(expand)[0], data_type=io)
            kw["bias"] = tb
        try:
            o, _ = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, generate_stats=False, **kw)
        except TypeError:  # frontends before generate_stats
            o, _ = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, is_inference=True, **kw)
        o.set_output(True).set_dim(list(out_shape)).set_stride(list(out_strides)).set_data_type(io)
        return Runner(g, dev, (tq, tk, tv, tb, o), build(g, dtype))

    errors: list[str] = []
    runner, expand = None, False
    forms = (False, True) if with_bias and mshape[2] == 1 and L > 1 else (False,)
    with cupy.cuda.Device(dev):
        for expand in forms:
            try:
                runner = make(expand)
                break
            except Exception as exc:  # noqa: BLE001 - cuDNN refuses through many types: the next form, or raise
                errors.append(f"{'bias rows written out' if expand else 'as described'}: {type(exc).__name__}: {exc}")
    if runner is None:
        raise KernelError(f"cupy.scaled_dot_product_attention.cudnn: cuDNN built no plan for {problem}: "
                          + " | ".join(errors))
    tb = runner.tensors[3]
    bias_strides, bias_buffer = bias_form(expand) if with_bias else (None, None)
    neg_bits = BITS[dtype][0]
    fix = _row_fix(problem, dtype) if mask_kind is not None else None
    getdev = cupy.cuda.runtime.getDevice
    label = "cupy.scaled_dot_product_attention.cudnn"

    def bias_of(mask: Any) -> Any:
        """The bias cuDNN reads: the caller's float mask in place, or a buffer of 16-bit words."""
        if bias_buffer is None:
            return like(mask, in_place)
        buf = memory.empty(bias_buffer, cupy.uint16, f"{label} bias")
        dst = buf[..., :s]
        src = mask if mask_kind == "bool" else words(mask)
        if src.shape != dst.shape:  # one row written out L times
            src = cupy.broadcast_to(src, dst.shape)
        if mask_kind == "bool":
            _bool_bias()(src, cupy.uint16(neg_bits), dst)
        else:
            dst[...] = src
        return buf

    # an operand whose own strides cuDNN takes (the plan's key holds them) is copied only when its
    # address is off 16 bytes; the others always are (how an odd layout reaches cuDNN)
    own = [usable(sh, st, 2) is not None for sh, st in zip(problem.shapes[:3], problem.strides[:3])]

    def launch(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(q, k, v, mask)
        if not (own[0] and own[1] and own[2]) or (q.data.ptr | k.data.ptr | v.data.ptr) % ALIGN:
            q, k, v = (like(a, st) for a, st in zip((q, k, v), layouts))
        buf = memory.empty(out_phys, np_dt, label)
        out = buf.transpose(0, 2, 1, 3) if heads_inner else buf
        bias = bias_of(mask) if tb is not None else None
        runner((q.data.ptr, k.data.ptr, v.data.ptr, None if bias is None else bias.data.ptr, buf.data.ptr))
        if fix is not None:
            fix(mask, out)
        return out

    launch.runner = runner  # type: ignore[attr-defined]  (kept alive with the launcher; tests read it)
    launch.bias_strides = bias_strides  # type: ignore[attr-defined]
    return launch


@cache
def _bool_bias() -> Any:
    """``bias = mask ? +0 : -inf`` as 16-bit words (the -inf word passed in)."""
    import cupy

    return cupy.ElementwiseKernel("bool m, uint16 ninf", "uint16 b", "b = m ? (unsigned short)0 : ninf",
                                  "opruntime_cudnn_bool_bias")


@cache
def _apply_codes() -> Any:
    """``o = c == 0 ? o : (c == 1 ? +0 : nan)`` on 16-bit words, in place."""
    import cupy

    return cupy.ElementwiseKernel("uint8 c, uint16 nan", "uint16 o",
                                  "if (c == 1) o = 0; else if (c == 2) o = nan;", "opruntime_cudnn_row_codes")


@cache
def _codes(kind: str, dtype: str) -> Any:
    """A reduction over the keys (the last axis) of a mask to one code per row: 0 the row stands,
    1 every key is masked (False / -inf: zeros), 2 a NaN or +inf reaches it (NaN); one launch."""
    import cupy

    neg, pos, _ = BITS[dtype]
    if kind == "bool":
        args, see = "bool m", "(m ? 1 : 0)"
    else:
        args, see = "uint16 w", f"((w != {neg}) ? 1 : 0) | ((((w & 0x7FFF) > {pos}) || (w == {pos})) ? 2 : 0)"
    return cupy.ReductionKernel(args, "uint8 c", see, "a | b", "c = (a & 2) ? 2 : ((a & 1) ? 0 : 1)", "0",
                                f"opruntime_cudnn_row_codes_{kind}_{dtype}", reduce_type="int")


def _row_fix(problem: Problem, dtype: str) -> Callable[[Any, Any], None]:
    """``fix(mask, out)``: each output row to the operator's answer where the mask decides it: zeros
    when every key is masked (False / -inf), NaN when a NaN or +inf reaches it; other rows stay.
    Two launches: the rows' codes from the mask, then the output rows set from them in place."""
    import cupy

    kind, nan = problem.attrs["mask"], BITS[dtype][2]

    def fix(mask: Any, out: Any) -> None:
        codes = _codes(kind, dtype)(mask if kind == "bool" else words(mask), axis=3)
        _apply_codes()(codes[..., None], cupy.uint16(nan), words(out))

    return fix


# -- conv2d ------------------------------------------------------------------------------------------
def supports_conv(problem: Problem) -> bool | Refusal:
    why = cudnn_missing()
    if why:
        return Refusal(why)
    if not int32_ok(Conv(problem), problem):
        return Refusal("an extent or an element count reaches 2**31 (cuDNN's engines crashed the context on such)")
    if problem.dtype == "float32" and not _tf32_knob():
        return Refusal("this cuDNN frontend cannot deselect TF32 engines (deselect_numeric_notes): float32 would "
                       "not be float32")
    if problem.dtype == "bfloat16" and memory.bfloat16() is None:
        return Refusal("CuPy cannot hold ml_dtypes.bfloat16 here")
    return True


def _conv_sizes(problem: Problem) -> tuple[float, float]:
    n, k, p, q = problem.out_shape
    _, cg, r, s = problem.shapes[1]
    isz = itemsize(problem.dtype)
    flops = 2.0 * n * k * p * q * cg * r * s
    io = (math.prod(problem.shapes[0]) + math.prod(problem.shapes[1]) + n * k * p * q) * isz
    return flops, io


def cost_conv(problem: Problem, config: Mapping[str, Any]) -> float:
    f32, f16, bw = problem.device.provider.figures()
    flops, io = _conv_sizes(problem)
    half = problem.dtype in HALVES
    kind = "half" if half else "float32"
    eff = CONV_EFF[kind] * min(1.0, problem.shapes[1][1] / 32) ** CONV_SMALL_C[kind]
    gpu = max(flops / ((f16 if half else f32) * eff), io / bw)
    if config["layout"] == "nhwc":  # input, weight and result each read and written once more
        gpu += 2.0 * io / (bw * TRANSPOSE_EFF) + 3 * 4e-6
    return max(gpu, HOST_S)


def conv_configs(problem: Problem) -> list[Mapping[str, Any]]:
    return sorted(CONV_CONFIGS, key=lambda c: cost_conv(problem, c))


_POINTWISE = {"relu": lambda g, t: g.relu(input=t), "gelu": lambda g, t: g.gelu(input=t),
              "gelu_tanh": lambda g, t: g.gelu_approx_tanh(input=t), "silu": lambda g, t: g.swish(input=t, swish_beta=1.0)}


def prepare_conv(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    """Build cuDNN's convolution graph (bias and activation fused when cuDNN can) once;
    ``launch(x, w, bias=None)``."""
    import cupy

    dev = problem.device.provider.index
    dtype = problem.dtype
    np_dt = _dtype(dtype)
    isz = itemsize(dtype)
    nhwc = config["layout"] == "nhwc"
    (n, c, hh, ww), (k, cg, r, s) = problem.shapes[:2]
    out_shape = problem.out_shape
    _, _, p, q = out_shape
    a = problem.attrs
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    has_bias, act = a["bias"], a["activation"]
    if nhwc:  # channels-last buffers made in the launch: dims stay NCHW / KCRS, strides say NHWC / KRSC
        x_st, w_st = (hh * ww * c, 1, ww * c, c), (r * s * cg, 1, s * cg, cg)
        y_st = (p * q * k, 1, q * k, k)
    else:
        x_st = usable(problem.shapes[0], problem.strides[0], isz) or c_strides(problem.shapes[0])
        w_st = usable(problem.shapes[1], problem.strides[1], isz) or c_strides(problem.shapes[1])
        y_st = c_strides(out_shape)

    def make(fused: bool) -> Runner:
        import cudnn

        h = handle(dev)
        g = new_graph(dtype, h)
        io = getattr(cudnn.data_type, CUDNN_TYPE[dtype])
        tx = g.tensor(name="x", dim=[n, c, hh, ww], stride=list(x_st), data_type=io)
        tw = g.tensor(name="w", dim=[k, cg, r, s], stride=list(w_st), data_type=io)
        y = g.conv_fprop(image=tx, weight=tw, pre_padding=[pt, pl], post_padding=[pb, pr], stride=[sh, sw],
                         dilation=[dh, dw], compute_data_type=cudnn.data_type.FLOAT, name="conv")
        tb = None
        if fused and has_bias:
            tb = g.tensor(name="bias", dim=[1, k, 1, 1], stride=[k, 1, 1, 1], data_type=io)
            y = g.bias(input=y, bias=tb, name="add_bias")
        if fused and act is not None:
            y = _POINTWISE[act](g, y)
        y.set_output(True).set_dim(list(out_shape)).set_stride(list(y_st)).set_data_type(io)
        return Runner(g, dev, (tx, tw, tb, y), build(g, dtype, MEASURE_PLANS))

    errors, built = [], []
    with cupy.cuda.Device(dev):
        for fused in ((True, False) if has_bias or act is not None else (False,)):
            try:
                built.append((make(fused), fused))
            except Exception as exc:  # noqa: BLE001 - cuDNN's refusals are many types; the next form, or raise
                errors.append(f"{'fused' if fused else 'convolution alone'}: {type(exc).__name__}: {exc}")
    if not built:
        raise KernelError(f"cupy.conv2d.cudnn ({config['layout']}): cuDNN built no plan for {problem}: "
                          + " | ".join(errors))
    label = "cupy.conv2d.cudnn"
    y_phys = (n, p, q, k) if nhwc else out_shape
    if nhwc:  # the layout copies (layout.cu), planned once
        from . import layout

        to_x = layout.to_channels_last(isz, dev, (n, c, hh, ww), problem.strides[0] or c_strides((n, c, hh, ww)))
        to_w = layout.to_channels_last(isz, dev, (k, cg, r, s), problem.strides[1] or c_strides((k, cg, r, s)))
        to_y = layout.to_channels_first(isz, dev, out_shape)
    passes = {}
    if not built[-1][1] and (has_bias or act is not None):  # the convolution alone: the epilogue in one pass
        from .linear import epilogue_pass

        passes[False] = epilogue_pass(problem, out_shape, p * q, k, has_bias, act, label)
    # the fastest form and plan: each built plan timed on scratch operands (the unfused form with its pass)
    with cupy.cuda.Device(dev):
        scratch = [cupy.zeros(1 + sum((d - 1) * st for d, st in zip(shape, strides)), f"u{isz}")
                   for shape, strides in (((n, c, hh, ww), x_st), ((k, cg, r, s), w_st), ((k,), (1,)),
                                          (out_shape, y_st))]
        timed = []
        for runner, fused in built:
            ptrs = [buf.data.ptr for buf in scratch]
            if runner.tensors[2] is None:
                ptrs[2] = None
            ms = runner.choose(ptrs)
            if not fused and False in passes:
                y0 = cupy.zeros(out_shape, f"u{isz}").view(np_dt)
                b0 = cupy.zeros((k,), f"u{isz}").view(np_dt) if has_bias else None
                ms += _time_ms(lambda y0=y0, b0=b0: passes[False](y0, b0))
            timed.append((ms, fused, runner))
        del scratch
    _, fused, runner = min(timed, key=lambda t: t[0])
    tb = runner.tensors[2]
    epilogue = passes.get(fused)
    getdev = cupy.cuda.runtime.getDevice

    def launch(x: Any, w: Any, b: Any = None) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x, w, b)
        if nhwc:
            xt, wt = memory.empty((n, hh, ww, c), np_dt, label), memory.empty((k, r, s, cg), np_dt, label)
            to_x(x.data.ptr, xt.data.ptr)
            to_w(w.data.ptr, wt.data.ptr)
            x, w = xt, wt
        else:
            x, w = like(x, x_st), like(w, w_st)
        y = memory.empty(y_phys, np_dt, label)
        bp = like(b, None).data.ptr if tb is not None else None
        runner((x.data.ptr, w.data.ptr, bp, y.data.ptr))
        if nhwc:
            yt = memory.empty(out_shape, np_dt, label)
            to_y(y.data.ptr, yt.data.ptr)
            y = yt
        if epilogue is not None:
            epilogue(y, b)
        return y

    launch.runner, launch.fused = runner, fused  # type: ignore[attr-defined]  (tests read them)
    return launch


# -- the table ---------------------------------------------------------------------------------------
def kernels() -> list[Kernel]:
    """cuDNN's candidates on CUDA (vendor kernels; absent with a reason when cuDNN is)."""
    return [
        Kernel("scaled_dot_product_attention", "cupy.scaled_dot_product_attention.cudnn", "cuda", HALVES,
               prepare=prepare_sdpa, supports=supports_sdpa, cost=cost_sdpa, vendor=True,
               source=SOURCE + " sdpa"),
        Kernel("conv2d", "cupy.conv2d.cudnn", "cuda", CONV_DTYPES, prepare=prepare_conv, supports=supports_conv,
               cost=cost_conv, configs=CONV_CONFIGS, config_for=conv_configs, vendor=True,
               source=SOURCE + " conv_fprop"),
    ]


def build_variants() -> list[tuple[str, dict]]:
    """Nothing to compile: cuDNN's kernels are its own (the bias pass is ``linear.py``'s build)."""
    return []
