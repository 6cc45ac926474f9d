"""KV-cache precision in llama.cpp: KL grows F16 → Q8_0 → Q4_0, the memory follows the formula, chat runs."""

from __future__ import annotations

import pytest

from studio.core.chat import Sampling, generate
from studio.core.chat.llama_backend import LlamaCppBackend
from studio.core.chat.types import Message
from studio.core.errors import StudioError
from studio.core.evaluate import evaluate
from studio.core.llamacpp.kvcache import kv_type, llama_kwargs

CTX = 128


@pytest.fixture(scope="module")
def report(chat_model, f32_gguf):
    return evaluate(
        chat_model, [f32_gguf], kv_types=("f16", "q8_0", "q4_0"), n_ctx=CTX, max_chunks=2, device="cpu"
    )


def test_kl_grows_as_the_cache_shrinks(report):
    f16, q8, q4 = report.variants
    assert [v.kv_type for v in report.variants] == ["f16", "q8_0", "q4_0"]
    assert all(v.error is None for v in report.variants), [v.error for v in report.variants]
    assert f16.label.endswith("[KV f16]") and q4.label.endswith("[KV q4_0]")
    # the weights are F32 in all three: only the cache differs
    assert f16.kld_mean < 1e-4 < q8.kld_mean < q4.kld_mean
    assert q4.same_top_pct < f16.same_top_pct


def test_memory_effect_follows_the_formula(report, chat_model):
    import json

    cfg = json.loads((chat_model / "config.json").read_text())
    values = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * 64 * 256  # 128 tokens: 256 allocated
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    f16, q8, q4 = report.variants
    assert (f16.kv_cache_bytes, q8.kv_cache_bytes, q4.kv_cache_bytes) == (
        values * 2,
        values * 34 // 32,
        values * 18 // 32,
    )
    d = report.to_dict()["variants"][2]
    assert d["kv_type"] == "q4_0" and d["kv_cache_bytes"] == values * 18 // 32
    assert d["verdict"] in ("excellent", "good", "acceptable", "something went wrong")
    assert d["verdict_detail"]["form"] == "relative"  # a random tiny model is far from PPL 6


def test_chat_with_a_quantized_cache(f32_gguf):
    with LlamaCppBackend(f32_gguf, n_ctx=256, kv_type="q4_0") as b:
        b.load()
        out = generate(b, [Message("user", "Hello there")], Sampling(max_tokens=8))
    assert len(out.tokens) > 0


def test_kv_types_and_their_llama_arguments():
    assert llama_kwargs("f16") == {"type_k": 1, "type_v": 1, "flash_attn": False}
    assert llama_kwargs("Q8_0") == {"type_k": 8, "type_v": 8, "flash_attn": True}
    assert kv_type("q4_0").bytes_per_element == 18 / 32
    with pytest.raises(StudioError, match="KV-cache type"):
        kv_type("q3_k")
    with pytest.raises(StudioError, match="KV-cache type"):
        LlamaCppBackend("x.gguf", kv_type="bf8")
