"""Error metrics between a reference tensor and its quantized reconstruction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError

__all__ = ["ErrorMetrics", "error_metrics", "real_numpy"]

# Rows per accumulation step: bounds the float64 temporaries for large weights.
_CHUNK_ELEMS = 1 << 20


@dataclass(frozen=True, eq=False)
class ErrorMetrics:
    """How far ``approx`` is from ``ref``: MSE, SNR (dB), cosine similarity, max |error|, MSE per output channel."""

    mse: float
    snr_db: float
    cosine: float
    max_abs_error: float
    per_channel_mse: np.ndarray
    count: int


def real_numpy(x: Any, refusal: str) -> np.ndarray:
    """``x`` (numpy or torch, any device) as a numpy array of real numbers; otherwise a
    ``QuantizationError`` with ``refusal`` (``{dtype}`` is replaced by the tensor's dtype)."""
    if type(x).__module__.startswith("torch"):
        if x.is_complex():
            raise QuantizationError(refusal.format(dtype=x.dtype))
        x = x.detach().to("cpu").float().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":  # complex would silently lose its imaginary part
        raise QuantizationError(refusal.format(dtype=a.dtype))
    return a


def _as_numpy(a: Any) -> np.ndarray:
    return real_numpy(a, "Error metrics need real numbers, not a tensor of dtype {dtype}.")


def error_metrics(ref: Any, approx: Any) -> ErrorMetrics:
    """Compare two tensors of the same shape (numpy or torch); the first axis is the output channel.

    Sums are accumulated in float64 over row chunks. An exact match gives SNR = inf and cosine = 1;
    an all-zero reference with a non-zero error gives SNR = -inf.
    """
    a = _as_numpy(ref)
    b = _as_numpy(approx)
    if a.shape != b.shape:
        raise QuantizationError(f"Cannot compare tensors of shapes {a.shape} and {b.shape}; they must match.")
    n = int(a.size)
    if n == 0:
        return ErrorMetrics(0.0, float("inf"), 1.0, 0.0, np.zeros(a.shape[:1] if a.ndim else (0,)), 0)
    a2 = a.reshape(a.shape[0], -1) if a.ndim >= 1 else a.reshape(1, 1)
    b2 = b.reshape(a2.shape)
    rows, cols = a2.shape
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    per_row = np.empty(rows, dtype=np.float64)
    s_err = s_ref = s_app = s_dot = 0.0
    max_err = 0.0
    for r0 in range(0, rows, step):
        x = a2[r0 : r0 + step].astype(np.float64)
        y = b2[r0 : r0 + step].astype(np.float64)
        e = y - x
        e2 = np.einsum("ij,ij->i", e, e)
        per_row[r0 : r0 + step] = e2 / cols
        s_err += float(e2.sum())
        s_ref += float(np.einsum("ij,ij->", x, x))
        s_app += float(np.einsum("ij,ij->", y, y))
        s_dot += float(np.einsum("ij,ij->", x, y))
        max_err = max(max_err, float(np.abs(e).max()))
    if not np.isfinite(s_err):
        raise QuantizationError("The tensors contain NaN or infinite values; error metrics are undefined.")
    if s_err == 0.0:
        snr = float("inf")
    elif s_ref == 0.0:
        snr = float("-inf")
    else:
        snr = 10.0 * float(np.log10(s_ref / s_err))
    if s_ref == 0.0 and s_app == 0.0:
        cos = 1.0
    elif s_ref == 0.0 or s_app == 0.0:
        cos = 0.0
    else:
        cos = float(np.clip(s_dot / np.sqrt(s_ref * s_app), -1.0, 1.0))
    return ErrorMetrics(s_err / n, snr, cos, max_err, per_row, n)
