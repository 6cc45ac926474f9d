"""Benchmark: inventory of a 30-shard checkpoint with open_model (budget: under 1 s).

Builds a Llama-named checkpoint of 30 real safetensors shards (300 small tensors each, 9,000 in all,
with model.safetensors.index.json), then times ``open_model`` (headers, index validation, roles,
layers) against a reference measured in the same run: safetensors' own ``safe_open`` listing every
shard's keys, shapes and dtypes. Prints both times, their ratio and the peak RSS.

    python bench/inventory.py [--shards 30] [--per-shard 300] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SUFFIXES = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)


def build(folder: Path, shards: int, per_shard: int) -> int:
    """Write the checkpoint; returns the number of tensors."""
    from safetensors.numpy import save_file

    total = shards * per_shard
    names = [f"model.layers.{i // len(SUFFIXES)}.{SUFFIXES[i % len(SUFFIXES)]}" for i in range(total)]
    names[0], names[-1] = "model.embed_tokens.weight", "lm_head.weight"
    weight_map = {}
    a = np.zeros((16, 16), np.float16)
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s * per_shard : (s + 1) * per_shard]
        save_file(dict.fromkeys(part, a), str(folder / fname))
        weight_map |= dict.fromkeys(part, fname)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": total // len(SUFFIXES) + 1,
        "hidden_size": 16,
        "num_attention_heads": 1,
        "vocab_size": 16,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return total


def reference(folder: Path) -> int:
    """safetensors' own listing of every shard: keys, shapes, dtypes."""
    from safetensors import safe_open

    n = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as h:
            for k in h.keys():
                sl = h.get_slice(k)
                sl.get_shape(), sl.get_dtype()
                n += 1
    return n


def ours(folder: Path) -> int:
    from studio.core.model import open_model

    with open_model(folder) as ck:
        return len(ck.info.tensors)


def best_of(fn, folder: Path, repeat: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn(folder)
        times.append(time.perf_counter() - t0)
    return min(times), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=30)
    ap.add_argument("--per-shard", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import safetensors  # noqa: F401  (import cost is not part of either measurement)

    import studio.core.model  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        total = build(folder, args.shards, args.per_shard)
        # first (cold-cache for Python objects) open, then best of N for both
        t0 = time.perf_counter()
        n_first = ours(folder)
        first = time.perf_counter() - t0
        t_ours, n_ours = best_of(ours, folder, args.repeat)
        t_ref, n_ref = best_of(reference, folder, args.repeat)
    assert n_first == n_ours == n_ref == total, (n_first, n_ours, n_ref, total)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_mib = peak / 1024 if sys.platform != "darwin" else peak / 1024**2
    print(f"checkpoint: {args.shards} shards, {total} tensors")
    print(f"open_model inventory: first {first:.3f} s, best of {args.repeat} {t_ours:.3f} s (budget 1.000 s)")
    print(f"reference safe_open listing: best of {args.repeat} {t_ref:.3f} s")
    print(f"ratio ours/reference: {t_ours / t_ref:.2f}")
    print(f"peak RSS: {peak_mib:.0f} MiB")
    return 0 if first < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
