"""Session-scoped tiny-model fixtures built with ``studio.core.factory`` (register via ``pytest_plugins``).

Every model is built at most once per test session (per distinct arguments) and must be treated as
read-only: copy it (``shutil.copytree``) before changing any file in it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TinyModelFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModelFactory:
    """``tiny_model(arch="llama", **kwargs) -> Path``: a cached ``make_tiny_model`` for the session."""
    from studio.core.factory import make_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    cache: dict[str, Path] = {}

    def build(arch: str = "llama", **kwargs: Any) -> Path:
        if "ctx" in kwargs:
            raise TypeError("tiny_model() does not take a JobContext; call make_tiny_model directly.")
        key = json.dumps([arch, sorted(kwargs.items())], default=str)
        if key not in cache:
            cache[key] = make_tiny_model(root / f"{arch}-{len(cache)}", arch, **kwargs)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def llama_model(tiny_model: TinyModelFactory) -> Path:
    """Llama, hidden 256, 2 layers, GQA, SentencePiece tokenizer, planted outliers, one safetensors file."""
    return tiny_model("llama")


@pytest.fixture(scope="session")
def mistral_model(tiny_model: TinyModelFactory) -> Path:
    """Mistral, hidden 256, 2 layers, SentencePiece tokenizer with an [INST] chat template."""
    return tiny_model("mistral")


@pytest.fixture(scope="session")
def qwen2_model(tiny_model: TinyModelFactory) -> Path:
    """Qwen2, hidden 256, 2 layers, tied embeddings, byte-level BPE with ChatML."""
    return tiny_model("qwen2")


@pytest.fixture(scope="session")
def qwen3_model(tiny_model: TinyModelFactory) -> Path:
    """Qwen3 (q/k norms), hidden 256, 2 layers, byte-level BPE with ChatML."""
    return tiny_model("qwen3")


@pytest.fixture(scope="session")
def gemma_model(tiny_model: TinyModelFactory) -> Path:
    """Gemma, hidden 256, 2 layers, tied embeddings, Gemma SentencePiece tokenizer and template."""
    return tiny_model("gemma")


@pytest.fixture(scope="session")
def gemma2_model(tiny_model: TinyModelFactory) -> Path:
    """Gemma 2 (soft-capping, pre/post feed-forward norms), hidden 256, 2 layers."""
    return tiny_model("gemma2")


@pytest.fixture(scope="session")
def phi3_model(tiny_model: TinyModelFactory) -> Path:
    """Phi-3, hidden 256, 2 layers, fused qkv_proj and gate_up_proj, Llama SentencePiece + chat tokens."""
    return tiny_model("phi3")


@pytest.fixture(scope="session")
def gpt2_model(tiny_model: TinyModelFactory) -> Path:
    """GPT-2, hidden 256, 2 layers, Conv1D weights stored (in, out), byte-level BPE, no chat template."""
    return tiny_model("gpt2")


@pytest.fixture(scope="session")
def bert_model(tiny_model: TinyModelFactory) -> Path:
    """BERT encoder (BertModel), hidden 256, 2 layers, WordPiece tokenizer."""
    return tiny_model("bert")


@pytest.fixture(scope="session")
def sharded_llama_model(tiny_model: TinyModelFactory) -> Path:
    """Llama split into two safetensors shards with model.safetensors.index.json."""
    return tiny_model("llama", shards=2)


@pytest.fixture(scope="session")
def odd_hidden_model(tiny_model: TinyModelFactory) -> Path:
    """Llama with hidden 320 and intermediate 960: rows not a multiple of 256 (K-quant fallback case)."""
    return tiny_model("llama", hidden=320)
