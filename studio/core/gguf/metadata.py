"""GGUF metadata for an exported model: architecture hyper-parameters and general keys."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from studio import __version__
from studio.core import safejson
from studio.core.errors import ExportError
from studio.core.gguf.arch import gguf_arch, head_counts, hparam
from studio.core.modelinfo import ModelInfo

GGML_QUANT_VERSION = 2  # general.quantization_version llama.cpp writes


def _studio_version() -> str:
    try:
        return str(__version__)
    except Exception:  # pragma: no cover - package metadata missing in odd installs
        return "0"


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    # transformers ≥ 4.5x keeps rope settings in rope_parameters; older configs in rope_scaling
    rp = cfg.get("rope_parameters") or {}
    if isinstance(rp, dict) and "full_attention" in rp and isinstance(rp["full_attention"], dict):
        rp = rp["full_attention"]
    rs = cfg.get("rope_scaling") or {}
    out = dict(rs) if isinstance(rs, dict) else {}
    out.update(rp if isinstance(rp, dict) else {})
    if "rope_type" not in out and "type" in out:
        out["rope_type"] = out["type"]
    if "rope_theta" not in out and cfg.get("rope_theta") is not None:
        out["rope_theta"] = cfg["rope_theta"]
    return out


def add_arch_metadata(w: Any, info: ModelInfo) -> None:
    """Write the architecture hyper-parameters llama.cpp reads for this model."""
    arch = gguf_arch(info)
    cfg = info.config
    n_layer = int(hparam(cfg, "num_hidden_layers", "n_layer", default=info.n_layers))
    n_embd = int(hparam(cfg, "hidden_size", "n_embd", default=0))
    n_head, n_kv = head_counts(cfg)
    if not n_embd or not n_layer:
        raise ExportError(f"{info.path}: config.json lacks hidden_size or num_hidden_layers.")
    w.add_block_count(n_layer)
    n_ctx = hparam(cfg, "max_position_embeddings", "n_ctx", "n_positions", default=2048)
    w.add_context_length(int(n_ctx))
    w.add_embedding_length(n_embd)
    n_ff = hparam(cfg, "intermediate_size", "n_inner", default=None)
    if arch == "gpt2" or n_ff is None:
        n_ff = n_ff or 4 * n_embd
    w.add_feed_forward_length(int(n_ff))
    w.add_head_count(n_head)
    rope = _rope(cfg)
    if arch in ("gpt2", "bert"):
        eps = hparam(cfg, "layer_norm_epsilon", "layer_norm_eps", default=1e-5)
        w.add_layer_norm_eps(float(eps))
        if arch == "bert":
            w.add_head_count_kv(n_kv)
            w.add_causal_attention(False)
            w.add_pooling_type(_bert_pooling(info))
        return
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(float(hparam(cfg, "rms_norm_eps", default=1e-6)))
    given_head_dim = hparam(cfg, "head_dim", default=None)
    head_dim = int(given_head_dim) if given_head_dim is not None else n_embd // n_head
    # the converter writes them whenever config.json names head_dim (TextModel), and always for Gemma
    if arch in ("gemma", "gemma2", "qwen3") or given_head_dim is not None or head_dim != n_embd // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "llama":
        w.add_vocab_size(int(hparam(cfg, "vocab_size", default=0)))
    theta = rope.get("rope_theta")
    if theta is not None and arch not in ("gemma",):
        w.add_rope_freq_base(float(theta))
    elif theta is not None:
        w.add_rope_freq_base(float(theta))
    rope_type = str(rope.get("rope_type") or "").lower()
    factor = rope.get("factor")

    if rope_type == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(factor))
    elif rope_type == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(factor))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    if arch == "phi3":
        partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
        w.add_rope_dimension_count(int(partial * n_embd) // n_head)
        orig = rope.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        if orig is not None:
            w.add_rope_scaling_orig_ctx_len(int(orig))
        w.add_sliding_window(int(cfg.get("sliding_window") or 0))
    elif arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(float(cfg.get("attn_logit_softcapping") or 0.0))
        w.add_final_logit_softcapping(float(cfg.get("final_logit_softcapping") or 0.0))
        w.add_sliding_window(int(cfg.get("sliding_window") or 4096))


def _bert_pooling(info: ModelInfo) -> Any:
    modules = info.path / "modules.json" if info.path.is_dir() else None
    if modules is not None and modules.is_file():
        try:
            for mod in safejson.loads(modules.read_bytes(), "modules.json", ValueError):
                if str(mod.get("type", "")).endswith("Pooling"):
                    pc = safejson.loads(
                        (info.path / mod["path"] / "config.json").read_bytes(), "config.json", ValueError
                    )
                    if pc.get("pooling_mode_cls_token"):
                        return gguf.PoolingType.CLS
                    if pc.get("pooling_mode_mean_tokens"):
                        return gguf.PoolingType.MEAN
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return gguf.PoolingType.NONE


def extra_tensors(info: ModelInfo) -> list[tuple[str, np.ndarray]]:
    """Tensors llama.cpp needs that the checkpoint does not hold (rope frequency factors)."""
    arch = gguf_arch(info)
    cfg = info.config
    rope = _rope(cfg)
    out: list[tuple[str, np.ndarray]] = []
    rope_type = str(rope.get("rope_type") or "").lower()
    if arch == "llama" and rope_type == "llama3":
        base = float(rope.get("rope_theta", 10000.0))
        n_head, _ = head_counts(cfg)
        dim = int(hparam(cfg, "head_dim", default=0) or int(cfg["hidden_size"]) // n_head)
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factor = float(rope.get("factor", 8.0))
        lo = float(rope.get("low_freq_factor", 1.0))
        hi = float(rope.get("high_freq_factor", 4.0))
        old = float(rope.get("original_max_position_embeddings", 8192))
        lo_wl, hi_wl = old / lo, old / hi
        factors = []
        for f in freqs:
            wl = 2 * math.pi / float(f)
            if wl < hi_wl:
                factors.append(1.0)
            elif wl > lo_wl:
                factors.append(factor)
            else:
                smooth = (old / wl - lo) / (hi - lo)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        out.append(("rope_freqs.weight", np.asarray(factors, dtype=np.float32)))
    if arch == "phi3" and rope.get("long_factor"):
        out.append(("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32)))
        out.append(("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32)))
    return out


MAX_MODEL_CARD = 1 << 20  # a README.md larger than this is not parsed for authorship metadata
_NAME_FIELDS = ("name", "organization", "basename", "finetune", "version", "size_label")


def hub_revision(path: str | Path) -> str | None:
    """The commit of a Hugging Face cache snapshot folder (``.../snapshots/<40 hex>/...``), else None."""
    parts = Path(path).expanduser().resolve().parts
    for prev, part in zip(parts, parts[1:], strict=False):
        if prev == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", part):
            return part
    return None


def converter_metadata(info: ModelInfo, n_params: int, source_repo: str | None = None) -> Any:
    """The authorship metadata llama.cpp's ``convert_hf_to_gguf.py`` derives for this model.

    gguf-py's ``Metadata.load`` is the converter's own code: model card (README.md front matter:
    license, base models, tags...), config.json's ``_name_or_path``, generation_config.json's sampling
    settings and the folder name (basename, size label, finetune, version). A model from the Hub cache
    is named after its repository instead of its snapshot folder, as if cloned under the repo's name.
    """
    folder = info.path if info.path.is_dir() else info.path.parent
    card = folder / "README.md"
    try:
        if card.is_file() and card.stat().st_size > MAX_MODEL_CARD:
            raise ValueError("model card too large")
        meta = gguf.Metadata.load(None, folder, None, n_params)
    except Exception:  # noqa: BLE001 - a broken model card or config only costs its metadata
        meta = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), None, info.config, folder, n_params)
    if source_repo:
        # undo what the snapshot folder's hash gave, then read the names off the repository's
        from_hash = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), None, None, folder, n_params)
        for field in _NAME_FIELDS:
            if getattr(from_hash, field) is not None and getattr(meta, field) == getattr(from_hash, field):
                setattr(meta, field, None)
        gguf.Metadata.apply_metadata_heuristic(meta, None, None, Path(source_repo.split("/")[-1]), n_params)
    if meta.name is None:
        meta.name = folder.name  # the converter's fallback: the folder's name, never its path
    if meta.size_label is None and n_params > 0:
        meta.size_label = gguf.size_label(n_params, n_params, 0, 0)
    return meta


def add_general_metadata(
    w: Any,
    info: ModelInfo,
    *,
    ftype: int,
    plan_json: str | None,
    source_repo: str | None = None,
    n_params: int = 0,
) -> None:
    """general.* keys as llama.cpp's converter writes them, plus the studio's own (version, plan).

    Nothing path-like: a model from the Hub cache records its repo id and revision as URLs
    (``general.source.repo_url``, ``general.source.url``), a local folder only its name.
    ``n_params`` counts the weights of every tensor written (the size label is made from it).
    """
    w.add_type(gguf.GGUFType.MODEL)
    meta = converter_metadata(info, n_params, source_repo)
    if source_repo:
        meta.source_repo_url = f"https://huggingface.co/{source_repo}"
        rev = hub_revision(info.path)
        meta.source_url = f"https://huggingface.co/{source_repo}/tree/{rev}" if rev else meta.source_repo_url
    meta.set_gguf_meta_model(w)
    w.add_file_type(int(ftype))
    w.add_quantization_version(GGML_QUANT_VERSION)
    w.add_string("quant_studio.version", _studio_version())
    if plan_json is not None:
        w.add_string("quant_studio.plan", plan_json)
