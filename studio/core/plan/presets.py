"""Presets: llama.cpp's named quantization mixtures (Q4_K_M, Q6_K, ...) as per-tensor qtype choices.

``preset_types`` reproduces the per-tensor decisions of llama.cpp's ``llama_tensor_get_type``
(src/llama-quant.cpp, as vendored in llama-cpp-python 0.3.x) for the architectures we export:
which tensors may be quantized at all, the output/token-embedding rules, the ``use_more_bits``
layers for attn_v/ffn_down, and the fallback for rows whose length the block size does not divide.
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
        Preset("Q4_0", "Q4_0", "legacy 4-bit, fastest to quantize"),
        Preset("Q3_K_L", "Q3_K", "3-bit k-quant, attn_v/ffn_down/attn_output at 5-bit"),
        Preset("Q3_K_M", "Q3_K", "3-bit k-quant, attn_v/ffn_down/attn_output partly 4/5-bit"),
        Preset("Q3_K_S", "Q3_K", "3-bit k-quant, uniform"),
        Preset("Q2_K", "Q2_K", "2-bit k-quant, large quality loss"),
    )
}


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
    if name == "token_embd.weight":
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


def _impl(ctx: _Ctx, new_type: str, name: str, cat: str, n_per_row: int, counters: dict[str, int]) -> str:
    """llama_tensor_get_type_impl for the non-IQ file types."""
    ft = ctx.preset
    if cat == "output" or (ctx.tied and cat == "token_embd"):
        blk = QTYPES[new_type].block_size
        if ctx.arch == "falcon" or n_per_row % blk != 0:
            return "Q8_0"
        return new_type if new_type == "Q8_0" else "Q6_K"
    if cat == "token_embd":
        return new_type
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        i = counters["attn_v"]
        if ft == "Q2_K":
            new_type = "Q4_K" if ctx.n_gqa >= 4 else "Q3_K"
        elif ft == "Q3_K_M":
            new_type = "Q5_K" if i < 2 else "Q4_K"
        elif ft == "Q3_K_L":
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
    if cat == "attn_k":
        return "Q8_0" if ctx.n_expert == 8 else new_type
    if cat == "ffn_down":
        i, n = counters["ffn_down"], ctx.n_layer
        if ctx.n_expert > 1:
            # experts are not consecutive tensors: llama.cpp reads the layer from the name
            m = re.match(r"blk\.(\d+)\.", name)
            if m is None:
                raise QuantizationError(
                    f"Cannot tell the layer of tensor {name} of a mixture-of-experts model."
                )
            i = int(m.group(1))
        if ft == "Q2_K":
            new_type = "Q3_K"
        elif ft == "Q3_K_M":
            new_type = "Q5_K" if i < n // 16 else "Q4_K"
        elif ft == "Q3_K_L":
            new_type = "Q5_K"
        elif ft == "Q4_K_M":
            if _use_more_bits(i, n):
                new_type = "Q6_K"
        elif ft == "Q5_K_M" and _use_more_bits(i, n):
            new_type = "Q6_K"
        elif ft == "Q4_K_S" and i < n // 8:
            new_type = "Q5_K"
        elif ft in ("Q4_0", "Q5_0") and ctx.has_imatrix and i < n // 8:
            # llama.cpp guards the first ffn_down layers when an imatrix is given
            new_type = "Q4_1" if ft == "Q4_0" else "Q5_1"
        counters["ffn_down"] = i + 1
        return new_type
    if cat == "attn_output":
        if ctx.n_expert == 8:
            return "Q5_K" if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M") else new_type
        if ft == "Q2_K":
            return "Q3_K"
        if ft == "Q3_K_M":
            return "Q4_K"
        if ft == "Q3_K_L":
            return "Q5_K"
        return new_type
    if cat in ("ffn_gate", "ffn_up"):
        counters[cat] += 1
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
            wanted = _impl(ctx, new_type, tm.gguf_name, _category(tm.gguf_name), tm.n_per_row, counters)
            if wanted != new_type and wanted == "Q8_0" and tm.n_per_row % QTYPES[new_type].block_size != 0:
                # the output rule's own shape fallback: report it like the others
                fallbacks.append(
                    Fallback(
                        tm.hf_name,
                        tm.gguf_name,
                        "Q6_K",
                        "Q8_0",
                        f"rows of {tm.n_per_row} are not a multiple of {QTYPES[new_type].block_size}",
                    )
                )
            new_type = wanted
            got, why = fallback_type(new_type, tm.n_per_row)
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
