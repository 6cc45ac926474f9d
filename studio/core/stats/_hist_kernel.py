"""Compiled histogram kernel (numba): one pass, exact against numpy's float64 bin edges."""

from __future__ import annotations

import numpy as np

from studio.core.jit import njit


@njit(nogil=True, cache=True, error_model="numpy")
def histogram_into(x: np.ndarray, lo: float, scale: float, edges: np.ndarray, counts: np.ndarray) -> None:
    """Add the bin counts of finite ``x`` over ``edges`` (uniform from ``lo``, ``scale`` bins per unit) to ``counts``.

    Each value's bin is guessed from (x - lo) * scale and then checked against the real edges, so the
    result equals ``np.histogram(x, bins=edges)`` (left-closed bins, the last one closed); values
    outside the edges are counted in the end bins. Four interleaved count rows avoid the store-to-load
    stall of consecutive values landing in the same bin.
    """
    nb = counts.size
    lanes = np.zeros((4, nb), np.int64)
    for k in range(x.size):
        v = np.float64(x[k])
        f = (v - lo) * scale
        i = int(f) if f > 0.0 else 0
        if i >= nb:
            i = nb - 1
        if i > 0 and v < edges[i]:
            i -= 1
        elif i < nb - 1 and v >= edges[i + 1]:
            i += 1
        lanes[k & 3, i] += 1
    for j in range(nb):
        counts[j] += lanes[0, j] + lanes[1, j] + lanes[2, j] + lanes[3, j]
