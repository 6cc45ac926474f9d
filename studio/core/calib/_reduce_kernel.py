"""Compiled per-channel reductions of calibration activations on the CPU (numba): one pass over the rows.

torch would take five passes (abs, square, two sums, a max) plus three for the histogram keys and a
bincount, each a parallel region; on a CPU these cost more than the layer's own matrix products.
Here every row is read once while it sits in L1: a vectorisable loop for the sums, then one for the
histogram keys (the top 12 bits of the float32 pattern of |x|, as ``accumulators`` bins them).
The sums stay float64 in row order: float32 block sums were faster but moved the imatrix by ~1e-7,
enough to flip a borderline quantization choice downstream (test_sensitivity's proxy test).
"""

from __future__ import annotations

import numpy as np

from studio.core.jit import njit

N_KEYS = 2048  # top 12 bits of a float32 with the sign cleared: 8 exponent + 3 mantissa bits
_LANE_FLUSH = 1 << 31  # elements counted into the uint32 lanes between flushes: no count can overflow


@njit(nogil=True, cache=True, error_model="numpy")
def reduce_rows(
    x: np.ndarray,
    bits: np.ndarray,
    sum_sq: np.ndarray,
    sum_abs: np.ndarray,
    absmax: np.ndarray,
    keys: np.ndarray,
    histogram: bool,
) -> bool:
    """Add Σx², Σ|x| (float64) and max |x| (float32) per column of ``x`` (rows × cols, float32) into the
    arrays, and the count of each |x| key into ``keys`` (``bits`` is ``x`` viewed as uint32).

    Returns whether every ``sum_sq`` is finite afterwards: NaN and Inf reach it; the float64 sums of
    float32 squares cannot overflow.
    """
    rows, cols = x.shape
    # four rows of counts: neighbours rarely wait on one bin; uint32 halves their cache footprint
    lanes = np.zeros((4, N_KEYS), np.uint32)
    per_flush = max(1, _LANE_FLUSH // max(cols, 1))  # rows
    for r in range(rows):
        for c in range(cols):
            v = x[r, c]
            a = abs(v)
            d = np.float64(v)
            sum_sq[c] += d * d
            sum_abs[c] += np.float64(a)
            absmax[c] = a if a > absmax[c] else absmax[c]  # a select, so the loop vectorises
        if histogram:
            for c in range(cols):
                lanes[c & 3, (bits[r, c] >> 20) & 0x7FF] += 1
            if (r + 1) % per_flush == 0 or r == rows - 1:
                for k in range(N_KEYS):
                    keys[k] += (
                        np.int64(lanes[0, k])
                        + np.int64(lanes[1, k])
                        + np.int64(lanes[2, k])
                        + np.int64(lanes[3, k])
                    )
                lanes[:] = 0
    for c in range(cols):
        if not np.isfinite(sum_sq[c]):
            return False
    return True


# reassociation only (no nnan/ninf): the per-token sum of squares vectorises, NaN and Inf still propagate
@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "contract"})
def hidden_rows(h: np.ndarray, absmax: np.ndarray) -> tuple[float, float, float]:
    """For hidden states ``h`` (tokens × hidden, float32): (Σ token L2 norms, max norm, Σ h²), and max
    |h| per channel into ``absmax``."""
    rows, cols = h.shape
    sum_norm = 0.0
    max_norm = 0.0
    total = 0.0
    for r in range(rows):
        s = 0.0
        for c in range(cols):
            v = h[r, c]
            d = np.float64(v)
            s += d * d
            a = abs(v)
            absmax[c] = a if a > absmax[c] else absmax[c]
        n = np.sqrt(s)
        sum_norm += n
        if n > max_norm:
            max_norm = n
        total += s
    return sum_norm, max_norm, total


def prepare_kernels() -> None:
    """Compile (or load from numba's cache) both kernels for the array types ``accumulators`` passes."""
    x = np.zeros((2, 8), np.float32)
    cols = x.shape[1]
    reduce_rows(
        x, x.view(np.uint32), np.zeros(cols), np.zeros(cols), np.zeros(cols, np.float32),
        np.zeros(N_KEYS, np.int64), True,
    )  # fmt: skip
    hidden_rows(x, np.zeros(cols, np.float32))


__all__ = ["N_KEYS", "hidden_rows", "prepare_kernels", "reduce_rows"]
