"""The tiny-model factory: checkpoints load back in transformers, tokenizers are real, outliers are visible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.core.errors import StudioError
from studio.core.factory import (
    ARCHITECTURES,
    FactoryError,
    build_tokenizer,
    make_tiny_model,
    read_factory_info,
)
from studio.core.jobs import JobContext

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

# NFC text with accents, CJK, Cyrillic, Arabic, emoji (with a skin-tone modifier and a ZWJ family),
# tabs, a double space and a newline: everything a byte-level or byte-fallback tokenizer must keep.
MULTILINGUAL = (
    "Hello wörld! 你好，世界。こんにちは Привет مرحبا 🤖👍🏽 👨‍👩‍👧  two\tspaces\nnew line 🦙 x=1.5"
)
CAUSAL = [a for a in ARCHITECTURES if a != "bert"]


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _load(folder: Path):
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModel if read_factory_info(folder).arch == "bert" else AutoModelForCausalLM
    return cls.from_pretrained(str(folder), trust_remote_code=False).eval()


def _output(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_architecture_loads_back_and_gives_finite_output(tiny_model, arch: str) -> None:
    from transformers import AutoConfig, AutoTokenizer

    folder = tiny_model(arch)
    cfg = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    assert cfg.model_type == arch
    assert cfg.vocab_size == len(tok)
    assert (folder / "model.safetensors").is_file()
    model = _load(folder)
    ids = tok.encode(MULTILINGUAL)[:48]
    out = _output(model, ids)
    assert out.shape[:2] == (1, len(ids))
    assert torch.isfinite(out).all()
    if arch != "bert":
        assert out.shape[-1] == len(tok)
        # Neither flat nor one-hot: a quantization error must be able to move the distribution.
        top = torch.softmax(out[0], dim=-1).max(dim=-1).values
        assert 0.02 < float(top.mean()) < 0.95


@pytest.mark.parametrize("arch", CAUSAL)
def test_tokenizer_round_trips_multilingual_text(tiny_model, arch: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model(arch)))
    ids = tok.encode(MULTILINGUAL, add_special_tokens=False)
    assert tok.decode(ids) == MULTILINGUAL
    # The vocabulary was learnt, not only bytes: common English words are one token each.
    assert len(tok.tokenize(" the")) == 1
    assert len(ids) < len(MULTILINGUAL.encode("utf-8"))


def test_bert_wordpiece_tokenizer(bert_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bert_model))
    vocab = (bert_model / "tokenizer.json").read_text(encoding="utf-8")
    assert '"WordPiece"' in vocab
    ids = tok("The quick brown fox")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "the quick brown fox"
    assert tok.unk_token_id not in ids


@pytest.mark.parametrize("arch", ["llama", "gemma", "phi3"])
def test_sentencepiece_model_matches_tokenizer_json(tiny_model, arch: str) -> None:
    import sentencepiece as spm
    from transformers import AutoTokenizer

    from studio.core.factory import sample_text

    folder = tiny_model(arch)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    tok = AutoTokenizer.from_pretrained(str(folder))
    # Lines that start with spaces are left out: like the real Llama, transformers' Metaspace does
    # not add the dummy prefix before leading whitespace, while SentencePiece does.
    lines = [ln for ln in sample_text().splitlines() if ln.strip() and not ln[0].isspace()] + [MULTILINGUAL]
    for line in lines:
        assert tok.encode(line, add_special_tokens=False) == sp.encode(line), line
    assert sp.id_to_piece(tok.bos_token_id) == tok.bos_token
    assert sp.is_byte(sp.piece_to_id("<0xF0>"))


def test_bpe_tokenizers_keep_vocab_and_merges(qwen2_model: Path, gpt2_model: Path) -> None:
    from transformers import AutoTokenizer

    for folder in (qwen2_model, gpt2_model):
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        assert data["model"]["type"] == "BPE"
        assert len(data["model"]["vocab"]) >= 512 and len(data["model"]["merges"]) > 100
        assert not (folder / "tokenizer.model").exists()
    qwen = AutoTokenizer.from_pretrained(str(qwen2_model))
    specials = qwen.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert specials == [len(qwen) - 3, len(qwen) - 2, len(qwen) - 1]
    assert qwen.eos_token == "<|im_end|>" and qwen.pad_token == "<|endoftext|>"
    assert qwen.encode("<|im_start|>user", add_special_tokens=False)[0] == specials[1]
    # As in Qwen's own tokenizer.json: the chat markers are added tokens, not part of the BPE vocab.
    data = json.loads((qwen2_model / "tokenizer.json").read_text(encoding="utf-8"))
    assert "<|im_start|>" not in data["model"]["vocab"]
    assert {t["content"]: t["id"] for t in data["added_tokens"]}["<|im_end|>"] == specials[2]


def test_phi3_chat_tokens_follow_the_sentencepiece_model(phi3_model: Path) -> None:
    import sentencepiece as spm
    from transformers import AutoTokenizer

    base = spm.SentencePieceProcessor(model_file=str(phi3_model / "tokenizer.model")).get_piece_size()
    added = json.loads((phi3_model / "added_tokens.json").read_text(encoding="utf-8"))
    assert sorted(added.values()) == list(range(base, base + 5))
    tok = AutoTokenizer.from_pretrained(str(phi3_model))
    assert added["<|end|>"] == tok.eos_token_id and added["<|endoftext|>"] == tok.pad_token_id
    assert len(tok) == base + 5


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("qwen2", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
        ("llama", "<s><|user|>\nHi</s>\n<|assistant|>\n"),
        ("gemma", "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"),
        ("phi3", "<|user|>\nHi<|end|>\n<|assistant|>\n"),
    ],
)
def test_chat_template_in_tokenizer_config(tiny_model, arch: str, expected: str) -> None:
    from transformers import AutoTokenizer

    folder = tiny_model(arch)
    cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "chat_template" in cfg
    tok = AutoTokenizer.from_pretrained(str(folder))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == expected


def test_gpt2_has_no_chat_template(gpt2_model: Path) -> None:
    cfg = json.loads((gpt2_model / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "chat_template" not in cfg
    assert not (gpt2_model / "chat_template.jinja").exists()


def _column_ratio(w: torch.Tensor, axis: int) -> tuple[float, torch.Tensor]:
    col = w.float().abs().amax(dim=0 if axis == 1 else 1)
    return float(col.max() / col.median()), col


# OLMo 2 normalizes after attention and MLP: no norm scales a projection's inputs, nothing is planted
@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "olmo2"])
def test_planted_outliers_are_visible(tiny_model, arch: str) -> None:
    folder = tiny_model(arch)
    info = read_factory_info(folder)
    assert info is not None and len(info.outlier_channels) >= 2
    tensors = _tensors(folder)
    axis = 0 if arch == "gpt2" else 1  # GPT-2's Conv1D weights are (in, out)
    assert len(info.outlier_tensors) >= 2 * info.layers
    for name in info.outlier_tensors:
        ratio, col = _column_ratio(tensors[name], axis)
        assert ratio > 10, name
        assert set(torch.topk(col, len(info.outlier_channels)).indices.tolist()) == set(info.outlier_channels)
    for name in info.outlier_norms:
        gain = tensors[name].float() + (1.0 if arch.startswith("gemma") else 0.0)
        assert float(gain[list(info.outlier_channels)].abs().min()) > 10 * float(gain.abs().median()), name


def test_without_outliers_no_column_stands_out(tiny_model) -> None:
    folder = tiny_model("llama", outliers=False)
    info = read_factory_info(folder)
    assert info.outlier_channels == () and info.outlier_tensors == ()
    ratio, _ = _column_ratio(_tensors(folder)["model.layers.0.self_attn.q_proj.weight"], 1)
    assert ratio < 3


def test_sharded_model_has_index_and_same_weights(sharded_llama_model: Path, llama_model: Path) -> None:
    index = json.loads((sharded_llama_model / "model.safetensors.index.json").read_text(encoding="utf-8"))
    shards = sorted(p.name for p in sharded_llama_model.glob("*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert not (sharded_llama_model / "model.safetensors").exists()
    assert set(index["weight_map"].values()) == set(shards)
    a, b = _tensors(sharded_llama_model), _tensors(llama_model)
    assert set(index["weight_map"]) == set(a) == set(b)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    ids = list(range(5, 40))
    assert torch.allclose(_output(_load(sharded_llama_model), ids), _output(_load(llama_model), ids))


def test_many_shards(tmp_path: Path) -> None:
    folder = make_tiny_model(tmp_path / "m", "gpt2", shards=5)
    index = json.loads((folder / "model.safetensors.index.json").read_text(encoding="utf-8"))
    assert len(set(index["weight_map"].values())) == 5
    assert len(list(folder.glob("model-*-of-00005.safetensors"))) == 5


def test_odd_hidden_model(odd_hidden_model: Path) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(odd_hidden_model))
    assert cfg.hidden_size == 320 and cfg.hidden_size % 256 != 0
    assert cfg.hidden_size % cfg.num_attention_heads == 0
    assert cfg.hidden_size // cfg.num_attention_heads >= 32
    assert cfg.max_position_embeddings >= 512
    assert torch.isfinite(_output(_load(odd_hidden_model), [1, 2, 3, 4])).all()


def test_same_seed_same_weights_other_seed_differs(tmp_path: Path, llama_model: Path) -> None:
    state = torch.random.get_rng_state()
    again = make_tiny_model(tmp_path / "a", "llama")
    other = make_tiny_model(tmp_path / "b", "llama", seed=1)
    assert torch.equal(state, torch.random.get_rng_state()), "the factory must not move torch's global RNG"
    a, b, c = _tensors(llama_model), _tensors(again), _tensors(other)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], c["model.layers.0.mlp.up_proj.weight"])
    assert (llama_model / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


def test_dtype_and_shape_options(tmp_path: Path) -> None:
    folder = make_tiny_model(
        tmp_path / "m",
        "qwen2",
        hidden=512,
        layers=3,
        heads=8,
        kv_heads=2,
        dtype="bfloat16",
        tie_embeddings=False,
    )
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (512, 3, 2)
    tensors = _tensors(folder)
    assert "lm_head.weight" in tensors
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 64, 512)


def test_progress_is_reported(tmp_path: Path) -> None:
    seen: list[tuple[int, int, str]] = []
    make_tiny_model(
        tmp_path / "m", "gpt2", ctx=JobContext(on_progress=lambda d, t, m: seen.append((d, t, m)))
    )
    assert seen[-1][0] == seen[-1][1]
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)


def test_bad_requests_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FactoryError, match="cannot build architecture 'mamba'"):
        make_tiny_model(tmp_path / "x", "mamba")
    with pytest.raises(FactoryError, match="heads"):
        make_tiny_model(tmp_path / "x", "llama", hidden=256, heads=3)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(StudioError, match="not empty"):
        make_tiny_model(busy, "llama")
    assert sorted(p.name for p in busy.iterdir()) == ["keep.txt"]
    assert not list(tmp_path.glob("*.partial"))


def test_tokenizers_are_cached_and_deterministic() -> None:
    from studio.core.factory import tokenizer as factory

    a = factory._train_spm("spm", 1024)
    assert factory._train_spm("spm", 1024) is a
    assert factory._train_spm.__wrapped__("spm", 1024) == a
    assert factory._train_bpe.__wrapped__("bpe-qwen", 1024) == factory._train_bpe("bpe-qwen", 1024)
    tok, spm_bytes, template = build_tokenizer("llama")
    assert spm_bytes == a and template and len(tok) == 1024


def test_vocab_size_sets_the_tokenizer_and_config(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = make_tiny_model(tmp_path / "m", "llama", vocab_size=768, layers=1)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert cfg["vocab_size"] == 768 == len(AutoTokenizer.from_pretrained(str(folder)))
    assert _tensors(folder)["model.embed_tokens.weight"].shape == (768, 256)
    with pytest.raises(FactoryError, match="768 or more"):
        make_tiny_model(tmp_path / "small", "llama", vocab_size=512)


def test_cancelled_build_leaves_nothing(tmp_path: Path) -> None:
    from studio.core.jobs import JobCancelled

    ctx = JobContext()
    ctx.cancel()
    with pytest.raises(JobCancelled):
        make_tiny_model(tmp_path / "m", "gpt2", ctx=ctx)
    assert list(tmp_path.iterdir()) == []


def test_no_hf_progress_bars_silences_and_restores():
    from transformers.utils import logging as hf_logging

    from studio.core.model.hf_progress import no_hf_progress_bars

    assert hf_logging.is_progress_bar_enabled()
    with no_hf_progress_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with no_hf_progress_bars():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # a caller's own choice is kept
    finally:
        hf_logging.enable_progress_bar()


def test_factory_writes_no_transformers_progress_bar(tmp_path, capsys):
    # regression: "Writing model shards: 100%|..." from save_pretrained leaked into CLI/test output
    from studio.core.factory import make_tiny_model

    make_tiny_model(tmp_path / "m", "gpt2", hidden=64, layers=1, outliers=False)
    assert "Writing model shards" not in capsys.readouterr().err
