"""An F32 export computes what the original computes, and tokenizes as the original does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from studio.core.llamacpp import LoadOptions

TEXT = "Hello, world! Grüße aus Köln. Привет, мир! 你好，世界。 こんにちは 🌍🚀👍🏽 naïve café 12345"

CAUSAL = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2"]


def _model(request: pytest.FixtureRequest, arch: str) -> Path:
    if arch == "gemma2":
        # llama.cpp's CPU GELU reads a float16 lookup table (~5e-4 relative error per activation);
        # with planted outliers Gemma 2's extra norms amplify that past 1e-3 of the logit range,
        # which would measure llama.cpp's GELU, not our conversion.
        return request.getfixturevalue("tiny_model")("gemma2", outliers=False)
    return request.getfixturevalue(f"{arch}_model")


@pytest.mark.parametrize("arch", CAUSAL)
def test_f32_logits_match_transformers(arch, request, exported, llama_worker):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _model(request, arch)
    gguf_path = exported(model, "F32", "F32")
    ids = AutoTokenizer.from_pretrained(model, trust_remote_code=False)(TEXT)["input_ids"]
    llama_worker.load(gguf_path, LoadOptions(logits_all=True, n_ctx=256, f32_kv=True))
    got = llama_worker.request("eval_logits", ids=ids)
    kw = {"attn_implementation": "eager"} if arch == "gemma2" else {}
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, trust_remote_code=False, **kw)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    assert got.shape == ref.shape
    diff = float(np.abs(got - ref).max())
    value_range = float(ref.max() - ref.min())
    assert diff <= 1e-3 * value_range, f"{arch}: max |Δlogit| {diff:.3g} vs range {value_range:.3g}"
    # the top token agrees wherever the original's margin is larger than the numeric noise
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * diff
    assert (got.argmax(-1) == ref.argmax(-1))[clear].all()


def test_f32_bert_hidden_states_match_transformers(bert_model, exported, llama_worker):
    import torch
    from transformers import AutoModel

    gguf_path = exported(bert_model, "F32", "F32")
    llama_worker.load(gguf_path, LoadOptions(embedding=True, n_ctx=256))
    r = llama_worker.request("embed", text=TEXT)
    hf = AutoModel.from_pretrained(bert_model, dtype=torch.float32, trust_remote_code=False)
    with torch.no_grad():
        ref = hf(torch.tensor([r["ids"]])).last_hidden_state[0].numpy()
    got = r["embeddings"]
    assert got.shape == ref.shape
    assert float(np.abs(got - ref).max()) <= 1e-3 * float(ref.max() - ref.min())


@pytest.mark.parametrize("arch", [*CAUSAL, "bert"])
def test_gguf_tokenizer_matches_hf(arch, request, exported, llama_worker):
    from transformers import AutoTokenizer

    model = _model(request, arch)
    gguf_path = exported(model, "F32", "F32")
    want = AutoTokenizer.from_pretrained(model, trust_remote_code=False)(TEXT)["input_ids"]
    llama_worker.load(gguf_path, LoadOptions(vocab_only=True))
    # add_bos=True asks llama.cpp to add what the file's add_bos/add_eos flags say it should
    got = llama_worker.request("tokenize", text=TEXT, add_bos=True, special=False)
    assert got == want
    if arch != "bert":  # WordPiece maps unseen emoji to [UNK]; byte-level vocabularies keep them
        text = llama_worker.request("detokenize", ids=got)
        assert "🚀" in text and "世界" in text


def test_spm_tokenizer_from_tokenizer_json_only(llama_model, tmp_path, llama_worker):
    """A Llama folder that ships only tokenizer.json (byte-fallback BPE) still gets llama.cpp's SPM vocab."""
    import shutil

    from transformers import AutoTokenizer

    from studio.core.export.run import export_gguf

    model = tmp_path / "llama-json"
    shutil.copytree(llama_model, model)
    (model / "tokenizer.model").unlink()
    res = export_gguf(model, tmp_path / "m.gguf", "Q8_0")
    assert res.tokenizer is not None and res.tokenizer.model == "llama"
    want = AutoTokenizer.from_pretrained(model, trust_remote_code=False)(TEXT)["input_ids"]
    llama_worker.load(res.path, LoadOptions(vocab_only=True))
    assert llama_worker.request("tokenize", text=TEXT, add_bos=True, special=False) == want
