"""Quantization preview of one tensor: quantize, dequantize, and measure what was lost.

A scheme is what a preview applies: a qtype (``"Q4_K"``, ``"Q8_0"``, ...), through
``studio.core.quant.blocks``, byte-identical to llama.cpp, on the tensor as llama.cpp stores it
(rows = output channels); or a generic INT/FP8 scheme, through ``studio.core.quant.generic``
(named like ``"INT4 sym g128"`` or ``"FP8 E4M3 channel"``). Error numbers come from
``studio.core.quant.metrics``.

With an importance matrix (mean x² per input column, ``studio.core.calib.imatrix``) the block types
are quantized with it as llama-quantize does (Q8_0 and the generic schemes ignore it), and the result
also gives the activation-weighted MSE: each column's squared error weighted by its importance, which
is what the layer's output sees (E[(ΔW x)²] under independent inputs), not what the weights see.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.gguf.layout import layout
from studio.core.jobs import JobContext, null_context
from studio.core.quant import generic
from studio.core.quant.metrics import ErrorMetrics, error_metrics
from studio.core.quant.types import QTYPES, fallback_type, row_bytes
from studio.core.stats.tensor_stats import (
    DEFAULT_BINS,
    Histogram,
    as_matrix_shape,
    bin_edges,
    histogram,
    is_transposed,
)

__all__ = [
    "ChannelError",
    "PreviewResult",
    "block_schemes",
    "generic_schemes",
    "imatrix_entry",
    "preview_array",
    "preview_schemes",
    "preview_tensor",
]

_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class ChannelError:
    """The quantization error of one output channel."""

    index: int
    mse: float
    snr_db: float  # of this channel alone
    absmax: float  # of the original channel


@dataclass(frozen=True, eq=False)
class PreviewResult:
    """What quantizing one tensor with one scheme does to it."""

    name: str
    scheme: str  # as asked
    applied: str  # what was used after llama.cpp's fallback for rows the type cannot take
    fallback_reason: str | None
    shape: tuple[int, int]  # rows (output channels) × columns, as quantized
    bits_per_weight: float
    metrics: ErrorMetrics
    original_hist: Histogram  # original and dequantized share the edges so they overlay
    dequantized_hist: Histogram
    error_hist: Histogram  # of dequantized - original
    worst_channels: tuple[ChannelError, ...]
    imatrix_used: bool = False  # the quantizer was given the importance matrix
    weighted_mse: float | None = None  # activation-weighted MSE, when an importance matrix was given

    @property
    def snr_db(self) -> float:
        """Signal-to-noise ratio of the whole tensor in dB."""
        return self.metrics.snr_db

    @property
    def cosine(self) -> float:
        """Cosine similarity of original and dequantized."""
        return self.metrics.cosine


def block_schemes() -> list[str]:
    """The qtypes the preview can apply (all but F32), in the registry's menu order."""
    return [q for q in QTYPES if q != "F32"]


_GENERIC = (
    "INT8 sym channel",
    "INT8 sym tensor",
    "INT4 sym channel",
    "INT4 sym g128",
    "INT4 asym g128",
    "INT3 asym g128",
    "INT2 asym g64",
    "FP8 E4M3 tensor",
    "FP8 E4M3 channel",
    "FP8 E5M2 tensor",
)
_GENERIC_RE = re.compile(
    r"^(?:INT([2348]) (sym|asym)|FP8 (E4M3|E5M2)) (tensor|channel|g(\d+))$", re.IGNORECASE
)


def generic_schemes() -> list[str]:
    """Names of the generic INT/FP8 schemes offered (any ``INTb sym|asym tensor|channel|gN`` or
    ``FP8 E4M3|E5M2 tensor|channel|gN`` is accepted)."""
    return list(_GENERIC)


def preview_schemes() -> list[str]:
    """Every scheme a preview accepts: qtypes, then generic schemes."""
    return block_schemes() + generic_schemes()


def _row_weights(imatrix: np.ndarray | None, rows: int, cols: int, name: str) -> np.ndarray | None:
    """The importance matrix as (groups, cols): one row of weights for all rows, or one per expert."""
    if imatrix is None:
        return None
    w = np.ascontiguousarray(np.asarray(imatrix, dtype=np.float32).reshape(-1))
    groups = w.size // cols if cols and w.size % cols == 0 else 0
    if groups < 1 or rows % groups:
        raise QuantizationError(
            f"The importance matrix of {name or 'the tensor'} has {w.size} values; its {rows} rows of "
            f"{cols} need {cols} (or {cols} per expert)."
        )
    if not np.isfinite(w).all() or (w < 0).any():
        raise QuantizationError(
            f"The importance matrix of {name or 'the tensor'} holds negative or NaN values."
        )
    return w.reshape(groups, cols)


def _roundtrip_block(
    x: np.ndarray, qtype: str, weights: np.ndarray | None, ctx: JobContext
) -> tuple[np.ndarray, float]:
    from studio.core.quant.blocks import dequantize, quantize

    rows, cols = x.shape
    y = np.empty_like(x)
    per_group = max(1, rows // (1 if weights is None else weights.shape[0]))  # experts' rows are contiguous
    step = max(1, min(per_group, _CHUNK_ELEMENTS // max(cols, 1)))
    for g0 in range(0, rows, per_group):
        qw = None if weights is None else weights[g0 // per_group]
        for r0 in range(g0, g0 + per_group, step):
            ctx.check_cancelled()
            r1 = min(g0 + per_group, r0 + step)
            q = quantize(x[r0:r1], qtype, qw)
            y[r0:r1] = dequantize(q, qtype, (r1 - r0, cols))
            ctx.report(r1, rows, f"quantizing to {qtype}")
    return y, row_bytes(qtype, cols) * 8.0 / cols


def _weighted_mse(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> float:
    """Mean over rows of Σ_j w_j (y−x)²_j / Σ_j w_j (the plain MSE when every w_j is equal)."""
    rows, cols = x.shape
    per_group = max(1, rows // weights.shape[0])
    total = 0.0
    step = max(1, min(per_group, _CHUNK_ELEMENTS // max(cols, 1)))
    for g0 in range(0, rows, per_group):
        w = weights[g0 // per_group].astype(np.float64)
        norm = float(w.sum()) or 1.0
        for r0 in range(g0, g0 + per_group, step):
            r1 = min(g0 + per_group, r0 + step)
            e = (y[r0:r1] - x[r0:r1]).astype(np.float64)
            total += float(((e * e) @ w).sum()) / norm
    return total / rows if rows else 0.0


def _roundtrip_generic(x: np.ndarray, scheme: str, ctx: JobContext) -> tuple[np.ndarray, float]:
    m = _GENERIC_RE.match(scheme.strip())
    if m is None:
        raise QuantizationError(
            f"The quantization scheme {scheme!r} is unknown.",
            hint="Choose a GGUF block type such as Q4_K, or a scheme such as 'INT4 sym g128'.",
        )
    bits, sym, fp8, gran, group = m.groups()
    granularity = "group" if group else gran.lower()
    group_size = int(group) if group else None
    ctx.report(0, 1, f"quantizing to {scheme}")
    if fp8:
        out = generic.quantize_fp8(x, fp8.lower(), granularity=granularity, group_size=group_size)
    else:
        out = generic.quantize_int(
            x, int(bits), symmetric=sym.lower() == "sym", granularity=granularity, group_size=group_size
        )
    ctx.report(1, 1, f"quantizing to {scheme}")
    return np.asarray(out.dequantized, dtype=np.float32).reshape(x.shape), float(out.bits_per_weight)


def _error_hist(x: np.ndarray, y: np.ndarray, bins: int) -> Histogram:
    rows, cols = x.shape
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    lo, hi = math.inf, -math.inf
    for r0 in range(0, rows, step):
        e = y[r0 : r0 + step] - x[r0 : r0 + step]
        lo, hi = min(lo, float(e.min())), max(hi, float(e.max()))
    counts = np.zeros(bins, np.int64)
    for r0 in range(0, rows, step):
        counts += histogram(y[r0 : r0 + step] - x[r0 : r0 + step], bins, lo, hi)
    return Histogram(bin_edges(bins, lo, hi), counts)


def preview_array(
    x: np.ndarray,
    scheme: str,
    *,
    name: str = "",
    bins: int = DEFAULT_BINS,
    worst: int = 10,
    imatrix: Any = None,
    ctx: JobContext | None = None,
) -> PreviewResult:
    """Quantize ``x`` (rows = output channels) with ``scheme`` and describe the error.

    ``imatrix``: the importance of each column (``cols`` values, or ``cols`` per expert when the rows
    are experts' stacked matrices); see the module docstring.
    """
    ctx = ctx or null_context()
    arr = np.asarray(x, dtype=np.float32)
    rows, cols = as_matrix_shape(arr.shape)
    x2 = np.ascontiguousarray(arr.reshape(rows, cols))
    if not np.isfinite(x2).all():
        bad = int((~np.isfinite(x2)).sum())
        raise QuantizationError(
            f"Tensor {name or '?'} holds {bad} NaN or infinite value(s), so it cannot be quantized.",
            hint="Fix or exclude the tensor before quantizing.",
        )

    weights = _row_weights(imatrix, rows, cols, name)
    upper = scheme.upper()
    reason = None
    if upper in QTYPES:
        applied = fallback_type(upper, cols).qtype
        if applied != upper:
            reason = (
                f"rows of {cols} values are not a multiple of the {QTYPES[upper].block_size}-value "
                f"{upper} block, so llama.cpp uses {applied}"
            )
        y, bpw = _roundtrip_block(x2, applied, weights, ctx)
    else:
        applied = scheme
        y, bpw = _roundtrip_generic(x2, scheme, ctx)
    ctx.check_cancelled()
    metrics = error_metrics(x2, y)
    lo = min(float(x2.min()), float(y.min()))
    hi = max(float(x2.max()), float(y.max()))
    edges = bin_edges(bins, lo, hi)
    orig = Histogram(edges, histogram(x2, bins, lo, hi))
    deq = Histogram(edges.copy(), histogram(y, bins, lo, hi))
    err = _error_hist(x2, y, bins)
    ctx.check_cancelled()
    power = np.einsum("ij,ij->i", x2.astype(np.float64), x2.astype(np.float64)) / cols
    order = np.argsort(metrics.per_channel_mse)[::-1][: max(0, worst)]
    absmax = np.abs(x2).max(axis=1)
    channels = tuple(
        ChannelError(
            index=int(i),
            mse=float(metrics.per_channel_mse[i]),
            snr_db=_snr(float(power[i]), float(metrics.per_channel_mse[i])),
            absmax=float(absmax[i]),
        )
        for i in order
    )
    return PreviewResult(
        name=name,
        scheme=scheme,
        applied=applied,
        fallback_reason=reason,
        shape=(rows, cols),
        bits_per_weight=bpw,
        metrics=metrics,
        original_hist=orig,
        dequantized_hist=deq,
        error_hist=err,
        worst_channels=channels,
        imatrix_used=weights is not None and upper in QTYPES,
        weighted_mse=None if weights is None else _weighted_mse(x2, y, weights),
    )


def imatrix_entry(imatrix: Mapping[str, Any], info: Any, name: str) -> np.ndarray:
    """The importance values of tensor ``name`` (HF name) in ``imatrix``, keyed by GGUF or HF names."""
    if name in imatrix:
        return np.asarray(imatrix[name], dtype=np.float32)

    tm = layout(info).by_hf().get(name)
    if tm is None or tm.gguf_name not in imatrix:
        raise QuantizationError(
            f"The importance matrix has no entry for {name}.",
            hint="llama-imatrix collects the matrices inside the blocks (blk.*), not the embeddings or output.",
        )
    return np.asarray(imatrix[tm.gguf_name], dtype=np.float32)


def _snr(power: float, mse: float) -> float:
    if mse == 0:
        return math.inf
    if power == 0:
        return -math.inf
    return 10.0 * math.log10(power / mse)


def preview_tensor(
    checkpoint: Any,
    name: str,
    scheme: str,
    *,
    bins: int = DEFAULT_BINS,
    worst: int = 10,
    imatrix: Any = None,
    ctx: JobContext | None = None,
) -> PreviewResult:
    """Preview ``scheme`` on tensor ``name`` of an opened checkpoint, laid out as llama.cpp quantizes it.

    ``imatrix``: an ``Imatrix`` (or any mapping of GGUF or HF names to values; the tensor's entry is
    used, QuantizationError when it has none) or the tensor's own values.
    """
    ctx = ctx or null_context()
    if isinstance(imatrix, Mapping):
        imatrix = imatrix_entry(imatrix, checkpoint.info, name)
    x = checkpoint.read(name)
    rows, cols = as_matrix_shape(x.shape)
    x = x.reshape(rows, cols)
    if is_transposed(checkpoint, name):
        # GPT-2 Conv1D stores [in, out]; GGUF rows are output channels.
        x = np.ascontiguousarray(x.T)
    return preview_array(x, scheme, name=name, bins=bins, worst=worst, imatrix=imatrix, ctx=ctx)
