"""Quantizing a tensor's rows as the export would, and the imatrix-weighted error it leaves: the
scan's candidates (``SensitivityScan``) and the proxy's error samples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from studio.core.calib.runner import LinearSite


def rows_of(w: Any, site: LinearSite | None) -> Any:
    """The weight as GGUF rows (float32 numpy, rows × n_per_row)."""
    x = w.detach().float().cpu()
    if site is not None and site.kind == "conv1d":
        x = x.T
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]).numpy())


class NarrowRows:
    """A weight held narrower than float32 (bfloat16, float16) read as ``rows_of`` would give it: each
    block of rows indexed is made in float32 on the CPU, so the float32 whole is never held."""

    def __init__(self, w: Any) -> None:
        self._w = w.detach().reshape(-1, w.shape[-1])
        self.shape = (int(self._w.shape[0]), int(self._w.shape[1]))
        self.dtype = np.dtype(np.float32)

    def __getitem__(self, key: Any) -> np.ndarray:
        import torch

        if isinstance(key, np.ndarray):
            key = torch.from_numpy(key).to(self._w.device)
        return np.ascontiguousarray(self._w[key].float().cpu().numpy())


def from_rows(rows: np.ndarray, like: Any, site: LinearSite | None) -> Any:
    import torch

    t = torch.from_numpy(rows)
    if site is not None and site.kind == "conv1d":
        return t.reshape(like.shape[1], like.shape[0]).T.contiguous()
    return t.reshape(like.shape)


# values per block of rows: the float64 temporaries stay 128 MB (a whole 128k-row head's were 4.2 GB)
_BLOCK_VALUES = 1 << 24


def _blocks(rows: np.ndarray) -> list[slice]:
    """The blocks of rows measured at once."""
    per = max(1, _BLOCK_VALUES // max(1, rows.shape[1]))
    return [slice(a, a + per) for a in range(0, rows.shape[0], per)]


def quantized_blocks(
    rows: np.ndarray, qtype: str, qw: np.ndarray | None
) -> Iterator[tuple[slice, np.ndarray]]:
    """``rows`` quantized to ``qtype`` (with the importance ``qw`` per column) and decoded again, one block of
    rows at a time: (the block's rows, its decoded values). llama.cpp rounds every row on its own, so the
    blocks hold the values of one call over all rows."""
    from studio.core.quant.blocks import dequantize, quantize

    for b in _blocks(rows):
        part = rows[b]
        yield b, dequantize(quantize(part, qtype, qw if qtype != "Q8_0" else None), qtype, part.shape)


def quantize_rows(rows: np.ndarray, qtype: str, qw: np.ndarray | None) -> np.ndarray:
    """``rows`` quantized to ``qtype`` and decoded again (``quantized_blocks`` gathered)."""
    out = np.empty(rows.shape, dtype=np.float32)
    for b, deq in quantized_blocks(rows, qtype, qw):
        out[b] = deq
    return out


class ErrorSum:
    """``Σ_i (rows − deq)²_ij`` per column in float64, added a block of rows at a time: the float64
    differences of a whole output head were 4.2 GB at Llama 3's 128,256 × 4096."""

    def __init__(self) -> None:
        self.col: np.ndarray | None = None

    def add(self, part: np.ndarray, deq: np.ndarray) -> None:
        """Add one block's squared differences."""
        col = self.col
        d = np.empty((part.shape[0] + (col is not None), part.shape[1]), dtype=np.float64)
        # the running sum as the block's first row: numpy sums axis 0 row after row, so the columns are
        # summed in the order of one whole-matrix sum (the same float64 bits)
        if col is not None:
            d[0] = col
        x = d[col is not None :]
        x[:] = part
        x -= deq
        x *= x
        self.col = d.sum(0)

    def total(self, qw: np.ndarray | None) -> float:
        """The sum, each column weighted by ``qw`` (unweighted without it)."""
        if self.col is None:
            return 0.0
        if qw is None:
            return float(self.col.sum())
        return float((self.col * np.asarray(qw, dtype=np.float64)).sum())


def weighted_error(rows: np.ndarray, deq: np.ndarray, qw: np.ndarray | None) -> float:
    """``Σ_j qw_j Σ_i (rows − deq)²_ij`` (unweighted without ``qw``), summed a block of rows at a time."""
    acc = ErrorSum()
    for b in _blocks(rows):
        acc.add(rows[b], deq[b])
    return acc.total(qw)
