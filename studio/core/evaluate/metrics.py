"""The arithmetic of evaluation, on plain numpy arrays: chunks, perplexity, KL divergence, top-1 agreement.

Conventions follow llama.cpp's perplexity tool: the token stream is cut into chunks of ``n_ctx``
tokens, each chunk is evaluated from an empty context (its first token replaced by BOS when the
model adds one), and only the second half is scored (positions ``n_ctx // 2`` … ``n_ctx - 2`` each
predicting the next token), so every scored token has at least half a context of history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# one set of definitions for Evaluate and export verification (issue 26)
from studio.core.quality import (  # noqa: F401 - re-exported
    kl_rows,
    log_softmax,
    perplexity,
    scored_positions,
    token_nll,
)


def chunk_starts(n_tokens: int, n_ctx: int, max_chunks: int | None = None) -> list[int]:
    """Start offsets of the whole chunks of ``n_ctx`` tokens (a partial last chunk is dropped)."""
    n = n_tokens // n_ctx if n_ctx > 0 else 0
    if max_chunks is not None:
        n = min(n, max_chunks)
    return [i * n_ctx for i in range(n)]


def chunk_tokens(tokens: Sequence[int], start: int, n_ctx: int, bos: int | None) -> list[int]:
    """The ids a chunk is evaluated on: the slice, its first id replaced by BOS when given."""
    ids = [int(t) for t in tokens[start : start + n_ctx]]
    if bos is not None and ids:
        ids[0] = int(bos)
    return ids


@dataclass(frozen=True)
class KLStats:
    """Summary of per-token KL divergences and top-token agreement."""

    n: int
    mean: float
    median: float
    p99: float
    max: float
    same_top_pct: float


def kl_stats(kl: np.ndarray, same_top: np.ndarray) -> KLStats:
    """Mean, median, 99th percentile and max of ``kl``; share of positions with the same top token."""
    kl = np.asarray(kl, dtype=np.float64)
    same = np.asarray(same_top, dtype=bool)
    if kl.size == 0:
        nan = float("nan")
        return KLStats(0, nan, nan, nan, nan, nan)
    return KLStats(
        n=int(kl.size),
        mean=float(kl.mean()),
        median=float(np.median(kl)),
        p99=float(np.percentile(kl, 99)),
        max=float(kl.max()),
        same_top_pct=100.0 * float(same.mean()),
    )
