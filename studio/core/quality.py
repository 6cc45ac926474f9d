"""One quality measure for export verification and Evaluate: the same definitions, and what they were measured on.

The same Q2_K file got top-1 44.8 % and KL 0.857 from export verification but 72.3 % and KL 0.237
from Evaluate (issue 26): verification scored every position of a short multilingual snippet, the
first ones with no context at all, while Evaluate scores the second half of each chunk, as
llama.cpp's perplexity tool does. Both now use these definitions:

* the scored rows of a chunk of ``n`` tokens are ``n // 2`` … ``n - 2`` (each predicts the next token
  with at least half a chunk of history; ``scored_positions``);
* KL divergence is KL(original ‖ variant) of the next-token distributions, in nats per token,
  averaged over the scored rows (``kl_rows``);
* "same top token" is the share of scored rows where both models' arg-max agree, in percent;
* perplexity is exp(mean negative log-likelihood of the actual next tokens) over the scored rows,
  so the verdict (``studio.core.evaluate.verdict.judge``, one rule everywhere) applies to both.

``MeasuredOn`` travels with every number and says on what it was measured (text, scored tokens,
chunks and context) and whether it was a quick check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-probabilities in float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def scored_positions(n_ctx: int) -> slice:
    """Rows of a chunk's logits that are scored: the second half, except the last row."""
    return slice(n_ctx // 2, n_ctx - 1)


def kl_rows(base_logits: np.ndarray, other_logits: np.ndarray) -> np.ndarray:
    """KL(base ‖ other) of each row's next-token distribution, in nats."""
    lp = log_softmax(base_logits)
    lq = log_softmax(other_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


def token_nll(logits_rows: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """Negative log-likelihood of each target under its row of logits."""
    lp = log_softmax(logits_rows)
    t = np.asarray(targets, dtype=np.int64)
    return -lp[np.arange(t.size), t]


def perplexity(nll: np.ndarray) -> tuple[float, float]:
    """(perplexity, its standard error) from per-token negative log-likelihoods."""
    nll = np.asarray(nll, dtype=np.float64)
    if nll.size == 0:
        return float("nan"), float("nan")
    mean = float(nll.mean())
    ppl = float(np.exp(mean))
    err = ppl * float(nll.std(ddof=1) / np.sqrt(nll.size)) if nll.size > 1 else float("nan")
    return ppl, err


@dataclass(frozen=True)
class MeasuredOn:
    """What a quality number was measured on."""

    text: str  # e.g. "sample (resources/eval/sample_en.txt)"
    tokens: int  # scored tokens
    ctx: int  # tokens per chunk
    chunks: int = 1
    quick: bool = False  # a quick check (export verification), not a full evaluation

    def describe(self) -> str:
        """``quick check: 63 tokens scored of sample (…), 1 chunk of 128 tokens``."""
        chunks = f"{self.chunks} chunk{'s' if self.chunks != 1 else ''} of {self.ctx} tokens"
        head = "quick check: " if self.quick else ""
        return f"{head}{self.tokens:,} tokens scored of {self.text}, {chunks}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """A variant against its original on the same token ids, by the definitions of this module."""

    n_scored: int
    same_top_pct: float
    kl_mean: float  # nats per token
    kl_p99: float
    ppl_original: float
    ppl_variant: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def compare_chunk(ref: np.ndarray, got: np.ndarray, ids: Sequence[int]) -> Comparison:
    """Compare the (n, vocab) logits of one chunk of ``ids`` (n tokens) on its scored rows."""
    ref = np.asarray(ref)
    got = np.asarray(got)
    n = len(ids)
    if ref.shape != got.shape or ref.shape[0] != n:
        raise ValueError(f"logits {ref.shape} and {got.shape} do not match {n} tokens")
    sl = scored_positions(n)
    if sl.stop - sl.start < 1:
        sl = slice(0, max(n - 1, 1))  # a chunk too short to halve: every row that has a next token
    r, g = ref[sl], got[sl]
    targets = [int(t) for t in ids[sl.start + 1 : sl.stop + 1]]
    kl = kl_rows(r, g)
    same = r.argmax(-1) == g.argmax(-1)
    rows = len(kl)
    ppl_o = perplexity(token_nll(r[: len(targets)], targets))[0] if targets else float("nan")
    ppl_v = perplexity(token_nll(g[: len(targets)], targets))[0] if targets else float("nan")
    return Comparison(
        n_scored=rows,
        same_top_pct=100.0 * float(same.mean()) if rows else float("nan"),
        kl_mean=float(kl.mean()) if rows else float("nan"),
        kl_p99=float(np.percentile(kl, 99)) if rows else float("nan"),
        ppl_original=ppl_o,
        ppl_variant=ppl_v,
    )
