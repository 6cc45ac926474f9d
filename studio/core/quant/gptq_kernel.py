"""The column sweep of GPTQ for CPU tensors, compiled: ``gptq._columns_torch`` without the per-op cost.

Rows of a GPTQ sweep are independent (each row's errors only move that row's later columns), so the
kernel walks row by row: for each column of the range, the nearest grid value under the fixed group
scale, the error divided by the factor's diagonal, and the update of the row's later columns in the
batch. Same float32 arithmetic as the torch loop; ``nogil`` lets a caller run row ranges at once.
"""

from __future__ import annotations

import numpy as np

from studio.core.jit import njit
from studio.core.quant.numba_ops import JIT

__all__ = ["sweep_columns"]


@njit(**JIT)
def sweep_columns(
    W1, E1, Hi1, lo, hi, cols, group, scale, offset, has_off, levels, base, uniform, mids, codes, r0, r1
):
    """Quantize columns [lo, hi) of the batch ``W1`` (rows × B) for rows [r0, r1); see the module docstring."""
    B = W1.shape[1]
    top = levels.shape[0] - 1
    nm = mids.shape[0]
    for r in range(r0, r1):
        for i in range(lo, hi):
            col = cols[i]
            g = col // group
            s = scale[r, g]
            o = offset[r, g] if has_off else np.float32(0.0)
            w = W1[r, i]
            t = np.float32(0.0)
            if s != 0:
                t = (w - o) / s if has_off else w / s
            k = 0
            if uniform:
                k = int(np.rint(t)) - base
                k = 0 if k < 0 else (top if k > top else k)
            else:
                while k < nm and t > mids[k]:
                    k += 1
            q = s * levels[k] + o if has_off else s * levels[k]
            codes[r, col] = k
            err = (w - q) / Hi1[i, i]
            E1[r, i] = err
            for j in range(i + 1, B):
                W1[r, j] -= err * Hi1[i, j]
