"""One quality measure (issue 26): export verification and Evaluate share their definitions, their
verdict rule, and say what each number was measured on."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core import quality
from studio.core.evaluate import metrics
from studio.core.evaluate.verdict import judge
from studio.core.evaluate.verification import judgement, verification_dict, verification_line
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of


def test_evaluate_uses_the_very_same_functions():
    for name in ("kl_rows", "log_softmax", "perplexity", "scored_positions", "token_nll"):
        assert getattr(metrics, name) is getattr(quality, name)


def test_only_the_second_half_of_a_chunk_is_scored():
    rng = np.random.default_rng(0)
    n, vocab = 16, 11
    ref = rng.normal(size=(n, vocab))
    got = ref.copy()
    got[: n // 2] = rng.normal(size=(n // 2, vocab))  # differences before the scored rows do not count
    ids = list(rng.integers(0, vocab, size=n))
    c = quality.compare_chunk(ref, got, ids)
    assert c.n_scored == n // 2 - 1 and c.kl_mean == pytest.approx(0.0, abs=1e-12)
    assert c.same_top_pct == 100.0 and c.ppl_original == pytest.approx(c.ppl_variant)
    got[n - 2] += 5 * np.eye(vocab)[0]  # a scored row changes
    c2 = quality.compare_chunk(ref, got, ids)
    want = float(quality.kl_rows(ref[n // 2 : n - 1], got[n // 2 : n - 1]).mean())
    assert c2.kl_mean == pytest.approx(want) and c2.kl_mean > 0


def test_measured_on_says_what_and_marks_a_quick_check():
    on = quality.MeasuredOn("sample (resources/eval/sample_en.txt)", 63, 128, 1, quick=True)
    assert (
        on.describe()
        == "quick check: 63 tokens scored of sample (resources/eval/sample_en.txt), 1 chunk of 128 tokens"
    )
    assert not quality.MeasuredOn("x", 3000, 512, 6).describe().startswith("quick")


def test_verification_and_evaluate_agree_on_the_same_chunk(chat_model, gguf_of, tmp_path):
    # the same text, the same 64 tokens as one chunk: the verification's numbers are Evaluate's,
    # and its verdict is Evaluate's verdict
    from studio.core.evaluate import evaluate
    from studio.core.export.verify import default_text, verify_gguf

    q = gguf_of(chat_model, "Q4_0")
    v = verify_gguf(q, chat_model, max_tokens=64)
    assert v.measured_on.quick and v.measured_on.ctx == 64 and v.measured_on.tokens == 31
    assert "sample" in v.measured_on.text
    text = tmp_path / "same.txt"
    text.write_text(default_text(), encoding="utf-8")
    rep = evaluate(chat_model, [q], text=text, n_ctx=64, max_chunks=1, device="cpu")
    (var,) = rep.variants
    c = v.comparison
    assert rep.original.n_scored == c.n_scored == 31
    assert c.kl_mean == pytest.approx(var.kld_mean, rel=1e-3, abs=1e-6)
    assert c.same_top_pct == pytest.approx(var.same_top_pct)
    assert c.ppl_original == pytest.approx(rep.original.ppl, rel=1e-4)
    assert c.ppl_variant == pytest.approx(var.ppl, rel=1e-4)
    assert judgement(v).verdict == judge(rep.original.ppl, var.ppl).verdict
    assert rep.to_dict()["measured_on"] == {
        "text": rep.text_name,
        "tokens": 31,
        "ctx": 64,
        "chunks": 1,
        "quick": False,
    }
    line = verification_line(v)
    assert "quick check: 31 tokens scored of sample" in line and judgement(v).verdict.value in line
    d = verification_dict(v)
    assert d["measured_on"]["quick"] is True and d["verdict"] == judgement(v).verdict.value
