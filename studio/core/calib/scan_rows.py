"""Quantizing a tensor's rows as the export would, and the imatrix-weighted error it leaves: the
scan's candidates (``SensitivityScan``) and the proxy's error samples."""

from __future__ import annotations

from typing import Any

import numpy as np

from studio.core.calib.runner import LinearSite


def rows_of(w: Any, site: LinearSite | None) -> Any:
    """The weight as GGUF rows (float32 numpy, rows × n_per_row)."""
    x = w.detach().float().cpu()
    if site is not None and site.kind == "conv1d":
        x = x.T
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]).numpy())


def from_rows(rows: np.ndarray, like: Any, site: LinearSite | None) -> Any:
    import torch

    t = torch.from_numpy(rows)
    if site is not None and site.kind == "conv1d":
        return t.reshape(like.shape[1], like.shape[0]).T.contiguous()
    return t.reshape(like.shape)


def quantize_rows(rows: np.ndarray, qtype: str, qw: np.ndarray | None) -> np.ndarray:
    """``rows`` quantized to ``qtype`` (with the importance ``qw`` per column) and decoded again."""
    from studio.core.quant.blocks import dequantize, quantize

    q = quantize(rows, qtype, qw if qtype != "Q8_0" else None)
    return dequantize(q, qtype, rows.shape)


def weighted_error(rows: np.ndarray, deq: np.ndarray, qw: np.ndarray | None) -> float:
    """``Σ_j qw_j Σ_i (rows − deq)²_ij`` (unweighted without ``qw``)."""
    d = (rows.astype(np.float64) - deq) ** 2
    col = d.sum(0)
    if qw is None:
        return float(col.sum())
    return float((col * np.asarray(qw, dtype=np.float64)).sum())
