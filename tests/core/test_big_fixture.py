"""The 8B-shaped fixture writer (studio.core.factory.big): shapes, shards, index, values, tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open

from studio.core.factory.big import LLAMA_8B, write_big_llama


def test_llama_8b_shapes_add_up_to_its_published_size():
    # Llama-3.1-8B: 8.03 B parameters, 16.06 GB in BF16, 291 tensors (untied head)
    assert LLAMA_8B.bytes() == 2 * 8_030_261_248
    assert len(LLAMA_8B.tensors()) == 291


def test_small_fixture_is_sharded_loadable_and_has_outliers(tmp_path):
    shape = dataclasses.replace(
        LLAMA_8B, hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=2048
    )
    out = write_big_llama(tmp_path / "m", shape, shard_bytes=1_000_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and set(index["weight_map"]) == {n for n, _ in shape.tensors()}
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["num_key_value_heads"], cfg["tie_word_embeddings"]) == (2048, 2, False)
    assert (out / "tokenizer.model").is_file()
    with safe_open(str(out / index["weight_map"]["model.layers.1.mlp.up_proj.weight"]), "pt") as f:
        w = f.get_tensor("model.layers.1.mlp.up_proj.weight")
    assert w.dtype == torch.bfloat16 and tuple(w.shape) == (512, 256)
    assert float(w.float().std()) == pytest.approx(0.5 / 16, rel=0.1)
    with safe_open(str(out / index["weight_map"]["model.layers.0.input_layernorm.weight"]), "pt") as f:
        norm = f.get_tensor("model.layers.0.input_layernorm.weight").float()
    assert int((norm > 5).sum()) == 8 and int((norm == 1).sum()) == 256 - 8
    assert not (tmp_path / "m.partial").exists()
