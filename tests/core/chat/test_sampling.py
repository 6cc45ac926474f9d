"""The shared sampler: greedy is arg-max, seeded sampling is reproducible and follows the distribution."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.chat.sampling import choose, make_rng, softmax
from studio.core.chat.types import ChatError, Sampling


def test_greedy_is_argmax_with_the_model_probability():
    logits = np.array([0.5, 3.0, -1.0, 2.9], dtype=np.float32)
    tok, p = choose(logits, None)
    assert tok == 1
    assert p == pytest.approx(float(softmax(logits)[1]), rel=1e-12)


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    runs = []
    for _ in range(2):
        rng = make_rng(7)
        runs.append([choose(logits, rng, temperature=1.0)[0] for _ in range(4000)])
    assert runs[0] == runs[1]
    freq = np.bincount(runs[0], minlength=4) / 4000
    assert np.allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.03)
    # another seed is another sequence (one generator for all draws, as a generation uses it)
    rng8 = make_rng(8)
    other = [choose(logits, rng8, temperature=1.0)[0] for _ in range(50)]
    assert other != runs[0][:50] and len(set(other)) > 1


def test_temperature_top_k_and_top_p_cut_the_tail():
    logits = np.log(np.array([0.05, 0.15, 0.3, 0.5]))
    rng = make_rng(0)
    assert {choose(logits, rng, temperature=1.0, top_k=1)[0] for _ in range(50)} == {3}
    assert {choose(logits, rng, temperature=1.0, top_p=0.4)[0] for _ in range(50)} == {3}
    assert {choose(logits, rng, temperature=1.0, top_k=2)[0] for _ in range(200)} == {2, 3}
    # the reported probability is the model's (temperature 1), not the sharpened one
    tok, p = choose(logits, rng, temperature=0.1, top_k=1)
    assert tok == 3 and p == pytest.approx(0.5)


def test_nan_logits_are_never_chosen():
    logits = np.array([np.nan, 1.0, np.inf * 0, 0.5])
    assert choose(logits, None)[0] == 1
    assert {choose(logits, make_rng(1), temperature=1.0)[0] for _ in range(100)} <= {1, 3}


@pytest.mark.parametrize("kw", [{"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_k": -2}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ChatError):
        Sampling(**kw)
