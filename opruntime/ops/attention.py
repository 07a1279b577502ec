"""scaled_dot_product_attention, as ``torch.nn.functional.scaled_dot_product_attention`` (inference).

``softmax(q @ k.T * scale + mask) @ v`` over the last two dims:

* ``q`` is (..., L, E), ``k`` is (..., S, E), ``v`` is (..., S, Ev); the result is (..., L, Ev).
  The leading dims broadcast as NumPy's do (the dim before L is the heads' dim, H).
* ``attn_mask`` is None, a boolean mask (True: the key takes part) or an additive float mask,
  broadcastable to (..., L, S). ``is_causal`` masks key j for query i when j > i (top-left aligned,
  as torch: with L > S the last rows see every key). A mask and ``is_causal`` together are an error.
* ``scale`` is None (``1 / sqrt(E)``; 1 for E = 0) or a finite float.
* ``enable_gqa``: q's heads may be a multiple of k's and v's (grouped-query attention): query head h
  reads key / value head ``h // (Hq // Hk)``, as torch's ``repeat_interleave``.
* A row whose every key is masked gives zeros, as torch (its softmax is taken as 0, not NaN);
  S = 0 gives zeros too. A NaN in the mask gives a NaN row.

Kernels see every operand as 4-D, (B_x, H_x, rows, cols): ``q`` (Bq, Hq, L, E), ``k`` (Bk, Hk, S, E),
``v`` (Bv, Hv, S, Ev), the mask (Bm, Hm, Lm, Sm), the output (B, H, L, Ev). Each operand's batch
size is 1 or B and its head count divides H (1, H, or a GQA group count), its mask rows are 1 or L
and its mask columns 1 or S: output (b, h, i) reads ``q[b % Bq, h // (H // Hq), i]``,
``k[b % Bk, h // (H // Hk)]`` (likewise v), and ``mask[b % Bm, h // (H // Hm), i % Lm, j % Sm]``.
``attrs``: ``scale`` (a float), ``causal`` (bool), ``mask`` (None, ``"bool"`` or ``"float"``). A
boolean mask keeps its dtype (``problem.dtypes[3] == "bool"``); a float mask is cast to the
computation dtype, which q, k and v alone decide (an fp32 mask with fp16 q gives fp16, as torch).
A kernel may give the output in q's order of heads and queries, as torch does: (B, L, H, Ev) memory
seen as (B, H, L, Ev) when q is a view of a (B, L, H, E) buffer (heads split from a projection), so
that joining the heads after is a view (the result's strides say so; cuDNN's candidate does this).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AttributeValueError, ShapeError, UnknownAttributeError
from ..kernels import Attrs, Problem, itemsize
from ..tensor import Tensor
from ..typing import ArrayLike, DeviceLike
from .base import Case, Normalized, Operator

MASK = 3  # the mask's operand index


def _at(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...] | None = None, mask: Any = None,
        views: tuple[str | None, ...] = (), dtype: str = "float32", **attrs: Any) -> Case:
    """A case: ``mask`` is None, ``("bool", shape)`` or ``("float", shape)``."""
    v = v if v is not None else k
    shapes: tuple[tuple[int, ...], ...] = (q, k, v)
    bools: tuple[int, ...] = ()
    if mask is not None:
        shapes += (mask[1],)
        bools = (MASK,) if mask[0] == "bool" else ()
    return Case(shapes, attrs, dtype, views, bools=bools)


#: 2-D to 5-D, odd lengths, L < S, L > S (causal rows past the last key), size-1 dims, head dims
#: from 1 to 256 and E != Ev, boolean and additive masks broadcast every way, GQA, broadcast batch
#: and heads, an explicit scale, tiles of 64 and 128 past their end, transposed and strided views
CASES = [
    _at((7, 5), (9, 5), (9, 3)),
    _at((2, 3, 7, 16), (2, 3, 11, 16), is_causal=True),
    _at((1, 2, 13, 8), (1, 2, 5, 8), is_causal=True),
    _at((3, 2, 8), (3, 9, 8), (3, 9, 4), is_causal=True),
    _at((2, 2, 7, 32), (2, 2, 11, 32), mask=("bool", (7, 11))),
    _at((2, 4, 7, 16), (2, 4, 11, 16), mask=("float", (2, 1, 1, 11))),
    _at((2, 8, 9, 32), (2, 2, 12, 32), (2, 2, 12, 24), enable_gqa=True, is_causal=True),
    _at((2, 4, 5, 8), (1, 4, 6, 8), (2, 1, 6, 8)),
    _at((1, 3, 67, 64), (1, 3, 67, 64), scale=0.3, is_causal=True),
    _at((2, 1, 130, 128), (2, 1, 133, 128), mask=("bool", (2, 1, 130, 133))),
    _at((1, 2, 33, 96), (1, 2, 70, 96), (1, 2, 70, 40), mask=("float", (33, 1))),
    _at((1, 1, 1), (1, 1, 1)),
    _at((3, 1, 24), (3, 1, 24), is_causal=True),
    _at((2, 3, 1, 16), (2, 3, 37, 16), is_causal=True),  # one query (decoding): causal sees key 0 only
    _at((2, 3, 1, 16), (2, 3, 37, 16), (2, 3, 37, 24)),  # one query against every key
    _at((2, 2, 3, 2, 8), (2, 2, 3, 5, 8), mask=("bool", (2, 2, 1, 2, 5))),
    _at((1, 1, 20, 256), (1, 1, 19, 256), (1, 1, 19, 200), is_causal=True),
    _at((2, 12, 16), (2, 20, 16), views=("T", "T", "T")),
    _at((2, 9, 16), (2, 11, 16), (2, 11, 8), views=("slice", "slice", "slice"), is_causal=True),
    _at((1, 4, 17, 64), (1, 2, 80, 64), mask=("float", (17, 80)), views=(None, None, None, "T"), enable_gqa=True),
]
EMPTY = [
    _at((0, 5), (3, 5)), _at((4, 5), (0, 5), (0, 3)), _at((2, 0, 3, 8), (2, 0, 4, 8)),
    _at((3, 4), (5, 4), (5, 0)), _at((3, 0), (5, 0), (5, 2)), _at((2, 3, 0), (2, 4, 0), is_causal=True),
]
#: the issue's grid on the GPU: tokens B * S = 16384 and width H * E = 2048 throughout
GPU_GRID = [_at((16384 // s, 2048 // e, s, e), (16384 // s, 2048 // e, s, e), dtype=d, is_causal=c)
            for d in ("float16", "bfloat16") for c in (True, False) for e in (64, 128) for s in (1024, 4096, 16384)]


def _numpy_peer(np: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False) -> Any:
    """The composite a user writes with NumPy (CuPy on CUDA): an L x S buffer, softmax, matmul."""
    if enable_gqa or (attn_mask is not None and attn_mask.dtype == bool):
        return NotImplemented
    s = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if attn_mask is not None:
        s = s + attn_mask
    if is_causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf, s.dtype), 1)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def _torch_peer(torch: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False) -> Any:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                            scale=scale, enable_gqa=enable_gqa)


def _jax_peer(jax: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False) -> Any:
    """``jax.nn.dot_product_attention`` (XLA; cuDNN on GPU). It takes (B, T, N, H): the swaps
    to and from that layout count in its time."""
    if q.ndim != 4 or k.shape[:2] != q.shape[:2] and not enable_gqa or v.shape[-1] != q.shape[-1] \
            or attn_mask is not None and attn_mask.ndim != 4:
        return NotImplemented
    mask = attn_mask if attn_mask is None or attn_mask.dtype == bool else None
    bias = attn_mask if attn_mask is not None and attn_mask.dtype != bool else None
    out = jax.nn.dot_product_attention(q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2), bias=bias, mask=mask,
                                       scale=scale, is_causal=is_causal)
    return out.swapaxes(1, 2)


def _batch(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    """``shape`` left-padded with ones to ``n`` dims."""
    return (1,) * (n - len(shape)) + tuple(shape)


class Attention(Operator):
    name = "scaled_dot_product_attention"
    operands = ("q", "k", "v", "attn_mask")
    masks = ("attn_mask",)
    required = 3
    bound = "compute"
    cases = CASES
    quick = (1, 4, 6, 9)
    empty = EMPTY
    bench = {
        "cpu": [_at((1, 4, 512, 64), (1, 4, 512, 64), is_causal=True)],
        "overhead": [_at((1, 1, 8, 16), (1, 1, 8, 16))],
        "gpu": [_at((4, 16, 4096, 128), (4, 16, 4096, 128), dtype="float16", is_causal=True),
                _at((4, 16, 4096, 128), (4, 16, 4096, 128), dtype="float16"),
                _at((4, 16, 4096, 128), (4, 16, 4096, 128), dtype="bfloat16", is_causal=True),
                _at((4, 16, 2048, 128), (4, 16, 2048, 128), is_causal=True)],
        "attention": GPU_GRID,
    }
    peers = {"numpy": _numpy_peer, "torch": _torch_peer, "jax": _jax_peer}

    # -- validation ---------------------------------------------------------------------------
    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        op = "scaled_dot_product_attention"
        mask_kind = attrs.pop("_mask", None)
        causal = attrs.pop("is_causal", False)
        scale = attrs.pop("scale", None)
        gqa = attrs.pop("enable_gqa", False)
        if attrs:
            raise UnknownAttributeError(f"{op}() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                        f"it takes {', '.join(self.attributes)}")
        for name, value in (("is_causal", causal), ("enable_gqa", gqa)):
            if not isinstance(value, (bool, np.bool_)):
                raise AttributeValueError(f"{op}: {name} must be a bool, got {value!r}")
        if scale is not None:
            ok = isinstance(scale, (int, float, np.integer, np.floating)) and not isinstance(scale, bool)
            if not ok or not math.isfinite(float(scale)):
                raise AttributeValueError(f"{op}: scale must be None (1/sqrt(E)) or a finite number, got {scale!r}")
        sq, sk, sv = (tuple(s) for s in shapes[:3])
        sm = tuple(shapes[MASK]) if len(shapes) > MASK else None
        for name, s in (("q", sq), ("k", sk), ("v", sv)):
            if len(s) < 2:
                raise ShapeError(f"{op}: {name} must be at least 2-D {'(..., L, E)' if name == 'q' else '(..., S, E)'}, "
                                 f"got shape {s}")
        (L, E), (S, Ek), (Sv, Ev) = sq[-2:], sk[-2:], sv[-2:]
        if Ek != E:
            raise ShapeError(f"{op}: q {sq} and k {sk} must have the same last dim (the embedding E); got {E} and {Ek}")
        if Sv != S:
            raise ShapeError(f"{op}: k {sk} and v {sv} must have the same number of keys (dim -2); got {S} and {Sv}")
        if causal and sm is not None:
            raise AttributeValueError(f"{op}: give attn_mask or is_causal=True, not both (as torch); fold the causal "
                                      f"mask into attn_mask")
        n = max(len(sq), len(sk), len(sv), len(sm) if sm is not None else 0)
        # the heads (dim -3) and the batch dims before them, each operand padded to n - 2 dims
        lead = {name: _batch(s[:-2], n - 2) for name, s in (("q", sq), ("k", sk), ("v", sv))}
        if sm is not None:
            if len(sm) < 2:
                sm = _batch(sm, 2)
            lead["attn_mask"] = _batch(sm[:-2], n - 2)
        heads = {name: (s[-1] if s else 1) for name, s in lead.items()}
        if gqa:
            hk, hv, hq = heads["k"], heads["v"], heads["q"]
            if hk != hv:
                raise ShapeError(f"{op}: with enable_gqa, k {sk} and v {sv} must have the same number of heads (dim -3); "
                                 f"got {hk} and {hv}")
            if hk == 0 or hq % hk:
                raise ShapeError(f"{op}: with enable_gqa, q's heads (dim -3 of {sq}: {hq}) must be a multiple of "
                                 f"k's and v's ({hk})")
            H = hq
        else:
            H = _broadcast(op, {k: (h,) for k, h in heads.items() if k != "attn_mask"}, "heads (dim -3)",
                           gqa_hint=True)[0]
        if "attn_mask" in heads and heads["attn_mask"] not in (1, H):
            raise ShapeError(f"{op}: attn_mask {sm} does not broadcast to the {H} heads (dim -3); it must have 1 or {H}")
        batch = _broadcast(op, {k: s[:-1] for k, s in lead.items()}, "batch dims (before the heads)")
        B = math.prod(batch)
        fours = {}
        for name, s in lead.items():
            b = s[:-1] if s else ()
            if b == batch:
                nb = B
            elif math.prod(b) == 1:
                nb = 1
            else:
                raise ShapeError(f"{op}: {name}'s batch dims {b} broadcast to {batch} only partly (some dims 1, some "
                                 f"not); kernels take each operand's batch whole or as one: repeat {name} to {batch} first")
            fours[name] = (nb, s[-1] if s else 1)
        shapes_n = [(*fours["q"], L, E), (*fours["k"], S, E), (*fours["v"], S, Ev)]
        if sm is not None:
            lm, smm = sm[-2:]
            if lm not in (1, L) or smm not in (1, S):
                raise ShapeError(f"{op}: attn_mask {sm} does not broadcast to (..., L, S) = (..., {L}, {S})")
            shapes_n.append((*fours["attn_mask"], lm, smm))
            if mask_kind is None:
                mask_kind = "float"
        scale_v = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else float(scale)
        out = (B, H, L, Ev)
        result = (*batch, *((H,) if n > 2 else ()), L, Ev)
        trivial = "empty" if math.prod(out) == 0 else ("zeros" if S == 0 else ("features" if E == 0 else None))
        attrs_n = Attrs(scale=scale_v, causal=bool(causal), mask=mask_kind if sm is not None else None)
        return Normalized(tuple(shapes_n), attrs_n, out, result, trivial)

    # -- dtypes: q, k and v decide; a boolean mask stays boolean -------------------------------
    def normalize_for(self, shapes: Sequence[tuple[int, ...]], dtypes: tuple[str, ...],
                      attrs: dict[str, Any]) -> Normalized:
        """The kernels see the mask's kind (``attrs["mask"]``): boolean or additive."""
        kind = ("bool" if dtypes[MASK] == "bool" else "float") if len(dtypes) > MASK else None
        return self.normalize(shapes, {**attrs, "_mask": kind})

    def problem_for(self, device: Any, shapes: Sequence[Sequence[int]], dtype: str, **attrs: Any) -> Problem:
        """As :meth:`Operator.problem_for`; ``_mask="bool"`` makes a fourth operand a boolean mask."""
        mask = attrs.get("_mask")
        if len(shapes) > MASK and mask is None:
            attrs["_mask"] = "float"
        problem = super().problem_for(device, shapes, dtype, **attrs)
        if mask == "bool":
            from dataclasses import replace

            problem = replace(problem, dtypes=(dtype,) * MASK + ("bool",))
        return problem

    def call(self, inputs: tuple[Any, ...], device: Any, attrs: tuple[tuple[str, Any, Any], ...]) -> Tensor:
        inputs, attrs = self.adapt(inputs, attrs)
        return super().call(inputs, device, attrs)

    def adapt(self, inputs: tuple[Any, ...], attrs: tuple[tuple[str, Any, Any], ...]) -> tuple[tuple[Any, ...], tuple]:
        """A mask given as (nested) Python bools stays boolean (host data of Python bools is
        otherwise float32, which would make it an additive mask of zeros and ones)."""
        if len(inputs) > MASK and isinstance(inputs[MASK], (list, tuple)):
            inputs = (*inputs[:MASK], np.asarray(inputs[MASK]))
        return inputs, attrs

    # -- the float64 reference -------------------------------------------------------------
    def reference(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, attn_mask: np.ndarray | None = None,
                  is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> np.ndarray:
        q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
        if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
            k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
            v = np.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
        E, L, S = q.shape[-1], q.shape[-2], k.shape[-2]
        scale = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else float(scale)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
            if attn_mask is not None:
                m = np.asarray(attn_mask)
                s = np.where(m, s, -np.inf) if m.dtype == bool else s + m.astype(np.float64)
            if is_causal:
                s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
            if S == 0:  # no keys: zeros (as torch), in the broadcast shape
                return np.matmul(np.zeros(s.shape), v)
            mx = s.max(axis=-1, keepdims=True)
            dead = np.isneginf(mx)  # every key masked: the row gives zeros, as torch
            e = np.exp(s - np.where(dead, 0.0, mx))
            p = e / np.where(dead, 1.0, e.sum(axis=-1, keepdims=True))
            return np.matmul(p, v)

    # -- costs ---------------------------------------------------------------------------------
    def flops(self, problem: Problem) -> float:
        """``2 L S (E + Ev)`` per head, halved-ish for causal: the keys each row sees."""
        B, H, L, Ev = problem.out_shape
        S, E = problem.shapes[1][-2:]
        pairs = L * S
        if problem.attrs["causal"]:  # row i sees min(i + 1, S) keys
            m = min(L, S)
            pairs = m * (m + 1) // 2 + max(L - S, 0) * S
        return 2.0 * B * H * pairs * (E + Ev)

    def bytes(self, problem: Problem) -> float:
        n = sum(math.prod(s) * (1 if d == "bool" else itemsize(problem.dtype))
                for s, d in zip(problem.shapes, problem.dtypes))
        return float(n + math.prod(problem.out_shape) * itemsize(problem.dtype))

    def trivial_result(self, problem: Problem, result_shape: tuple[int, ...], trivial: str, datas: Sequence[Any],
                       provider: Any) -> Any:
        """E = 0: every score is 0 (an empty dot product), so each row is the mean of the values
        its mask lets in: computed on the host (a degenerate problem)."""
        if trivial != "features":
            return super().trivial_result(problem, result_shape, trivial, datas, provider)
        B, H = problem.out_shape[:2]
        views = []
        for d, shape in zip(datas, problem.shapes):  # the 4-D views, batch and heads expanded
            h = provider.to_host(d).reshape(shape)
            h = h if h.dtype == np.bool_ else h.astype(np.float64)
            views.append(np.repeat(np.repeat(h, B // shape[0], axis=0), H // shape[1], axis=1))
        mask = views[MASK] if len(views) > MASK else None
        ref = self.reference(*views[:MASK], mask, problem.attrs["causal"], problem.attrs["scale"])
        return provider.from_host(np.ascontiguousarray(ref.reshape(result_shape).astype(datas[0].dtype)))


def _broadcast(op: str, shapes: dict[str, tuple[int, ...]], what: str, gqa_hint: bool = False) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:
        hint = "; for grouped-query attention (q's heads a multiple of k's) pass enable_gqa=True" if gqa_hint else ""
        raise ShapeError(f"{op}: the {what} of " + ", ".join(f"{k} {v}" for k, v in shapes.items())
                         + f" do not broadcast{hint}") from None


ATTENTION = Attention()


@ATTENTION.function
def scaled_dot_product_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, attn_mask: ArrayLike | None = None,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *,
                                 device: DeviceLike = None) -> Tensor:
    """``softmax(q @ k.T * scale + attn_mask) @ v``, as ``torch.nn.functional.scaled_dot_product_attention``
    (inference: no dropout), in one fused kernel where the device has one: no L x S buffer.

    Args:
        q: (..., L, E) queries: a Tensor, a native device array or host data.
        k: (..., S, E) keys.
        v: (..., S, Ev) values.
        attn_mask: None, a boolean mask (True: the key takes part) or an additive float mask,
            broadcastable to (..., L, S).
        is_causal: mask key j for query i when j > i (top-left aligned, as torch).
        scale: the factor on ``q @ k.T``; None is ``1 / sqrt(E)``.
        enable_gqa: let q's heads (dim -3) be a multiple of k's and v's (grouped-query attention).
        device: run here.

    Returns:
        A Tensor (..., L, Ev) in q, k and v's promoted dtype. A row whose every key is masked is
            zeros (as torch).

    Raises:
        ShapeError: operands under 2-D, E or S that differ, leading dims that do not broadcast, a
            mask that does not broadcast to (..., L, S).
        AttributeValueError: a mask together with is_causal, a scale that is not finite.
        DtypeError: integer q, k, v or mask.
        DeviceMismatchError: operands on different devices.
    """
