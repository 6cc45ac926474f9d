"""transformers and llama.cpp back ends give the same replies for a model and its F32 export."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.chat import (
    ChatSession,
    Message,
    PromptTooLongError,
    Sampling,
    StopReason,
    first_divergence,
    generate,
)
from studio.core.chat.hf_backend import TransformersBackend
from studio.core.chat.llama_backend import LlamaCppBackend


@pytest.fixture(scope="module")
def trio(chat_model, f32_gguf, gguf_of):
    """The original, its F32 export and its Q2_K export, loaded once for the module."""
    backends = [
        TransformersBackend(chat_model, n_ctx=256, device="cpu", dtype="float32"),
        LlamaCppBackend(f32_gguf, n_ctx=256),
        LlamaCppBackend(gguf_of(chat_model, "Q2_K"), n_ctx=256),
    ]
    session = ChatSession(backends)
    assert session.load_all() == [None, None, None]
    yield session
    session.close()


def test_greedy_replies_match_between_original_and_f32_export(trio):
    trio.reset()
    for turn in ("Hello, how are you?", "Tell me about rivers."):
        hf, f32, q2 = trio.send(turn, Sampling(max_tokens=24))
        a, b = hf.result, f32.result
        assert a is not None and b is not None, (hf.error, f32.error)
        assert len(a.tokens) > 0 and a.prompt.template == "model"
        # the same prompt ids in both columns, tokenized by the first column
        assert b.prompt.ids == a.prompt.ids and b.prompt.tokenized_by == a.label
        assert b.token_ids == a.token_ids
        assert b.text == a.text
        assert first_divergence(a.tokens, b.tokens) is None
        pa = np.array([t.prob for t in a.tokens])
        pb = np.array([t.prob for t in b.tokens])
        assert np.abs(pa - pb).max() < 1e-3
        assert all(t.seconds > 0 for t in b.tokens) and b.ttft_s > 0
    # the second turn carries each column's own first reply
    assert trio.messages(0)[1].content == trio.replies[0][0]


def test_seeded_sampling_matches_too(trio):
    trio.reset()
    hf, f32, _ = trio.send("Write something.", Sampling(max_tokens=20, temperature=0.9, top_p=0.95, seed=11))
    assert hf.result.token_ids == f32.result.token_ids
    assert len(set(hf.result.token_ids)) > 2  # really sampled, not a stuck loop


def test_a_2_bit_variant_diverges_from_the_original(trio):
    trio.reset()
    hf, _, q2 = trio.send("Hello, how are you?", Sampling(max_tokens=24))
    div = first_divergence(hf.result.tokens, q2.result.tokens)
    assert div is not None and div < 24
    assert (
        hf.result.tokens[div].text != q2.result.tokens[div].text
        or hf.result.tokens[div].token_id != q2.result.tokens[div].token_id
    )


def test_model_without_template_gets_plain_completion(plain_model, gguf_of):
    gguf = gguf_of(plain_model, "F32")
    s = ChatSession(
        [TransformersBackend(plain_model, n_ctx=128, device="cpu"), LlamaCppBackend(gguf, n_ctx=128)]
    )
    try:
        a, b = s.send("Once upon a time", Sampling(max_tokens=12))
        assert a.result.prompt.template == "none" and a.result.prompt.text == "Once upon a time"
        assert b.result.prompt.template == "none" and b.result.prompt.warning is None
        assert a.result.prompt.ids[0] == 1  # the tokenizer's BOS, added for plain text
        assert a.result.text == b.result.text and a.result.token_ids == b.result.token_ids
    finally:
        s.close()


@pytest.mark.parametrize("column", [0, 1], ids=["transformers", "llama.cpp"])
def test_prompt_longer_than_the_context_is_refused_or_truncated(trio, column):
    backend = trio.backends[column]
    long = [Message("user", "The river runs past the mill and under the bridge. " * 60)]
    with pytest.raises(PromptTooLongError) as err:
        backend.prompt(long)
    n = err.value.n_tokens
    assert n > 255 and f"prompt too long ({n} > 255 tokens)" in str(err.value)
    res = generate(backend, long, Sampling(max_tokens=8), truncate=True)
    assert res.prompt.truncated_from == n and len(res.prompt.ids) <= 256 - 8
    assert res.stop_reason in (StopReason.LENGTH, StopReason.EOS, StopReason.CONTEXT)


def test_byte_level_bpe_model_with_chatml_matches_its_export(qwen2_model, gguf_of):
    """Qwen2: byte-level BPE pieces, tied embeddings and a ChatML template give the same text in both."""
    s = ChatSession(
        [
            TransformersBackend(qwen2_model, n_ctx=256, device="cpu"),
            LlamaCppBackend(gguf_of(qwen2_model, "F32"), n_ctx=256),
        ]
    )
    try:
        a, b = s.send("Grüße, 你好 🌍 — how are you?", Sampling(max_tokens=20))
        assert a.error is None and b.error is None
        assert "<|im_start|>assistant\n" in a.result.prompt.text
        assert a.result.token_ids == b.result.token_ids and a.result.text == b.result.text
    finally:
        s.close()


def test_half_precision_on_cpu_and_device_checks(chat_model):
    from studio.core.chat.hf_backend import resolve_device
    from studio.core.chat.types import ChatError

    b = TransformersBackend(chat_model, n_ctx=128, device="cpu", dtype="bfloat16")
    b.load()
    try:
        assert b.dtype == "bfloat16" and b.device == "cpu"
        res = generate(b, [Message("user", "Hi")], Sampling(max_tokens=4))
        # the same tokens as transformers' own greedy generate in bfloat16 (its EOS not counted)
        import torch

        want = b._model.generate(
            torch.tensor([list(res.prompt.ids)]), max_new_tokens=4, do_sample=False, pad_token_id=0
        )[0, len(res.prompt.ids) :].tolist()
        ends = [i for i, t in enumerate(want) if t in b._eos]
        want = want[: ends[0]] if ends else want
        assert list(res.token_ids) == want and len(want) > 0
        assert res.stop_reason is (StopReason.LENGTH if len(want) == 4 else StopReason.EOS)
        assert all(0.0 < t.prob <= 1.0 for t in res.tokens)
    finally:
        b.close()
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ChatError, match="no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(ChatError, match="Unknown device"):
        resolve_device("tpu")


def test_original_too_big_for_the_gpu_runs_on_the_cpu(chat_model, monkeypatch):
    # the GPU runs out of memory moving the weights: the original model still chats, on the CPU, and says so
    import torch

    from studio.core.chat import hf_backend

    real_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        if "cuda" in (*args, kwargs.get("device")):
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(hf_backend, "resolve_device", lambda _request: "cuda")
    monkeypatch.setattr(torch.nn.Module, "to", to)
    b = TransformersBackend(chat_model, n_ctx=128, device="cuda")
    b.load()
    try:
        assert (b.device, b.dtype) == ("cpu", "float32")
        assert any("runs on the CPU instead" in n for n in b.notes)
        assert generate(b, [Message("user", "Hi")], Sampling(max_tokens=2)).tokens
    finally:
        b.close()


def test_an_original_that_does_not_fit_the_free_ram_is_one_sentence_before_loading(chat_model, monkeypatch):
    """Issue 40: opening an 8B made the window's chat column load it in float32 (33.6 GB) on a 24 GB PC, minutes
    of reading before the kernel's kill; now the load is refused first, naming the figure and a GGUF export."""
    import transformers

    from studio.core.chat import ChatError

    called: list[str] = []
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: called.append("load")
    )
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(1 << 20))
    b = TransformersBackend(chat_model, n_ctx=128, device="cpu")
    with pytest.raises(ChatError) as err:
        b.load()
    msg = str(err.value)
    assert "needs about" in msg and "1.05 MB free" in msg and "GGUF export" in msg and "bfloat16" in msg
    assert called == [] and not b.loaded
