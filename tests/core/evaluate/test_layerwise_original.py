"""An original checkpoint evaluated layer by layer (issue 40: loaded whole, the 8B fixture's original took
9.33 GB at 2 layers and 33.6 GB at 32): the same perplexity, KL and top-token rate as the whole model."""

from __future__ import annotations

import pytest

from studio.core.chat.hf_backend import TransformersBackend
from studio.core.errors import EvaluationError
from studio.core.evaluate import evaluate, layerwise

CTX = 64
CHUNKS = 3


@pytest.fixture(scope="module")
def variants(chat_model, gguf_of):
    return [gguf_of(chat_model, p) for p in ("Q8_0", "Q2_K")]


@pytest.fixture(scope="module")
def whole(chat_model, variants):
    return evaluate(chat_model, variants, n_ctx=CTX, max_chunks=CHUNKS, device="cpu", original_mode="whole")


def test_layers_give_the_numbers_of_the_whole_model(chat_model, variants, whole, monkeypatch):
    loaded: list[str] = []
    real = TransformersBackend.load

    def spy(self, ctx=None):
        loaded.append(type(self).__name__)
        return real(self, ctx)

    monkeypatch.setattr(TransformersBackend, "load", spy)
    logs: list[str] = []
    from studio.core.jobs import JobContext

    got = evaluate(
        chat_model, variants, n_ctx=CTX, max_chunks=CHUNKS, device="cpu", original_mode="layers",
        ctx=JobContext(on_log=logs.append),
    )  # fmt: skip
    assert loaded == []  # the whole model was never loaded through transformers
    assert any("layer by layer" in m for m in logs)
    assert got.original.ppl == pytest.approx(whole.original.ppl, rel=1e-5)
    assert got.original.n_scored == whole.original.n_scored
    for a, b in zip(got.variants, whole.variants, strict=True):
        assert a.error is None and a.ppl == b.ppl  # the variants' own numbers do not depend on the original
        assert a.kld_mean == pytest.approx(b.kld_mean, rel=1e-3, abs=1e-6)
        assert a.kld_p99 == pytest.approx(b.kld_p99, rel=1e-3, abs=1e-6)
        assert a.same_top_pct == pytest.approx(b.same_top_pct, abs=1.0)


def test_auto_runs_layers_above_the_limit_or_the_free_ram(chat_model, monkeypatch):
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    small = {**cfg, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256}
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(64 << 30))
    assert layerwise.use_layers(cfg, 512, "cpu", 4, "auto")  # 33.6 GB whole
    assert not layerwise.use_layers(small, 512, "cpu", 4, "auto")
    assert not layerwise.use_layers(cfg, 512, "cpu", 4, "whole")
    assert layerwise.use_layers(small, 512, "cpu", 4, "layers")
    monkeypatch.setattr(layerwise, "WHOLE_LIMIT", 1 << 50)
    assert not layerwise.use_layers(cfg, 512, "cpu", 4, "auto")
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(1 << 30))  # does not fit the free RAM
    assert layerwise.use_layers(cfg, 512, "cpu", 4, "auto")
    with pytest.raises(EvaluationError, match="Unknown way"):
        layerwise.use_layers(cfg, 512, "cpu", 4, "sideways")


def test_a_gguf_original_is_never_run_in_layers(chat_model, variants):
    with pytest.raises(EvaluationError, match="not a checkpoint folder"):
        evaluate(variants[0], variants[1:], n_ctx=CTX, max_chunks=1, device="cpu", original_mode="layers")
