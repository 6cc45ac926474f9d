"""An 8B-shaped checkpoint for scale tests and benchmarks: Llama-3.1-8B's shapes, random BF16 weights.

Written tensor by tensor straight into safetensors shards (header first, then each tensor's bytes as
it is generated), so making a 16 GB checkpoint holds one row block in memory, not a shard. The
tokenizer is the factory's small SentencePiece one (llama.cpp's converter recognises it and pads the
vocabulary up to the config's size); the norms carry planted outlier channels, as real models do.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studio.core.factory.specs import FactoryError
from studio.core.factory.tokenizer import _save_tokenizer, build_tokenizer

__all__ = ["LLAMA_8B", "BigShape", "write_big_llama"]


@dataclass(frozen=True)
class BigShape:
    """The widths of a Llama-style checkpoint."""

    hidden: int = 4096
    intermediate: int = 14336
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128256

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor's checkpoint name and shape, in file order (untied head)."""
        h, f, d = self.hidden, self.intermediate, self.hidden // self.heads
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (self.heads * d, h)),
                (p + "self_attn.k_proj.weight", (self.kv_heads * d, h)),
                (p + "self_attn.v_proj.weight", (self.kv_heads * d, h)),
                (p + "self_attn.o_proj.weight", (h, self.heads * d)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (f, h)),
                (p + "mlp.up_proj.weight", (f, h)),
                (p + "mlp.down_proj.weight", (h, f)),
            ]
        return out + [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab, h))]

    def bytes(self) -> int:
        """Bytes of the weights in BF16."""
        return sum(2 * int(np.prod(s)) for _n, s in self.tensors())


LLAMA_8B = BigShape()
"""Llama-3.1-8B's shapes (hidden 4096, FFN 14336, 32 layers, 32 heads / 8 KV heads, vocab 128,256)."""

_OUTLIERS = 8  # planted channels per norm
_BLOCK = 8 << 20  # values written at once (below the pool's size)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits (uint16), rounded to nearest even (as torch rounds)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class _Pool:
    """Unit-normal BF16 values to copy from: a tensor's row blocks are slices at random offsets, so
    writing gigabytes costs a copy per byte, not a random draw (the weights need not be independent)."""

    def __init__(self, rng: np.random.Generator, size: int = 1 << 25) -> None:
        self.rng = rng
        self.size = size
        v = rng.standard_normal(size, dtype=np.float32)
        self.by_scale: dict[float, np.ndarray] = {}
        self._unit = v

    def take(self, n: int, scale: float) -> np.ndarray:
        """``n`` values (BF16 bits) of standard deviation ``scale``."""
        pool = self.by_scale.get(scale)
        if pool is None:
            bits = _bf16(self._unit * np.float32(scale))
            pool = self.by_scale[scale] = np.concatenate([bits, bits])
        a = int(self.rng.integers(0, self.size))
        return pool[a : a + n]


def _values(name: str, shape: tuple[int, ...], pool: _Pool, channels: np.ndarray):
    """The tensor's values (BF16 bits) in row blocks: norms are ones with the outlier channels raised."""
    if len(shape) == 1:
        v = np.ones(shape, dtype=np.float32)
        if "layernorm" in name:
            v[channels] = np.linspace(6.0, 20.0, len(channels), dtype=np.float32)
        yield _bf16(v)
        return
    rows, cols = shape
    scale = 0.5 / float(np.sqrt(cols)) if "embed" not in name else 0.02
    step = max(1, _BLOCK // cols)
    for a in range(0, rows, step):
        yield pool.take((min(rows, a + step) - a) * cols, scale)


def _shards(
    tensors: list[tuple[str, tuple[int, ...]]], shard_bytes: int
) -> list[list[tuple[str, tuple[int, ...]]]]:
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensors:
        n = 2 * int(np.prod(shape))
        if groups[-1] and size + n > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += n
    return groups


def write_big_llama(
    out_dir: str | os.PathLike[str],
    shape: BigShape = LLAMA_8B,
    *,
    shard_bytes: int = 6_000_000_000,
    seed: int = 0,
) -> Path:
    """Write a random BF16 Llama checkpoint of ``shape`` (sharded, with an index and a tokenizer) to ``out_dir``.

    ``out_dir`` must not exist or be empty; the folder is filled under ``*.partial`` and renamed.
    """

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FactoryError(f"{out} is not empty.")
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise FactoryError(f"{shape.heads} heads / {shape.kv_heads} KV heads do not divide {shape.hidden}.")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok, spm_bytes, template = build_tokenizer("llama")
    _save_tokenizer(tok, tmp, spm_bytes, template)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.hidden // shape.heads,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "torch_dtype": "bfloat16",
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    rng = np.random.default_rng(seed)
    channels = np.sort(rng.choice(shape.hidden, size=min(_OUTLIERS, shape.hidden), replace=False))
    pool = _Pool(rng)
    groups = _shards(shape.tensors(), shard_bytes)
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        off = 0
        for name, shp in group:
            n = 2 * int(np.prod(shp))
            header[name] = {"dtype": "BF16", "shape": list(shp), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        hb = json.dumps(header).encode()
        hb += b" " * ((-len(hb)) % 8)
        with open(tmp / fname, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for name, shp in group:
                for block in _values(name, shp, pool, channels):
                    f.write(block.tobytes())
    index = {"metadata": {"total_size": shape.bytes()}, "weight_map": weight_map}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out
