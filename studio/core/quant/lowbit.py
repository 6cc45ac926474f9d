"""The scalar low-bit types (TQ1_0, TQ2_0, MXFP4, Q1_0, Q2_0), byte-identical to llama.cpp.

Each kernel follows ggml's reference quantizer (``quantize_row_*_ref`` in ggml-quants.c) operation by
operation in float32; none of them reads an importance matrix (ggml ignores it for these types). What
C leaves to the hardware is reproduced too: ``lroundf``/``(int)`` of an infinite or NaN product (a block
whose scale's reciprocal overflows) give x86's "integer indefinite" value, and MXFP4's ``(uint8_t)`` of
a negative exponent wraps.
"""

from __future__ import annotations

import math

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jit import njit
from studio.core.quant.numba_ops import JIT, float_of, fp16_value, put_half
from studio.core.quant.types import QK_K, QTYPES

LOWBIT_TYPES: tuple[str, ...] = ("TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "Q2_0")
# (weights, bytes) per block, from the type registry (Q2_0's through its NEWER_THAN_GGUF_PY)
GEOMETRY: dict[str, tuple[int, int]] = {
    q: (QTYPES[q].block_size, QTYPES[q].type_size) for q in LOWBIT_TYPES if q in QTYPES
}

_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # kvalues_mxfp4
_TWO31 = np.float32(2147483648.0)


@njit(inline="always", **JIT)
def _roundf(v):
    """C's ``roundf`` for |v| < 2^31: half away from zero (|v| - floor|v| is exact in float32)."""
    a = abs(v)
    t = np.float32(math.floor(a))
    r = t + np.float32(1.0) if a - t >= np.float32(0.5) else t
    return -r if v < 0 else r


@njit(inline="always", **JIT)
def _lround_low32(v):
    """C's ``(int) lroundf(v)`` on x86-64: half away from zero; inf/NaN give LONG_MIN, whose low 32 bits are 0."""
    if not (abs(v) < _TWO31):
        return np.int64(0)
    r = _roundf(v)
    return np.int64(r)


@njit(inline="always", **JIT)
def _int_trunc(v):
    """C's ``(int) v`` of a float32 on x86-64 (cvttss2si): truncation; out of range, inf and NaN give INT_MIN."""
    if not (abs(v) < _TWO31):
        return np.int64(-2147483648)
    return np.int64(v)


@njit(**JIT)
def _block_absmax(x, r, o, n):
    amax = np.float32(0.0)
    for j in range(n):
        a = abs(x[r, o + j])
        amax = amax if amax >= a else a
    return amax


@njit(**JIT)
def _tq1_rows(x, out):
    rows, n = x.shape
    nb = n // QK_K
    for r in range(rows):
        for ib in range(nb):
            o = ib * QK_K
            ob = ib * 54
            d = _block_absmax(x, r, o, QK_K)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            put_half(out[r], ob + 52, d)
            # 5 values per byte along 32 bytes, then 16 bytes, then 4 values per byte (qh)
            xo = o
            for m in range(32):
                q = 0
                for k in range(5):
                    q = (q * 3 + _lround_low32(x[r, xo + m + 32 * k] * idv) + 1) & 0xFF
                out[r, ob + m] = ((q * 256 + 242) // 243) & 0xFF
            xo += 160
            for m in range(16):
                q = 0
                for k in range(5):
                    q = (q * 3 + _lround_low32(x[r, xo + m + 16 * k] * idv) + 1) & 0xFF
                out[r, ob + 32 + m] = ((q * 256 + 242) // 243) & 0xFF
            xo += 80
            for j in range(4):
                q = 0
                for k in range(4):
                    q = (q * 3 + _lround_low32(x[r, xo + j + 4 * k] * idv) + 1) & 0xFF
                q = (q * 3) & 0xFF
                out[r, ob + 48 + j] = ((q * 256 + 242) // 243) & 0xFF


@njit(**JIT)
def _tq2_rows(x, out):
    rows, n = x.shape
    nb = n // QK_K
    for r in range(rows):
        for ib in range(nb):
            o = ib * QK_K
            ob = ib * 66
            d = _block_absmax(x, r, o, QK_K)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            put_half(out[r], ob + 64, d)
            for j in range(2):
                for m in range(32):
                    q = 0
                    for k in range(4):
                        xi = _lround_low32(x[r, o + 128 * j + m + 32 * k] * idv) + 1
                        q += (xi & 3) << (2 * k)
                    out[r, ob + 32 * j + m] = q & 0xFF


@njit(**JIT)
def _mxfp4_rows(x, vals, out):
    rows, n = x.shape
    nb = n // 32
    for r in range(rows):
        for ib in range(nb):
            o = ib * 32
            ob = ib * 17
            amax = np.float32(0.0)
            for j in range(32):
                a = abs(x[r, o + j])
                if amax < a:
                    amax = a
            if amax > 0:
                # floorf(log2f(amax)) - 2 + 127, then C's (uint8_t) of that float (wraps when negative)
                lg = np.float32(math.floor(np.float32(math.log2(np.float64(amax)))))
                e = (_int_trunc(lg - np.float32(2.0) + np.float32(127.0))) & 0xFF
            else:
                e = 0
            d = _e8m0_half(e)
            out[r, ob] = e
            for j in range(16):
                lo = _best_mxfp4(x[r, o + j], d, vals)
                hi = _best_mxfp4(x[r, o + 16 + j], d, vals)
                out[r, ob + 1 + j] = lo | (hi << 4)


@njit(inline="always", **JIT)
def _e8m0_half(e):
    """ggml_e8m0_to_fp32_half: 2^(e-128) as float32 bits."""
    bits = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
    return float_of(np.int32(bits))


@njit(inline="always", **JIT)
def _best_mxfp4(v, d, vals):
    best = 0
    best_err = abs(np.float32(vals[0]) * d - v)
    for i in range(1, 16):
        err = abs(np.float32(vals[i]) * d - v)
        if err < best_err:
            best = i
            best_err = err
    return best


@njit(**JIT)
def _q1_rows(x, out):
    rows, n = x.shape
    nb = n // 128
    for r in range(rows):
        for ib in range(nb):
            o = ib * 128
            ob = ib * 18
            s = np.float32(0.0)
            for j in range(128):
                s += abs(x[r, o + j])
            put_half(out[r], ob, s / np.float32(128.0))
            for k in range(16):
                b = 0
                for j in range(8):
                    if x[r, o + 8 * k + j] >= 0:
                        b |= 1 << j
                out[r, ob + 2 + k] = b


@njit(**JIT)
def _q2_rows(x, out):
    rows, n = x.shape
    nb = n // 64
    for r in range(rows):
        for ib in range(nb):
            o = ib * 64
            ob = ib * 18
            amax = np.float32(0.0)
            for j in range(64):
                a = abs(x[r, o + j])
                if a > amax:
                    amax = a
            idv = np.float32(1.0) / amax if amax > 0 else np.float32(0.0)
            put_half(out[r], ob, amax)
            for k in range(16):
                b = 0
                for j in range(4):
                    v = x[r, o + 4 * k + j] * idv
                    q = _int_trunc(_roundf(v) if abs(v) < _TWO31 else v) + 1
                    q = max(0, min(3, q))
                    b |= q << (2 * j)
                out[r, ob + 2 + k] = b


# ------------------------------------------------------------------------------ dequantize


@njit(**JIT)
def _half_at(data, r, o):
    return fp16_value(np.int64(data[r, o]) | (np.int64(data[r, o + 1]) << 8))


@njit(**JIT)
def _dequant(data, kind, n, vals, y):
    rows = data.shape[0]
    for r in range(rows):
        if kind == 0:  # TQ1_0
            pow3 = (1, 3, 9, 27, 81, 243)
            for ib in range(n // QK_K):
                ob = ib * 54
                d = _half_at(data, r, ob + 52)
                yo = ib * QK_K
                for k in range(5):
                    for m in range(32):
                        q = (np.int64(data[r, ob + m]) * pow3[k]) & 0xFF
                        y[r, yo + 32 * k + m] = np.float32(((q * 3) >> 8) - 1) * d
                for k in range(5):
                    for m in range(16):
                        q = (np.int64(data[r, ob + 32 + m]) * pow3[k]) & 0xFF
                        y[r, yo + 160 + 16 * k + m] = np.float32(((q * 3) >> 8) - 1) * d
                for k in range(4):
                    for j in range(4):
                        q = (np.int64(data[r, ob + 48 + j]) * pow3[k]) & 0xFF
                        y[r, yo + 240 + 4 * k + j] = np.float32(((q * 3) >> 8) - 1) * d
        elif kind == 1:  # TQ2_0
            for ib in range(n // QK_K):
                ob = ib * 66
                d = _half_at(data, r, ob + 64)
                for j in range(2):
                    for k in range(4):
                        for m in range(32):
                            q = (data[r, ob + 32 * j + m] >> (2 * k)) & 3
                            y[r, ib * QK_K + 128 * j + 32 * k + m] = np.float32(np.int64(q) - 1) * d
        elif kind == 2:  # MXFP4
            for ib in range(n // 32):
                ob = ib * 17
                d = _e8m0_half(np.int64(data[r, ob]))
                for j in range(16):
                    q = data[r, ob + 1 + j]
                    y[r, 32 * ib + j] = np.float32(vals[q & 0xF]) * d
                    y[r, 32 * ib + 16 + j] = np.float32(vals[q >> 4]) * d
        elif kind == 3:  # Q1_0
            for ib in range(n // 128):
                ob = ib * 18
                d = _half_at(data, r, ob)
                for j in range(128):
                    bit = (data[r, ob + 2 + j // 8] >> (j % 8)) & 1
                    y[r, 128 * ib + j] = d if bit else -d
        else:  # Q2_0
            for ib in range(n // 64):
                ob = ib * 18
                d = _half_at(data, r, ob)
                for j in range(64):
                    q = (data[r, ob + 2 + j // 4] >> (2 * (j % 4))) & 3
                    y[r, 64 * ib + j] = np.float32(np.int64(q) - 1) * d


# ------------------------------------------------------------------------------ public API


def _check(qtype: str, n: int) -> None:
    if qtype not in LOWBIT_TYPES:
        raise QuantizationError(f"{qtype} is not one of {', '.join(LOWBIT_TYPES)}.")
    bs = GEOMETRY[qtype][0]
    if n % bs or n <= 0:
        raise QuantizationError(f"{qtype} needs rows whose length is a multiple of {bs}, got rows of {n}.")


def row_bytes(qtype: str, n_per_row: int) -> int:
    """Bytes of one row of ``n_per_row`` weights."""
    bs, size = GEOMETRY[qtype]
    return n_per_row // bs * size


def quantize_rows(
    x: np.ndarray, qtype: str, imatrix: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Quantize float32 rows (rows, n_per_row) as ggml_quantize_chunk does; the imatrix is unused, as in ggml."""
    del imatrix  # ggml's quantizers of these types ignore it
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise QuantizationError(f"{qtype} quantization expects 2-D rows, got shape {x.shape}.")
    rows, n = x.shape
    _check(qtype, n)
    shape = (rows, row_bytes(qtype, n))
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    elif out.dtype != np.uint8 or out.shape != shape or not out.flags.c_contiguous:
        raise QuantizationError(f"The output buffer for {qtype} must be C-contiguous uint8 of shape {shape}.")
    if rows == 0:
        return out
    if qtype == "TQ1_0":
        _tq1_rows(x, out)
    elif qtype == "TQ2_0":
        _tq2_rows(x, out)
    elif qtype == "MXFP4":
        _mxfp4_rows(x, _MXFP4_VALUES, out)
    elif qtype == "Q1_0":
        _q1_rows(x, out)
    else:
        _q2_rows(x, out)
    return out


def dequantize_rows(data: np.ndarray, qtype: str, n_per_row: int) -> np.ndarray:
    """Decode rows (rows, row bytes) of one of these types back to float32 (rows, n_per_row)."""
    _check(qtype, n_per_row)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != row_bytes(qtype, n_per_row):
        raise QuantizationError(
            f"{qtype} data of shape {data.shape} does not hold rows of {n_per_row} weights "
            f"({row_bytes(qtype, n_per_row)} bytes each)."
        )
    y = np.empty((data.shape[0], n_per_row), dtype=np.float32)
    if data.shape[0]:
        _dequant(data, LOWBIT_TYPES.index(qtype), n_per_row, _MXFP4_VALUES, y)
    return y
