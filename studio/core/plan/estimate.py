"""File size and run-time memory per preset, and whether that fits this machine.

File size: every exported tensor's bytes in the qtype the preset gives it (the qtypes come from
``studio.core.plan.presets.preset_types``, which applies llama.cpp's per-tensor rules and its
fallbacks for rows that are not a multiple of the block size), plus a header allowance.

Run-time memory (llama.cpp), stated model:
    weights (the tensor bytes above)
  + KV cache = layers x 2 (K and V) x kv_heads x head_dim x cells x 2 bytes (F16 cache), where
    cells = context, except on sliding-window layers (Gemma 2/3's local layers, as config
    ``layer_types`` or llama.cpp's default pattern says) where llama.cpp's iSWA cache keeps
    pad256(min(context, window + 512)) cells; zero for encoder-only models (BERT), which keep no cache
  + overhead = 5 % of the weights + 64 MiB fixed + vocab x 512 x 4 bytes
    (compute buffers; the last term is the logits scratch of one 512-token batch, which dominates
    for large vocabularies; encoder-only models have no LM head and skip it).
The verdict compares that with the free memory ``studio.core.hardware`` reports now.

Mixture-of-experts models: every expert is in the file and in memory (total parameters); a token
runs through ``experts_used`` of the ``experts`` per layer, so the active parameters are the
non-expert weights plus that share of the expert weights. Both counts are part of an estimate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studio.core.errors import StudioError
from studio.core.gguf.layout import layout
from studio.core.gguf.read import GGUFFile, read_gguf
from studio.core.hardware import HardwareInfo
from studio.core.modelinfo import CheckpointFormat, ModelInfo, Role, TensorInfo, experts_of
from studio.core.modelinfo import config_int as _cfg_int
from studio.core.plan.gguf_file import copied_metadata_bytes, requantized_file_bytes
from studio.core.plan.memory import kv_bytes, overhead_bytes  # the one memory model
from studio.core.plan.plan import plan_from_preset
from studio.core.plan.presets import PRESETS as TYPES_OF
from studio.core.plan.presets import preset_types
from studio.core.quant.types import QTYPES, fallback_type

if TYPE_CHECKING:  # only for annotations: estimates take a plan, they never make one
    from studio.core.plan.plan import Plan

PRESETS: tuple[str, ...] = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")

LOW_BIT_PRESETS: tuple[str, ...] = tuple(
    p
    for p in (
        "IQ4_XS",
        "IQ4_NL",
        "IQ3_M",
        "IQ3_S",
        "IQ3_XS",
        "IQ3_XXS",
        "Q2_K_S",
        "IQ2_M",
        "IQ2_S",
        "Q2_0",
        "IQ2_XS",
        "TQ2_0",
        "IQ2_XXS",
        "IQ1_M",
        "TQ1_0",
        "IQ1_S",
        "Q1_0",
        "MXFP4_MOE",
    )  # fmt: skip
    if p in TYPES_OF
)
"""llama-quantize's i-quant, ternary, 1-2-bit and MXFP4 presets, after ``PRESETS`` in every listing."""

ALL_PRESETS: tuple[str, ...] = PRESETS + LOW_BIT_PRESETS
"""The presets the Summary tab and ``inspect`` estimate (the Hub badges keep to ``PRESETS``)."""

MPS_WORKING_SET_FRACTION = 0.75  # Metal lets the GPU wire about this share of unified RAM

# Header allowance: fixed metadata, per-tensor info and the tokenizer arrays (a token string with its
# u64 length, its f32 score and i32 type average about 24 bytes).
HEADER_FIXED_BYTES = 8 * 1024
HEADER_BYTES_PER_TOKEN = 24
HEADER_BYTES_PER_TENSOR = 8 + 4 + 4 + 8 + 32  # lengths, type, offset, worst alignment padding

_ENCODER_ONLY = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "nomic_bert", "jina_bert"})


class Verdict(str, Enum):
    """How a model at a preset would run on the detected hardware."""

    FITS_GPU = "fits on the GPU"
    PARTIAL_OFFLOAD = "fits with partial offload"
    CPU_ONLY = "CPU only"
    DOES_NOT_FIT = "does not fit"


@dataclass(frozen=True)
class Estimate:
    """Size and memory of one preset, with the verdict for the hardware it was computed for."""

    preset: str
    file_bytes: int  # tensor_bytes + header_bytes
    tensor_bytes: int
    header_bytes: int
    kv_bytes: int
    overhead_bytes: int
    memory_bytes: int  # tensor_bytes + kv_bytes + overhead_bytes
    verdict: Verdict
    bits_per_weight: float
    gpu_layers: int  # suggested n_gpu_layers for llama.cpp (0 = CPU only)
    ctx_len: int
    n_fallbacks: int = 0  # tensors whose rows forced a different type than the preset's own
    exact: bool = True  # False: generic per-type estimate (architecture the exporter cannot map)
    types: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    n_params: int = 0  # weights in the exported tensors (every expert counted)
    n_active_params: int = 0  # weights one token runs through (= n_params for dense models)
    n_experts: int = 0  # experts per layer (0: dense)
    n_experts_used: int = 0  # experts each token is routed to


# ----------------------------------------------------------------------------------- type sizes


def type_bytes(n_elements: int, row: int, type_name: str) -> int:
    """Bytes of ``n_elements`` values (rows of ``row``) stored as qtype ``type_name``."""
    info = QTYPES[type_name]
    if row % info.block_size:
        raise ValueError(f"rows of {row} do not fit {type_name} blocks of {info.block_size}")
    return n_elements // info.block_size * info.type_size


def gguf_row(t: TensorInfo) -> int:
    """ggml's ne[0] once exported: the last axis, or the first for a transposed (Conv1D) weight."""
    if not t.shape:
        return 1
    return t.shape[0] if t.transposed and len(t.shape) == 2 else t.shape[-1]


# ------------------------------------------------------------------------- preset -> tensor types


def _preset_types(info: ModelInfo, preset: str) -> tuple[dict[str, str], bool]:
    """(tensor -> qtype, exact). Exact: the exporter's llama.cpp rules applied to this model (a GGUF
    original included: its own tensor names, as ``llama-quantize --allow-requantize`` chooses).

    For what the exporter cannot map (an unknown architecture) every 2-D float tensor gets the preset's
    default type with llama.cpp's row fallback, 1-D tensors and norms F32: approximate.
    """
    try:
        return preset_types(info, preset), True
    except StudioError:
        pass
    return _generic_types(info, preset), False


def _generic_types(info: ModelInfo, preset: str) -> dict[str, str]:
    base = TYPES_OF[preset].default_type
    out: dict[str, str] = {}
    for t in info.tensors:
        if t.dtype not in _FLOAT_DTYPES and info.format is not CheckpointFormat.GGUF:
            continue  # integer buffers (position ids) are not exported
        if len(t.shape) < 2 or t.role in (Role.NORM, Role.POS_EMBD, Role.TYPE_EMBD) or t.n_elements == 0:
            out[t.name] = "F32"
        else:
            out[t.name] = fallback_type(base, gguf_row(t)).qtype
    return out


_FLOAT_DTYPES = frozenset({"F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2"})


# ------------------------------------------------------------------------------------- estimates


# llama.cpp's default sliding-window patterns when a config does not list its layer types: a layer
# i is local unless (i + 1) % pattern == 0 (llama-model.cpp's set_swa_pattern / load_swa_pattern).
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}
SWA_UBATCH = 512  # llama.cpp's default micro-batch, added to the window in the iSWA cache


def sliding_layers(config: dict[str, Any], n_layers: int) -> tuple[bool, ...]:
    """Per layer: whether llama.cpp keeps a sliding-window (local) KV cache for it."""
    window = _cfg_int(config, "sliding_window")
    types = config.get("layer_types")
    if not window:
        return (False,) * n_layers
    if isinstance(types, list) and len(types) >= n_layers:
        return tuple(str(t) == "sliding_attention" for t in types[:n_layers])
    pattern = _SWA_PATTERN.get(str(config.get("model_type")))
    if pattern is None:
        return (False,) * n_layers
    return tuple((i + 1) % pattern != 0 for i in range(n_layers))


def kv_cells(config: dict[str, Any], n_layers: int, ctx_len: int) -> tuple[int, ...]:
    """KV cache cells per layer for ``ctx_len`` tokens (smaller on sliding-window layers)."""
    window = _cfg_int(config, "sliding_window") or 0
    swa = -(-min(ctx_len, window + SWA_UBATCH) // 256) * 256  # llama-kv-cache-iswa.cpp: padded to 256
    return tuple(swa if local else ctx_len for local in sliding_layers(config, n_layers))


def kv_cache_bytes(config: dict[str, Any], n_layers: int, ctx_len: int) -> int:
    """F16 KV cache bytes for ``ctx_len`` tokens; 0 for encoder-only models."""
    if config.get("model_type") in _ENCODER_ONLY:
        return 0
    hidden = _cfg_int(config, "hidden_size", "n_embd", "d_model")
    heads = _cfg_int(config, "num_attention_heads", "n_head")
    kv_heads = _cfg_int(config, "num_key_value_heads", "n_head_kv") or heads
    head_dim = _cfg_int(config, "head_dim") or (hidden // heads if hidden and heads else None)
    if not (kv_heads and head_dim and n_layers):
        return 0
    return kv_bytes(kv_cells(config, n_layers, ctx_len), kv_heads, head_dim)  # llama.cpp's default: F16


def active_parameters(shapes: dict[str, tuple[int, ...]], n_experts: int, n_used: int) -> int:
    """Weights one token runs through: merged expert tensors (3-D, first axis = expert) count for
    ``n_used`` of their ``n_experts`` experts, everything else fully."""
    total = 0
    for shape in shapes.values():
        n = math.prod(shape)
        if n_experts and len(shape) == 3 and shape[0] == n_experts:
            n = n * n_used // n_experts
        total += n
    return total


def _overhead(weights: int, config: dict[str, Any]) -> int:
    # Encoder-only models have no LM head, so no logits scratch.
    vocab = 0 if config.get("model_type") in _ENCODER_ONLY else (_cfg_int(config, "vocab_size") or 0)
    return overhead_bytes(weights, vocab)


def verdict_for(memory: int, hw: HardwareInfo) -> Verdict:
    """Where ``memory`` bytes would run on ``hw``."""
    if hw.gpus and all(g.unified for g in hw.gpus):
        budget = min(hw.gpu_free_bytes, int(MPS_WORKING_SET_FRACTION * hw.ram_total_bytes))
        if memory <= budget:
            return Verdict.FITS_GPU
        return Verdict.PARTIAL_OFFLOAD if memory <= hw.ram_available_bytes else Verdict.DOES_NOT_FIT
    if hw.gpus:
        if memory <= hw.gpu_free_bytes:
            return Verdict.FITS_GPU
        if memory <= hw.gpu_free_bytes + hw.ram_available_bytes:
            return Verdict.PARTIAL_OFFLOAD
        return Verdict.DOES_NOT_FIT
    return Verdict.CPU_ONLY if memory <= hw.ram_available_bytes else Verdict.DOES_NOT_FIT


def _gpu_layers(verdict: Verdict, hw: HardwareInfo, n_layers: int, layer_bytes: int, rest: int) -> int:
    if verdict is Verdict.FITS_GPU:
        return n_layers
    if verdict is not Verdict.PARTIAL_OFFLOAD or layer_bytes <= 0 or not hw.gpus:
        return 0
    budget = hw.gpu_free_bytes
    if all(g.unified for g in hw.gpus):
        budget = min(budget, int(MPS_WORKING_SET_FRACTION * hw.ram_total_bytes))
    return max(0, min(n_layers, (budget - rest) // layer_bytes))


def estimate_preset(
    info: ModelInfo,
    preset: str,
    hw: HardwareInfo,
    ctx_len: int = 4096,
    *,
    source: tuple[GGUFFile, int] | None = None,
    header: bool = True,
) -> Estimate:
    """The estimate for one preset (any of ``studio.core.plan.presets.PRESETS``).

    For a GGUF original the file size is the export's to the byte (``requantized_file_bytes``);
    ``source``: its header and copied metadata bytes, already read (``estimate_presets`` reads them once);
    ``header=False`` skips that count (reading the header takes a moment) for a caller of ``tensor_bytes``.
    """
    if preset not in TYPES_OF:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(TYPES_OF)}")
    types, exact = _preset_types(info, preset)
    est = _estimate_types(info, preset, types, hw, ctx_len, TYPES_OF[preset].default_type, exact)
    if exact and header and info.format is CheckpointFormat.GGUF:
        g, copied = source if source is not None else _gguf_source(info)
        size = requantized_file_bytes(g, plan_from_preset(info, preset), copied=copied)
        est = dataclasses.replace(est, file_bytes=size, header_bytes=size - est.tensor_bytes)
    return est


def _gguf_source(info: ModelInfo) -> tuple[GGUFFile, int]:
    g = read_gguf(info.path)
    return g, copied_metadata_bytes(g)


def estimate_plan(info: ModelInfo, plan: Plan, hw: HardwareInfo, ctx_len: int = 4096) -> Estimate:
    """The estimate for a per-tensor plan (``studio.core.plan.plan.Plan``) on ``hw``."""
    return _estimate_types(info, plan.name, dict(plan.types), hw, ctx_len, None, True)


def _estimate_types(
    info: ModelInfo,
    label: str,
    types: dict[str, str],
    hw: HardwareInfo,
    ctx_len: int,
    base: str | None,
    exact: bool,
) -> Estimate:
    """File size, run-time memory and verdict of ``info`` exported with ``types`` (tensor -> type)."""
    shapes = _gguf_shapes(info, exact)
    tensor_bytes = 0
    n_el = 0
    per_layer: dict[int, int] = {}
    n_fallbacks = 0
    counted: dict[str, tuple[int, ...]] = {}
    for name, typ in types.items():
        found = shapes.get(name)
        if found is None:
            continue  # a plan made for another revision of the model; its extra names cost nothing
        shape, layer = found
        n = math.prod(shape)
        row = shape[-1] if shape else 1
        b = type_bytes(n, row, typ)
        tensor_bytes += b
        n_el += n
        counted[name] = shape
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + b
        # Rows the preset's own block size cannot tile get another type (llama.cpp's fallback).
        if base is not None and len(shape) >= 2 and typ != "F32" and row % QTYPES[base].block_size:
            n_fallbacks += 1
    n_exp, n_used = experts_of(info.config, shapes.params)
    vocab = _cfg_int(info.config, "vocab_size") or 0
    header = (
        HEADER_FIXED_BYTES
        + sum(HEADER_BYTES_PER_TENSOR + len(n) for n in types)
        + vocab * HEADER_BYTES_PER_TOKEN
    )
    n_layers = info.n_layers or (max(per_layer) + 1 if per_layer else 0)
    return _make_estimate(
        label,
        tensor_bytes=tensor_bytes,
        header=header,
        n_weights=n_el,
        config=info.config,
        n_layers=n_layers,
        hw=hw,
        ctx_len=ctx_len,
        largest_layer=max(per_layer.values()) if per_layer else 0,
        outside_layers=tensor_bytes - sum(per_layer.values()),
        n_fallbacks=n_fallbacks,
        exact=exact,
        types=dict(types),
        n_params=n_el,
        n_active_params=active_parameters(counted, n_exp, n_used),
        n_experts=n_exp,
        n_experts_used=n_used,
    )


class _Shapes(dict[str, tuple[tuple[int, ...], int | None]]):
    """Plan key → (GGUF numpy shape, layer), plus the layout's converter hyper-parameters."""

    params: dict[str, Any]


def _gguf_shapes(info: ModelInfo, exact: bool) -> _Shapes:
    """The shapes a plan's keys stand for: from the export layout when there is one (merged expert
    tensors exist only there), else from the checkpoint's tensors in GGUF orientation."""
    out = _Shapes()
    out.params = {}
    if exact and info.format is not CheckpointFormat.GGUF:
        try:
            lay = layout(info)
        except StudioError:
            lay = None
        if lay is not None:
            for tm in lay.tensors:
                out[tm.hf_name] = (tuple(tm.shape), tm.layer)
            out.params = dict(lay.params)
            return out
    for t in info.tensors:
        shape = tuple(t.shape)
        if t.transposed and len(shape) == 2:
            shape = shape[::-1]
        out[t.name] = (shape, t.layer)
    return out


def _make_estimate(
    label: str,
    *,
    tensor_bytes: int,
    header: int,
    n_weights: int,
    config: Any,
    n_layers: int,
    hw: HardwareInfo,
    ctx_len: int,
    largest_layer: int | None = None,
    outside_layers: int = 0,
    **extra: Any,
) -> Estimate:
    """KV cache, overhead, memory, verdict and GPU layers around known tensor bytes.

    ``largest_layer``: weight bytes of the biggest layer; None when only the total is known, and
    weights and cache are then spread evenly over the layers.
    """
    kv = kv_cache_bytes(config, n_layers, ctx_len)
    overhead = _overhead(tensor_bytes, config)
    memory = tensor_bytes + kv + overhead
    verdict = verdict_for(memory, hw)
    if largest_layer is None:
        layer_bytes = (tensor_bytes + kv) // n_layers if n_layers else 0
    else:
        layer_bytes = largest_layer + (kv // n_layers if n_layers else 0)
    return Estimate(
        preset=label,
        file_bytes=tensor_bytes + header,
        tensor_bytes=tensor_bytes,
        header_bytes=header,
        kv_bytes=kv,
        overhead_bytes=overhead,
        memory_bytes=memory,
        verdict=verdict,
        bits_per_weight=8 * tensor_bytes / n_weights if n_weights else 0.0,
        gpu_layers=_gpu_layers(verdict, hw, n_layers, layer_bytes, outside_layers + overhead),
        ctx_len=ctx_len,
        **extra,
    )


def estimate_presets(
    info: ModelInfo, hw: HardwareInfo, ctx_len: int = 4096, presets: tuple[str, ...] = ALL_PRESETS
) -> tuple[Estimate, ...]:
    """Estimates for every preset in ``presets`` (``ALL_PRESETS``), in that order."""
    source = _gguf_source(info) if info.format is CheckpointFormat.GGUF and presets else None
    return tuple(estimate_preset(info, p, hw, ctx_len, source=source) for p in presets)


# ---------------------------------------------------------------------------- config-only models

_UNGATED = frozenset({"gpt2", "bert", "gpt_neox", "opt", "falcon", "phi", "gptj", "bloom", "starcoder2"})


def synthetic_info(config: dict[str, Any]) -> ModelInfo | None:
    """A ModelInfo with the tensors of a standard Llama-layout decoder of this config's sizes (no files).

    It is named as Llama so the exporter's preset rules apply; None when the config lacks the sizes.
    A mixture-of-experts config gets a router and its experts merged into 3-D tensors per layer, as
    llama.cpp stores them (plus a dense shared expert when the config has one).
    """
    h = _cfg_int(config, "hidden_size", "n_embd", "d_model")
    n_layers = _cfg_int(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg_int(config, "num_attention_heads", "n_head")
    vocab = _cfg_int(config, "vocab_size")
    if not (h and n_layers and heads and vocab):
        return None
    kv = _cfg_int(config, "num_key_value_heads", "n_head_kv") or heads
    hd = _cfg_int(config, "head_dim") or h // heads
    ffn = _cfg_int(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * h
    model_type = config.get("model_type")
    gated = model_type not in _UNGATED
    tied = bool(config.get("tie_word_embeddings", model_type in ("gpt2", "gemma", "gemma2", "bert")))
    nowhere = Path("<config>")

    def t(name: str, shape: tuple[int, ...], role: Role, layer: int | None = None) -> TensorInfo:
        return TensorInfo(name, shape, "F16", 2 * math.prod(shape), nowhere, role, layer)

    n_exp, _ = experts_of(config)
    eff = _cfg_int(config, "moe_intermediate_size", "expert_intermediate_size") or ffn
    shared = _cfg_int(config, "shared_expert_intermediate_size") or 0

    tensors = [t("model.embed_tokens.weight", (vocab, h), Role.TOKEN_EMBD)]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        tensors += [
            t(p + "input_layernorm.weight", (h,), Role.NORM, i),
            t(p + "self_attn.q_proj.weight", (heads * hd, h), Role.ATTN_Q, i),
            t(p + "self_attn.k_proj.weight", (kv * hd, h), Role.ATTN_K, i),
            t(p + "self_attn.v_proj.weight", (kv * hd, h), Role.ATTN_V, i),
            t(p + "self_attn.o_proj.weight", (h, heads * hd), Role.ATTN_OUT, i),
            t(p + "post_attention_layernorm.weight", (h,), Role.NORM, i),
        ]
        if n_exp:
            # a mixture of experts: the router and each projection's experts merged, as in GGUF
            tensors += [
                t(p + "mlp.gate.weight", (n_exp, h), Role.FFN_ROUTER, i),
                t(p + "mlp.experts.gate_proj.weight", (n_exp, eff, h), Role.FFN_GATE_EXPS, i),
                t(p + "mlp.experts.up_proj.weight", (n_exp, eff, h), Role.FFN_UP_EXPS, i),
                t(p + "mlp.experts.down_proj.weight", (n_exp, h, eff), Role.FFN_DOWN_EXPS, i),
            ]
            ffn = shared  # a shared expert, when the config has one, is a dense MLP beside them
        if ffn:
            tensors += [
                t(p + "mlp.up_proj.weight", (ffn, h), Role.FFN_UP, i),
                t(p + "mlp.down_proj.weight", (h, ffn), Role.FFN_DOWN, i),
            ]
            if gated:
                tensors.append(t(p + "mlp.gate_proj.weight", (ffn, h), Role.FFN_GATE, i))
    tensors.append(t("model.norm.weight", (h,), Role.NORM))
    if not tied:
        tensors.append(t("lm_head.weight", (vocab, h), Role.OUTPUT))
    archs = config.get("architectures")
    cfg = {**config, "model_type": "llama", "tie_word_embeddings": tied, "num_key_value_heads": kv}
    return ModelInfo(
        path=nowhere,
        format=CheckpointFormat.SAFETENSORS,
        architecture=archs[0] if isinstance(archs, list) and archs else "unknown",
        model_type="llama",
        config=cfg,
        tensors=tuple(tensors),
        n_layers=n_layers,
    )


# Average bits per weight of llama.cpp presets on 7-8B Llama models, for configs we cannot expand.
_TYPICAL_BPW = {
    "F16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.56,
    "Q5_K_M": 5.69,
    "Q4_K_M": 4.89,
    "Q4_0": 4.55,
    "Q3_K_M": 3.91,
    "Q2_K": 3.35,
}


def estimate_from_config(
    config: dict[str, Any], n_params: int, hw: HardwareInfo, ctx_len: int = 4096
) -> tuple[Estimate, ...]:
    """Estimates for a model known only by its config.json and parameter count (e.g. from the Hub).

    A standard decoder is expanded from the config; if its parameter count is more than 15 % away
    from ``n_params`` the tensor bytes are scaled to ``n_params``; if the config lacks the shapes,
    typical bits per weight are used.
    """
    info = synthetic_info(config)
    n_layers = (info.n_layers if info else _cfg_int(config, "num_hidden_layers", "n_layer")) or 0
    vocab = _cfg_int(config, "vocab_size") or 0
    out = []
    for preset in PRESETS:
        if info is not None:
            e = estimate_preset(info, preset, hw, ctx_len)
            scale = n_params / info.parameters if info.parameters and n_params else 1.0
            if abs(scale - 1.0) <= 0.15:
                out.append(e)
                continue
            tensor_bytes = int(e.tensor_bytes * scale)
            header = e.header_bytes
        else:
            tensor_bytes = int(n_params * _TYPICAL_BPW[preset] / 8)
            header = HEADER_FIXED_BYTES + vocab * HEADER_BYTES_PER_TOKEN
        out.append(
            _make_estimate(
                preset,
                tensor_bytes=tensor_bytes,
                header=header,
                n_weights=n_params,
                config=config,
                n_layers=n_layers,
                hw=hw,
                ctx_len=ctx_len,
            )
        )
    return tuple(out)
