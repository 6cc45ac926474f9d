"""The tiny-model factory's checkpoints: random weights in Hugging Face layout with planted outlier channels,
saved as safetensors (optionally sharded) with the tokenizer and ``quant_studio_factory.json``."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors

from studio.core.factory.specs import (
    _GRANITE_MULTIPLIERS,
    _SPECS,
    ARCHITECTURES,
    DTYPES,
    FACTORY_INFO_NAME,
    GEMMA3_SLIDING_WINDOW,
    FactoryError,
    FactoryInfo,
    _ArchSpec,
    _spec,
)
from studio.core.factory.tokenizer import (
    _save_tokenizer,
    _special_ids,
    build_tokenizer,
)
from studio.core.jobs import JobContext, null_context
from studio.core.model.hf_progress import no_hf_progress_bars

if TYPE_CHECKING:  # heavy imports stay lazy: the GUI imports this module before torch is wanted
    import torch

_OUTLIER_FACTOR_RANGE = (20.0, 50.0)


def _default_heads(hidden: int) -> int:
    for head_dim in (64, 32):
        if hidden % head_dim == 0 and hidden // head_dim >= 2:
            return hidden // head_dim
    raise FactoryError(
        f"Hidden size {hidden} cannot be split into heads of at least 32 dimensions.",
        hint="Use a multiple of 32 (at least 64).",
    )


def _config_kwargs(
    spec: _ArchSpec, shape: FactoryInfo, *, positions: int, tie: bool, special: dict[str, int | None]
) -> dict[str, Any]:
    hidden, layers, heads, kv_heads = shape.hidden, shape.layers, shape.heads, shape.kv_heads
    intermediate, vocab = shape.intermediate, shape.vocab_size
    head_dim = hidden // heads
    if spec.model_type == "gpt2":
        return dict(
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=intermediate,
            n_positions=positions,
            vocab_size=vocab,
            tie_word_embeddings=tie,
            **special,
        )
    if spec.model_type == "bert":
        return dict(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            max_position_embeddings=positions,
            vocab_size=vocab,
            tie_word_embeddings=tie,
            pad_token_id=special["pad_token_id"],
        )
    kw: dict[str, Any] = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=positions,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        **special,
    )
    if spec.model_type in ("qwen3", "gemma", "gemma2", "gemma3_text", "qwen3_moe"):
        kw["head_dim"] = head_dim
    if spec.experts:
        # the MLP of every layer is a mixture: `intermediate` is each expert's width
        key = "num_experts" if spec.model_type == "qwen3_moe" else "num_local_experts"
        kw[key] = spec.experts
        kw["num_experts_per_tok"] = 2
        if spec.model_type == "qwen3_moe":
            kw.update(moe_intermediate_size=intermediate, decoder_sparse_step=1, mlp_only_layers=[])
            kw["norm_topk_prob"] = True
        else:
            kw["sliding_window"] = None
    if spec.model_type == "gemma3_text":
        kw["query_pre_attn_scalar"] = head_dim
        kw["sliding_window"] = min(GEMMA3_SLIDING_WINDOW, positions)
    if spec.model_type == "granite":
        kw.update(_GRANITE_MULTIPLIERS)
    if spec.model_type == "mistral":
        kw["sliding_window"] = None
    if spec.model_type == "gemma2":
        kw["query_pre_attn_scalar"] = head_dim
        kw["sliding_window"] = min(4096, positions)
    if spec.model_type == "phi3":
        kw["original_max_position_embeddings"] = positions
    return kw


def _norm_for_inputs(arch: str, names: set[str], layer: int) -> list[tuple[str, list[str], int]]:
    """For one layer: (norm weight feeding the inputs, weights reading those inputs, input axis)."""
    if arch == "gpt2":
        p = f"transformer.h.{layer}"
        out = [
            (f"{p}.ln_1.weight", [f"{p}.attn.c_attn.weight"], 0),  # Conv1D stores (in, out)
            (f"{p}.ln_2.weight", [f"{p}.mlp.c_fc.weight"], 0),
        ]
    elif arch == "bert":
        # Post-norm: the layer reads the previous layer's output LayerNorm (or the embeddings').
        p = f"encoder.layer.{layer}"
        prev = (
            "embeddings.LayerNorm.weight"
            if layer == 0
            else f"encoder.layer.{layer - 1}.output.LayerNorm.weight"
        )
        qkv = [f"{p}.attention.self.{x}.weight" for x in ("query", "key", "value")]
        out = [
            (prev, qkv, 1),
            (f"{p}.attention.output.LayerNorm.weight", [f"{p}.intermediate.dense.weight"], 1),
        ]
    else:
        p = f"model.layers.{layer}"
        if arch == "phi3":
            attn, mlp = [f"{p}.self_attn.qkv_proj.weight"], [f"{p}.mlp.gate_up_proj.weight"]
        else:
            attn = [f"{p}.self_attn.{x}_proj.weight" for x in ("q", "k", "v")]
            mlp = [f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up")]
        if arch == "olmo2":
            return []  # post-norm: no norm scales the inputs of a projection
        if arch in ("qwen3_moe", "mixtral"):
            # in memory transformers fuses each layer's experts into one (experts, 2 x width, hidden)
            # parameter; the router reads the same normed inputs
            mlp = [f"{p}.mlp.gate.weight", f"{p}.mlp.experts.gate_up_proj"]
        mlp_norm = (
            f"{p}.pre_feedforward_layernorm.weight"
            if arch in ("gemma2", "gemma3_text")
            else f"{p}.post_attention_layernorm.weight"
        )
        out = [(f"{p}.input_layernorm.weight", attn, 1), (mlp_norm, mlp, 1)]
    for norm, weights, _ in out:
        missing = [n for n in [norm, *weights] if n not in names]
        if missing:
            raise FactoryError(f"The {arch} model has no tensor {missing[0]!r}; the factory is out of date.")
    return out


def _init_weights(
    model: torch.nn.Module, arch: str, spec: _ArchSpec, tie: bool, gen: torch.Generator
) -> None:
    """Overwrite every parameter from ``gen`` with fan-in scaled values so activations stay near unit size.

    Two choices keep next-token distributions realistic (neither flat nor one-hot): token embeddings
    enter the residual stream small (element std 2/sqrt(hidden), 0.3 for Gemma, which scales them by
    sqrt(hidden)), so the layers and not the input token decide the output; and the head gives logits
    of std about 3 (through the final norm's gain when the head is tied to the embedding).
    """
    import torch

    hidden = model.config.hidden_size
    emb_std = 0.3 / hidden if spec.offset_norm else 2.0 / math.sqrt(hidden)
    tied_std = emb_std * _granite_compensation(model.config, "embed_tokens")  # the head's weights
    final_gain = 3.0 / (tied_std * math.sqrt(hidden)) if tie else 1.0
    # Granite divides its logits by logits_scaling; the final norm gives that factor back
    final_gain *= float(getattr(model.config, "logits_scaling", 1.0) or 1.0)
    final_norm = {"gpt2": "transformer.ln_f.weight", "bert": ""}.get(arch, "model.norm.weight")
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = tuple(param.shape)
            if param.ndim >= 2:
                if "position" in name or name.endswith("wpe.weight") or "token_type" in name:
                    std = 0.3 / math.sqrt(hidden)
                elif "lm_head" in name:
                    std = 3.0 / math.sqrt(hidden)
                elif "embed" in name or name.endswith("wte.weight"):
                    std = 1.0 if arch == "bert" else emb_std  # BERT normalizes its embeddings at once
                else:
                    # GPT-2's Conv1D stores (in, out); Linear (out, in), fused experts (experts, out, in)
                    fan_in = shape[0] if arch == "gpt2" else shape[-1]
                    std = 1.0 / math.sqrt(fan_in)
                std *= _granite_compensation(model.config, name)
                values = torch.randn(shape, generator=gen) * std
            elif name.endswith("bias"):
                values = torch.randn(shape, generator=gen) * 0.02
            else:  # norm weights: a gain around 1 (stored as gain - 1 for Gemma's 1 + w)
                gain = final_gain if name == final_norm else 1.0
                values = gain * (1.0 + torch.randn(shape, generator=gen) * 0.05)
                if spec.offset_norm:
                    values = values - 1.0
            param.copy_(values.to(param.dtype))


def _plant_outliers(
    model: torch.nn.Module, arch: str, spec: _ArchSpec, layers: int, hidden: int, gen: torch.Generator
) -> tuple[tuple[int, ...], tuple[float, ...], tuple[str, ...], tuple[str, ...]]:
    """Make a few input channels large in the norms and in the weights that read them.

    The planted weights are then rescaled as a whole so their expected output size is what it was
    before planting: the outlier channels dominate without blowing up activations.
    """
    import torch

    count = max(2, hidden // 128)
    channels = sorted(torch.randperm(hidden, generator=gen)[:count].tolist())
    lo, hi = _OUTLIER_FACTOR_RANGE
    factors = [round(lo + (hi - lo) * i / max(1, count - 1), 2) for i in range(count)]
    params = dict(model.named_parameters())
    idx = torch.tensor(channels)
    fac = torch.tensor(factors)
    planted_w: list[str] = []
    planted_n: list[str] = []
    with torch.no_grad():
        for layer in range(layers):
            for norm_name, weight_names, axis in _norm_for_inputs(arch, set(params), layer):
                norm = params[norm_name]
                gain = (1.0 + norm) if spec.offset_norm else norm.clone()
                old_gain = gain.clone()
                gain[idx] = gain[idx] * fac
                norm.copy_(gain - 1.0 if spec.offset_norm else gain)
                if norm_name not in planted_n:
                    planted_n.append(norm_name)
                for wname in weight_names:
                    w = params[wname]
                    before = _expected_out_energy(w, old_gain, axis)
                    if axis == 1:
                        w[..., idx] *= fac  # the last axis holds the inputs (also for fused experts)
                    else:
                        w[idx, :] *= fac[:, None]
                    after = _expected_out_energy(w, gain, axis)
                    w.mul_(torch.sqrt(before / after))
                    planted_w.extend(_saved_names(arch, wname, spec.experts))
    return tuple(channels), tuple(factors), tuple(planted_w), tuple(planted_n)


def _granite_compensation(config: Any, name: str) -> float:
    """Granite scales embeddings by embedding_multiplier and every block's output by
    residual_multiplier; undoing that in the initial weights keeps the tiny model in the same regime
    as the others, while the multipliers still matter to any conversion that dropped them."""
    emb = float(getattr(config, "embedding_multiplier", 1.0) or 1.0)
    res = float(getattr(config, "residual_multiplier", 1.0) or 1.0)
    if "embed_tokens" in name:
        return 1.0 / emb
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return 1.0 / res
    return 1.0


def _saved_names(arch: str, name: str, experts: int) -> list[str]:
    """The checkpoint tensors a parameter is saved as: transformers keeps a layer's experts fused
    in memory (``mlp.experts.gate_up_proj``) but saves one gate and one up tensor per expert, and
    Mixtral's modules under their original ``block_sparse_moe`` name."""
    if arch == "mixtral" and name.endswith(".mlp.gate.weight"):
        return [name.replace(".mlp.gate.", ".block_sparse_moe.gate.")]  # Mixtral's saved router name
    if not name.endswith(".experts.gate_up_proj"):
        return [name]
    base = name[: -len("mlp.experts.gate_up_proj")]
    if arch == "mixtral":
        return [
            f"{base}block_sparse_moe.experts.{e}.{w}.weight" for e in range(experts) for w in ("w1", "w3")
        ]
    return [f"{base}mlp.experts.{e}.{w}_proj.weight" for e in range(experts) for w in ("gate", "up")]


def _expected_out_energy(w: torch.Tensor, gain: torch.Tensor, axis: int) -> torch.Tensor:
    # E|Wx|^2 for x_j with variance gain_j^2: sum_j |column j|^2 gain_j^2.
    w2 = w.float() ** 2
    col = w2.reshape(-1, w.shape[-1]).sum(dim=0) if axis == 1 else w2.sum(dim=1)
    return (col * gain.float() ** 2).sum()


def _reshard(folder: Path, shards: int) -> None:
    """Split the single model.safetensors into ``shards`` files of similar size plus the index json."""
    from safetensors.torch import save_file  # imports torch

    single = folder / "model.safetensors"
    with safetensors.safe_open(str(single), framework="pt") as f:
        names = list(f.keys())
        tensors = {n: f.get_tensor(n) for n in names}
        metadata = f.metadata() or {"format": "pt"}
    if len(names) < shards:
        raise FactoryError(f"A model with {len(names)} tensors cannot be split into {shards} shards.")
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(sizes)
    cumulative = list(itertools.accumulate(sizes))
    # Contiguous groups cut where the running total crosses k/shards of the whole, never empty.
    bounds = [0]
    for k in range(1, shards):
        cut = bisect.bisect_left(cumulative, total * k / shards) + 1
        cut = min(max(cut, bounds[-1] + 1), len(names) - (shards - k))
        bounds.append(cut)
    bounds.append(len(names))
    groups = [names[bounds[i] : bounds[i + 1]] for i in range(shards)]
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in group}, str(folder / fname), metadata=metadata)
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    single.unlink()


def make_tiny_model(
    out_dir: str | os.PathLike[str],
    arch: str = "llama",
    *,
    hidden: int = 256,
    layers: int = 2,
    intermediate: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    vocab_size: int | None = None,
    outliers: bool = True,
    seed: int = 0,
    shards: int = 1,
    dtype: str = "float32",
    tie_embeddings: bool | None = None,
    max_positions: int | None = None,
    ctx: JobContext | None = None,
) -> Path:
    """Build a random tiny ``arch`` checkpoint with a trained tokenizer in ``out_dir`` and return its path.

    ``vocab_size`` is the tokenizer's training target (default 1024); the config's vocab_size equals
    the tokenizer's length. ``out_dir`` must not exist or be empty; it is filled atomically.
    """
    spec = _spec(arch)
    ctx = ctx or null_context()
    if dtype not in DTYPES:
        raise FactoryError(
            f"Unknown dtype {dtype!r} for a tiny model.", hint=f"Use one of {', '.join(DTYPES)}."
        )
    if layers < 1 or shards < 1:
        raise FactoryError("A tiny model needs at least one layer and one shard.")
    heads = heads or _default_heads(hidden)
    if hidden % heads or hidden // heads < 32 or (hidden // heads) % 2:
        raise FactoryError(
            f"{heads} heads do not split hidden size {hidden} into even heads of at least 32 dimensions."
        )
    if kv_heads is None:
        kv_heads = heads // 2 if spec.gqa and heads % 2 == 0 else heads
    if heads % kv_heads or (not spec.gqa and kv_heads != heads):
        raise FactoryError(f"{kv_heads} key/value heads do not fit {heads} attention heads for {arch}.")
    intermediate = intermediate or (hidden if spec.experts else 3 * hidden if spec.gated else 4 * hidden)
    positions = max_positions or (512 if arch == "bert" else 1024)
    tie = spec.tie if tie_embeddings is None else tie_embeddings
    if arch in ("gemma", "gemma2", "gemma3_text") and not tie:
        raise FactoryError(f"{arch} always ties its output head to the token embedding.")

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FactoryError(
            f"The folder {out} already exists and is not empty.", hint="Choose a new or empty folder."
        )
    steps = 5
    ctx.report(0, steps, f"Training the {arch} tokenizer")
    tok, spm_bytes, template = build_tokenizer(arch, vocab_size)
    ctx.check_cancelled()

    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    ctx.report(1, steps, f"Building a {layers}-layer {arch} model")
    shape = FactoryInfo(
        arch=arch,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab_size=len(tok),
        seed=seed,
        dtype=dtype,
        shards=shards,
    )
    cfg = AutoConfig.for_model(
        spec.model_type,
        **_config_kwargs(spec, shape, positions=positions, tie=tie, special=_special_ids(tok)),
    )
    # Model construction draws from torch's global generator; fork it so callers' seeds are untouched,
    # then overwrite every parameter from our own seeded generator.
    with torch.random.fork_rng(devices=[]):
        auto = AutoModelForCausalLM if spec.causal else AutoModel
        model = auto.from_config(cfg, trust_remote_code=False, dtype=torch.float32)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    _init_weights(model, arch, spec, tie, gen)
    if tie and hasattr(model, "tie_weights"):
        model.tie_weights()
    planted: tuple[tuple[int, ...], tuple[float, ...], tuple[str, ...], tuple[str, ...]] = ((), (), (), ())
    if outliers and spec.pre_norm:
        planted = _plant_outliers(model, arch, spec, layers, hidden, gen)
    ctx.check_cancelled()
    model = model.to(getattr(torch, dtype))

    ctx.report(2, steps, "Saving weights")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        with no_hf_progress_bars():
            model.save_pretrained(str(tmp))
        if shards > 1:
            _reshard(tmp, shards)
        ctx.check_cancelled()
        ctx.report(3, steps, "Saving the tokenizer")
        tok.model_max_length = positions
        _save_tokenizer(tok, tmp, spm_bytes, template)
        info = replace(
            shape,
            outlier_channels=planted[0],
            outlier_factors=planted[1],
            outlier_tensors=planted[2],
            outlier_norms=planted[3],
        )
        (tmp / FACTORY_INFO_NAME).write_text(
            json.dumps(_info_to_json(info), indent=2) + "\n", encoding="utf-8"
        )
        ctx.report(4, steps, "Finishing")
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    ctx.report(steps, steps, f"Built {arch} in {out}")
    return out


def _info_to_json(info: FactoryInfo) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(info).items()}


def read_factory_info(model_dir: str | os.PathLike[str]) -> FactoryInfo | None:
    """The ``FactoryInfo`` of a factory-built checkpoint, or None for any other folder."""
    path = Path(model_dir) / FACTORY_INFO_NAME
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))  # noqa: TID251 - the factory's own files, made in this package
    fields = FactoryInfo.__dataclass_fields__
    return FactoryInfo(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields})


def iter_architectures() -> Iterator[str]:
    """The architectures this transformers installation can build (all of ``ARCHITECTURES`` normally)."""
    from transformers import CONFIG_MAPPING

    for arch in ARCHITECTURES:
        if _SPECS[arch].model_type in CONFIG_MAPPING:
            yield arch
