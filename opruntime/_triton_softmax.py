"""A plain Triton softmax, one row per program: a benchmark peer only (needs torch and triton)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_row(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


def make(x_host: np.ndarray, device_index: int) -> Any:
    x = torch.from_numpy(np.ascontiguousarray(x_host)).to(f"cuda:{device_index}")
    out = torch.empty_like(x)
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)
    return (lambda: _softmax_row[(rows,)](out, x, cols, BLOCK=block, num_warps=warps)), torch.cuda.synchronize
