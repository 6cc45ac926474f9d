"""The one token sampler every back end uses (numpy only, so the llama.cpp child imports it cheaply).

Both back ends pass the raw next-token logits of their model here; the same settings and seed give
the same token for the same logits, which is what makes columns comparable.
"""

from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of a 1-D logit vector, computed in float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    e = np.exp(x - m)
    return e / e.sum()


def make_rng(seed: int) -> np.random.Generator:
    """The random generator one generation draws from."""
    return np.random.Generator(np.random.PCG64(int(seed) & 0xFFFFFFFFFFFFFFFF))


def choose(
    logits: np.ndarray,
    rng: np.random.Generator | None,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[int, float]:
    """Pick the next token; returns (token id, the model's probability of it at temperature 1)."""
    # one float64 copy, worked on in place: each further vocabulary-sized temporary cost more in
    # fresh pages (~0.1 ms each for 49k logits) than the arithmetic, on every token (issue 26)
    x = np.array(logits, dtype=np.float64).reshape(-1)
    finite = np.isfinite(x)
    if not finite.all():
        # a NaN logit would make every comparison false; treat it as impossible
        x[~finite] = -np.inf
    m = x.max()
    if not np.isfinite(m):
        return 0, 0.0
    if temperature <= 0.0 or rng is None:
        tok = int(np.argmax(x))
    else:
        order = np.argsort(-x, kind="stable")
        if top_k and top_k < order.size:
            order = order[:top_k]
        scaled = x[order] / temperature
        p = np.exp(scaled - scaled.max())
        p /= p.sum()
        if top_p < 1.0:
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
            p = p[:keep] / p[:keep].sum()
            order = order[:keep]
        u = rng.random()
        i = int(np.searchsorted(np.cumsum(p), u, side="right"))
        tok = int(order[min(i, order.size - 1)])
    top = x[tok] - m
    np.subtract(x, m, out=x)
    np.exp(x, out=x)  # x is now exp(logits - max): the normaliser is its sum
    return tok, float(np.exp(top) / x.sum())
