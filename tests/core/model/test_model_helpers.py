"""Hand-made checkpoints for the model tests (no tests here): tiny HF folders and crafted safetensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 96,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def llama_tensors(cfg: dict = LLAMA_CONFIG, seed: int = 0) -> dict[str, np.ndarray]:
    """A Llama state dict of the config's shapes with random float32 values."""
    rng = np.random.default_rng(seed)
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": w(h, h),
            p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h),
            p + "self_attn.o_proj.weight": w(h, h),
            p + "mlp.gate_proj.weight": w(f, h),
            p + "mlp.up_proj.weight": w(f, h),
            p + "mlp.down_proj.weight": w(h, f),
            p + "input_layernorm.weight": w(h),
            p + "post_attention_layernorm.weight": w(h),
        }
    out["model.norm.weight"] = w(h)
    out["lm_head.weight"] = w(v, h)
    return out


def write_folder(
    folder: Path, tensors: dict[str, np.ndarray], config: dict | None = None, shards: int = 1
) -> Path:
    """Save ``tensors`` in HF layout (config.json, one file or ``shards`` shards + index)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "tokenizer.json").write_text("{}")  # presence only; nothing here parses it
    names = list(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / fname))
        weight_map |= dict.fromkeys(part, fname)
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def raw_safetensors(entries: list[tuple[str, str, list[int], bytes]], *, header: dict | None = None) -> bytes:
    """safetensors bytes from (name, dtype, shape, data); ``header`` replaces the computed header."""
    h: dict = {}
    off = 0
    for name, dtype, shape, data in entries:
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    hb = json.dumps(header if header is not None else h).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + b"".join(e[3] for e in entries)


def raw_with_header_text(text: bytes, data: bytes = b"", n: int | None = None) -> bytes:
    """safetensors bytes with a literal header ``text`` and an optional lying length ``n``."""
    return struct.pack("<Q", len(text) if n is None else n) + text + data
