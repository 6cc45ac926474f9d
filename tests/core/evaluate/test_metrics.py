"""The evaluation arithmetic on hand-made logits: llama.cpp's chunking, perplexity, KL, top-1 agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.core.evaluate.metrics import (
    chunk_starts,
    chunk_tokens,
    kl_rows,
    kl_stats,
    log_softmax,
    perplexity,
    scored_positions,
    token_nll,
)


def test_chunks_follow_llamacpp():
    assert chunk_starts(1000, 256) == [0, 256, 512]  # the partial last chunk is dropped
    assert chunk_starts(1000, 256, max_chunks=2) == [0, 256]
    assert chunk_starts(100, 256) == []
    sl = scored_positions(512)
    assert (sl.start, sl.stop) == (256, 511)  # rows 256..510 predict tokens 257..511
    assert chunk_tokens([5, 6, 7, 8, 9, 10], 3, 3, bos=1) == [1, 9, 10]
    assert chunk_tokens([5, 6, 7, 8, 9, 10], 3, 3, bos=None) == [8, 9, 10]


def test_perplexity_of_known_distributions():
    # every scored row gives the target probability 1/4: perplexity 4
    logits = np.log(np.array([[0.25, 0.25, 0.25, 0.25]] * 10))
    nll = token_nll(logits, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    assert np.allclose(nll, math.log(4))
    ppl, err = perplexity(nll)
    assert ppl == pytest.approx(4.0) and err == pytest.approx(0.0, abs=1e-12)
    nll2 = token_nll(np.log(np.array([[0.5, 0.5], [0.9, 0.1]])), [0, 1])
    assert perplexity(nll2)[0] == pytest.approx(math.exp((math.log(2) + math.log(10)) / 2))


def test_kl_divergence_matches_its_definition():
    p = np.array([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]])
    q = np.array([[0.6, 0.3, 0.1], [0.25, 0.25, 0.5]])
    kl = kl_rows(np.log(p) + 3.0, np.log(q) - 1.0)  # logits are defined up to a constant
    want = (p * np.log(p / q)).sum(-1)
    assert np.allclose(kl, want, atol=1e-12)
    assert kl[1] == pytest.approx(0.0, abs=1e-15)
    assert np.allclose(np.exp(log_softmax(np.log(p))), p)


def test_kl_stats():
    kl = np.linspace(0.0, 1.0, 101)
    same = np.array([True] * 90 + [False] * 11)
    st = kl_stats(kl, same)
    assert st.n == 101 and st.mean == pytest.approx(0.5) and st.median == pytest.approx(0.5)
    assert st.p99 == pytest.approx(0.99) and st.max == 1.0
    assert st.same_top_pct == pytest.approx(100 * 90 / 101)
    assert math.isnan(kl_stats(np.array([]), np.array([])).mean)
