"""Presets: llama.cpp's named quantization mixtures (Q4_K_M, Q6_K, ...) as per-tensor qtype choices.

``preset_types`` reproduces the per-tensor decisions of llama.cpp's ``llama_tensor_get_type``
(src/llama-quant.cpp, as vendored in llama-cpp-python 0.3.x) for the architectures we export:
which tensors may be quantized at all, the output/token-embedding rules, the ``use_more_bits``
layers for attn_v/ffn_down, the i-quant mixes (IQ2_M, IQ3_M, IQ3_XS, the IQ1/IQ2 group's Q2_K/IQ3_S
tensors), Q2_K_S, MXFP4_MOE's experts-only rule, the choices that change with an importance matrix,
and the fallback for rows whose length the block size does not divide (none for Q1_0: refused).
The decision is taken on the GGUF tensor name (as llama.cpp does) and keyed by the HF name.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from studio.core.errors import QuantizationError
from studio.core.gguf.arch import head_counts, hparam
from studio.core.gguf.layout import layout
from studio.core.modelinfo import ModelInfo
from studio.core.quant.types import QTYPES, fallback_type, ftype_of


@dataclass(frozen=True)
class Preset:
    """A named llama.cpp mixture (a file type such as Q4_K_M): its main qtype and what it is for."""

    name: str
    default_type: str
    description: str

    @property
    def ftype(self) -> int:
        """llama.h's LLAMA_FTYPE_* value of this preset (also written as general.file_type)."""
        return ftype_of(self.name)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("F32", "F32", "full 32-bit floats (reference, largest)"),
        Preset("F16", "F16", "16-bit floats, no quality loss in practice"),
        Preset("BF16", "BF16", "bfloat16, the training format of most models"),
        Preset("Q8_0", "Q8_0", "8-bit, near-lossless"),
        Preset("Q6_K", "Q6_K", "6-bit k-quant, very close to F16"),
        Preset("Q5_K_M", "Q5_K", "5-bit k-quant, attn_v/ffn_down partly 6-bit"),
        Preset("Q5_K_S", "Q5_K", "5-bit k-quant, uniform"),
        Preset("Q5_1", "Q5_1", "legacy 5-bit with offset"),
        Preset("Q5_0", "Q5_0", "legacy 5-bit"),
        Preset("Q4_K_M", "Q4_K", "4-bit k-quant, attn_v/ffn_down partly 6-bit (the usual choice)"),
        Preset("Q4_K_S", "Q4_K", "4-bit k-quant, a few early layers at 5-bit"),
        Preset("Q4_1", "Q4_1", "legacy 4-bit with offset"),
        Preset("IQ4_NL", "IQ4_NL", "4.5-bit non-linear, 32-weight blocks"),
        Preset("Q4_0", "Q4_0", "legacy 4-bit, fastest to quantize"),
        Preset("IQ4_XS", "IQ4_XS", "4.25-bit non-linear i-quant"),
        Preset("Q3_K_L", "Q3_K", "3-bit k-quant, attn_v/ffn_down/attn_output at 5-bit"),
        Preset("Q3_K_M", "Q3_K", "3-bit k-quant, attn_v/ffn_down/attn_output partly 4/5-bit"),
        Preset("IQ3_M", "IQ3_S", "3.66-bit i-quant mix, attn_v/attn_output at 4-bit"),
        Preset("Q3_K_S", "Q3_K", "3-bit k-quant, uniform"),
        Preset("IQ3_S", "IQ3_S", "3.44-bit i-quant"),
        Preset("IQ3_XS", "IQ3_S", "3.3-bit i-quant mix, middle FFN layers at IQ3_XXS"),
        Preset("IQ3_XXS", "IQ3_XXS", "3.06-bit i-quant (needs an importance matrix)"),
        Preset("Q2_K", "Q2_K", "2-bit k-quant, large quality loss"),
        Preset("Q2_K_S", "Q2_K", "2-bit k-quant, fewer 4-bit tensors (needs an importance matrix)"),
        Preset("IQ2_M", "IQ2_S", "2.7-bit i-quant mix (needs an importance matrix)"),
        Preset("IQ2_S", "IQ2_XS", "2.5-bit i-quant mix (needs an importance matrix)"),
        Preset("Q2_0", "Q2_0", "2.25-bit, groups of 64"),
        Preset("IQ2_XS", "IQ2_XS", "2.31-bit i-quant (needs an importance matrix)"),
        Preset("TQ2_0", "TQ2_0", "2.06-bit ternary, for ternary-trained models (BitNet)"),
        Preset("IQ2_XXS", "IQ2_XXS", "2.06-bit i-quant (needs an importance matrix)"),
        Preset("IQ1_M", "IQ1_M", "1.75-bit i-quant, very large loss (needs an importance matrix)"),
        Preset("TQ1_0", "TQ1_0", "1.69-bit ternary, for ternary-trained models (BitNet)"),
        Preset("IQ1_S", "IQ1_S", "1.56-bit i-quant, very large loss (needs an importance matrix)"),
        Preset("Q1_0", "Q1_0", "1.125-bit, groups of 128"),
        Preset("MXFP4_MOE", "MXFP4", "MXFP4 on a mixture-of-experts model's experts, the rest Q8_0"),
    )
}
"""Every preset of the pinned llama-quantize (its QUANT_OPTIONS less the aliases Q3_K/Q4_K/Q5_K and
COPY), roughly from high to low precision."""


@dataclass(frozen=True)
class Fallback:
    """A tensor that could not take the type it was meant to get."""

    tensor: str  # HF name
    gguf_name: str
    wanted: str
    got: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """The fallback as a JSON-ready dict of its fields (as plans and ``export --json`` write it)."""
        return asdict(self)


@dataclass(frozen=True)
class PresetChoice:
    """The per-tensor types of a preset for one model, with the fallbacks that were applied."""

    preset: str
    types: dict[str, str]  # HF tensor name → qtype
    fallbacks: tuple[Fallback, ...]


def allows_quantization(gguf_name: str, ndim: int) -> bool:
    """Whether llama.cpp would quantize this GGUF tensor at all (2-D ``*weight``, not a norm,
    not position/token-type embeddings)."""
    if ndim < 2 or not gguf_name.endswith("weight"):
        return False
    # routers stay F32: ffn_gate_inp by name, and the (1, n) shared-expert gate ffn_gate_inp_shexp,
    # which llama.cpp counts as 1-D (ggml_n_dims ignores the trailing 1)
    if "_norm.weight" in gguf_name or "ffn_gate_inp" in gguf_name:
        return False
    return gguf_name not in ("position_embd.weight", "token_types.weight")


def _category(name: str) -> str:
    # llama.cpp's tensor_get_category: substring tests, in this order
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if key in name:
            return cat
    return "other"


def _use_more_bits(i: int, n: int) -> bool:
    # C integer division and modulo; i - n//8 may be negative, where C's % keeps the sign
    d = i - n // 8
    rem = abs(d) % 3 * (1 if d >= 0 else -1)
    return i < n // 8 or i >= 7 * n // 8 or rem == 2


def _sort_key(name: str) -> tuple[int, str]:
    # llama.cpp iterates tensors ordered by (block number, name); non-block tensors first
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


@dataclass(frozen=True)
class _Ctx:
    arch: str
    preset: str
    n_layer: int
    n_gqa: int
    is_70b: bool
    tied: bool
    n_attention_wv: int
    has_imatrix: bool = False
    n_expert: int = 0  # experts per layer (llama.cpp's hparams.n_expert); 0 for dense models


# llama.cpp's groups of file types that share rules in llama_tensor_get_type_impl
_IQ12 = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})  # the 1–2-bit i-quant mixes
_OUTPUT_Q5K = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_ATTN_OUT_8X = frozenset(
    {
        "Q2_K",
        "IQ3_XS",
        "IQ3_XXS",
        "Q3_K_S",
        "Q3_K_M",
        "IQ4_NL",
        "Q4_K_S",
        "Q4_K_M",
        "IQ3_S",
        "IQ3_M",
        "IQ4_XS",
    }
)


def _layer_of(ctx: _Ctx, name: str, counter: int) -> int:
    """llama.cpp's layer_info: the running count, or for experts (not consecutive) the layer of the name."""
    if ctx.n_expert <= 1:
        return counter
    m = re.match(r"blk\.(\d+)\.", name)
    if m is None:
        raise QuantizationError(f"Cannot tell the layer of tensor {name} of a mixture-of-experts model.")
    return int(m.group(1))


def _impl(
    ctx: _Ctx, new_type: str, name: str, cat: str, shape: tuple[int, ...], counters: dict[str, int]
) -> str:
    """llama_tensor_get_type_impl: the type the preset's rules give one tensor (before the shape fallback)."""
    ft, n_per_row = ctx.preset, shape[-1]
    more_v = ctx.n_gqa >= 4
    if cat == "output" or (ctx.tied and cat == "token_embd"):
        if ft == "MXFP4_MOE" or ctx.arch == "falcon" or n_per_row % QTYPES[new_type].block_size != 0:
            return "Q8_0"
        if ft in _OUTPUT_Q5K:
            return "Q5_K"
        return new_type if new_type == "Q8_0" else "Q6_K"
    if ft == "MXFP4_MOE":
        # the experts (3-D tensors) at MXFP4, every other tensor at Q8_0
        return "MXFP4" if len(shape) == 3 and shape[0] > 1 else "Q8_0"
    if cat == "token_embd":
        if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        if ft in ("TQ1_0", "TQ2_0", "Q2_0"):
            return "Q4_K"
        return new_type
    if ft in _IQ12:
        wide = ft in ("IQ2_S", "IQ2_M")
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            counters["attn_v"] += 1
            if more_v or ctx.n_expert >= 4:
                return "Q4_K"
            return "IQ3_S" if wide else "Q2_K"
        if ctx.n_expert == 8 and cat == "attn_k":
            return "Q4_K"
        if cat == "ffn_down":
            i = counters["ffn_down"]  # this group counts ffn_down tensors, experts or not
            counters["ffn_down"] = i + 1
            if i < ctx.n_layer // 8:
                return "IQ3_S" if wide else "Q2_K"
            return new_type
        if cat == "attn_output":
            if ctx.n_expert == 8:
                return "Q5_K"
            if ft in ("IQ1_S", "IQ1_M"):
                return "IQ2_XXS"
            return "IQ3_S" if wide else new_type
        return new_type
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        i = counters["attn_v"]
        if ft == "Q2_K":
            new_type = "Q4_K" if more_v else "Q3_K"
        elif ft == "Q2_K_S" and more_v:
            new_type = "Q4_K"
        elif ft == "IQ3_XXS":
            new_type = "Q4_K" if more_v else ("IQ3_XXS" if ctx.has_imatrix else "IQ3_S")
        elif ft in ("IQ3_XS", "IQ3_S") and more_v:
            new_type = "Q4_K"
        elif ft == "IQ3_M":
            new_type = "Q4_K"
        elif ft == "Q3_K_M":
            new_type = "Q5_K" if i < 2 else "Q4_K"
        elif ft == "Q3_K_L":
            new_type = "Q5_K"
        elif ft in ("IQ4_NL", "IQ4_XS") and more_v:
            new_type = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, ctx.n_attention_wv):
            new_type = "Q6_K"
        elif ft == "Q4_K_S" and i < 4:
            new_type = "Q5_K"
        if ctx.is_70b and new_type in ("Q3_K", "Q4_K"):
            new_type = "Q5_K"
        if ctx.n_expert == 8:
            new_type = "Q8_0"  # llama.cpp: "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
        counters["attn_v"] = i + 1
        return new_type
    if cat in ("attn_k", "attn_q"):
        if cat == "attn_k" and ctx.n_expert == 8:
            return "Q8_0"
        if ft == "IQ3_XS":
            return "IQ3_XXS"
        if ft == "IQ3_XXS":
            return "IQ2_S"
        return new_type
    if cat == "ffn_down":
        i, n = _layer_of(ctx, name, counters["ffn_down"]), ctx.n_layer
        counters["ffn_down"] += 1
        if ft == "Q2_K":
            new_type = "Q3_K"
        elif ft == "Q2_K_S":
            new_type = "Q4_K" if i < n // 8 else new_type
        elif ft == "IQ3_XXS" and not ctx.has_imatrix:
            new_type = "Q4_K" if i < n // 8 else "Q3_K"
        elif ft == "Q3_K_M":
            new_type = "Q5_K" if i < n // 16 else "Q4_K"
        elif ft == "IQ3_M" and (i < n // 8 or (ctx.n_expert == 8 and _use_more_bits(i, n))):
            new_type = "Q4_K"
        elif ft == "Q3_K_L":
            new_type = "Q5_K"
        elif ft == "Q4_K_M":
            if _use_more_bits(i, n):
                new_type = "Q6_K"
        elif i < n // 8 and ft in ("IQ4_NL", "IQ4_XS") and not ctx.has_imatrix:
            new_type = "Q5_K"
        elif ft == "Q5_K_M" and _use_more_bits(i, n):
            new_type = "Q6_K"
        elif ft == "Q4_K_S" and i < n // 8:
            new_type = "Q5_K"
        elif ft in ("Q4_0", "Q5_0") and ctx.has_imatrix and i < n // 8:
            # llama.cpp guards the first ffn_down layers when an imatrix is given
            new_type = "Q4_1" if ft == "Q4_0" else "Q5_1"
        return new_type
    if cat == "attn_output":
        if ctx.n_expert == 8:
            return "Q5_K" if ft in _ATTN_OUT_8X else new_type
        return {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}.get(
            ft, new_type
        )
    if cat in ("ffn_gate", "ffn_up"):
        i, n = _layer_of(ctx, name, counters[cat]), ctx.n_layer
        counters[cat] += 1
        if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
            return "IQ3_XXS"
    return new_type


def preset_choice(info: ModelInfo, preset: str, *, imatrix: bool = False) -> PresetChoice:
    """Per-tensor qtypes of ``preset`` for ``info`` (keyed by HF name) and the fallbacks;
    ``imatrix``: whether an importance matrix will be used (it changes a few choices)."""
    p = PRESETS.get(preset.upper()) if isinstance(preset, str) else None
    if p is None:
        raise QuantizationError(f"Unknown preset {preset!r}.", hint="Known: " + ", ".join(PRESETS) + ".")
    lay = layout(info)
    n_head, n_kv = head_counts(info.config)
    n_layer = max([t.layer + 1 for t in lay.tensors if t.layer is not None], default=0)
    n_layer = max(n_layer, int(info.n_layers or 0))
    maps = sorted(lay.tensors, key=lambda t: _sort_key(t.gguf_name))
    ctx = _Ctx(
        arch=lay.arch,
        preset=p.name,
        n_layer=n_layer,
        n_gqa=n_head // max(1, n_kv),
        is_70b=lay.arch == "llama" and n_layer == 80 and n_head != n_kv,
        tied=lay.tied_embeddings,
        has_imatrix=imatrix,
        n_attention_wv=sum(1 for t in maps if _category(t.gguf_name) in ("attn_v", "attn_qkv", "attn_kv_b")),
        n_expert=n_experts(info, lay),
    )
    counters = {"attn_v": 0, "ffn_down": 0, "ffn_gate": 0, "ffn_up": 0}
    types: dict[str, str] = {}
    fallbacks: list[Fallback] = []
    for tm in maps:
        if not allows_quantization(tm.gguf_name, len(tm.shape)):
            # 1-D tensors, norms, position/token-type embeddings: F32 as llama.cpp's converter
            types[tm.hf_name] = "F32"
            continue
        new_type = p.default_type
        if not QTYPES[new_type].is_float:
            cat = _category(tm.gguf_name)
            wanted = _impl(ctx, new_type, tm.gguf_name, cat, tm.shape, counters)
            if (
                cat in ("output", "token_embd")
                and wanted != new_type
                and wanted == "Q8_0"
                and tm.n_per_row % QTYPES[new_type].block_size != 0
            ):
                # the output rule's own shape fallback: report it like the others
                fallbacks.append(
                    Fallback(
                        tm.hf_name,
                        tm.gguf_name,
                        "Q5_K" if p.name in _OUTPUT_Q5K else "Q6_K",
                        "Q8_0",
                        f"rows of {tm.n_per_row} are not a multiple of {QTYPES[new_type].block_size}",
                    )
                )
            new_type = wanted
            got, why = fallback_type(new_type, tm.n_per_row)
            if why is not None and QTYPES[new_type].fallback is None and QTYPES[new_type].block_size > 32:
                # tensor_type_fallback defines no fallback for a wide block without a 32-weight twin
                raise QuantizationError(
                    f"llama.cpp's {p.name} cannot write tensor {tm.gguf_name}: its {why}, and llama.cpp "
                    f"has no fallback type for {new_type}.",
                    hint="Choose another preset, or a plan that gives that tensor another type.",
                )
            if why is not None:
                fallbacks.append(Fallback(tm.hf_name, tm.gguf_name, new_type, got, why))
            new_type = got
        types[tm.hf_name] = new_type
    order = {t.name: i for i, t in enumerate(info.tensors)}
    types = dict(sorted(types.items(), key=lambda kv: order.get(kv[0], 0)))
    return PresetChoice(p.name, types, tuple(fallbacks))


def n_experts(info: ModelInfo, lay: object | None = None) -> int:
    """Experts per layer of a mixture-of-experts model (llama.cpp's ``expert_count``), 0 if dense."""
    params = getattr(lay, "params", None) or {}
    n = params.get("expert_count")
    if n is None:
        n = hparam(info.config, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    try:
        return int(n or 0)
    except (TypeError, ValueError):
        return 0


def preset_types(info: ModelInfo, preset: str, *, imatrix: bool = False) -> dict[str, str]:
    """Tensor name → the qtype llama.cpp's ``preset`` would choose for this model.

    Tensors llama.cpp does not write (rotary buffers, a tied lm_head, BERT's pooler) are absent.
    """
    return preset_choice(info, preset, imatrix=imatrix).types
