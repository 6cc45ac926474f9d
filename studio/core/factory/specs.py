"""The tiny-model factory's architectures: what each one is (tokenizer kind, tying, GQA, experts), its errors and its record."""

from __future__ import annotations

from dataclasses import dataclass

from studio.core.errors import StudioError

ARCHITECTURES: tuple[str, ...] = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "phi3",
    "gpt2",
    "bert",
    # exported through llama.cpp's converter (studio.core.gguf.llama_converter)
    "gemma3_text",
    "qwen3_moe",
    "mixtral",
    "olmo2",
    "granite",
    "smollm3",
)
"""Architectures ``make_tiny_model`` can build."""


FACTORY_INFO_NAME = "quant_studio_factory.json"
"""Side file in every factory checkpoint that records the arguments and planted outliers."""


DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")


class FactoryError(StudioError):
    """The tiny-model factory was asked for something it cannot build."""


@dataclass(frozen=True)
class FactoryInfo:
    """What ``make_tiny_model`` built: its arguments and the planted outlier channels."""

    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab_size: int
    seed: int
    dtype: str
    shards: int
    outlier_channels: tuple[int, ...] = ()
    outlier_factors: tuple[float, ...] = ()
    outlier_tensors: tuple[str, ...] = ()
    outlier_norms: tuple[str, ...] = ()


@dataclass(frozen=True)
class _ArchSpec:
    model_type: str
    tokenizer: str  # "spm", "bpe-qwen", "bpe-gpt2", "wordpiece"
    gated: bool
    tie: bool
    gqa: bool
    offset_norm: bool  # Gemma's RMSNorm multiplies by (1 + weight)
    causal: bool = True
    experts: int = 0  # mixture of experts: experts per layer (0: a dense MLP)
    pre_norm: bool = True  # False: norms follow the attention/MLP (OLMo 2), so no outliers are planted


_SPECS: dict[str, _ArchSpec] = {
    "llama": _ArchSpec("llama", "spm", gated=True, tie=False, gqa=True, offset_norm=False),
    "mistral": _ArchSpec("mistral", "spm", gated=True, tie=False, gqa=True, offset_norm=False),
    "qwen2": _ArchSpec("qwen2", "bpe-qwen", gated=True, tie=True, gqa=True, offset_norm=False),
    "qwen3": _ArchSpec("qwen3", "bpe-qwen", gated=True, tie=True, gqa=True, offset_norm=False),
    "gemma": _ArchSpec("gemma", "spm-gemma", gated=True, tie=True, gqa=True, offset_norm=True),
    "gemma2": _ArchSpec("gemma2", "spm-gemma", gated=True, tie=True, gqa=True, offset_norm=True),
    "phi3": _ArchSpec("phi3", "spm-phi3", gated=True, tie=False, gqa=True, offset_norm=False),
    "gpt2": _ArchSpec("gpt2", "bpe-gpt2", gated=False, tie=True, gqa=False, offset_norm=False),
    "bert": _ArchSpec("bert", "wordpiece", gated=False, tie=True, gqa=False, offset_norm=False, causal=False),
    "gemma3_text": _ArchSpec("gemma3_text", "spm-gemma", gated=True, tie=True, gqa=True, offset_norm=True),
    "qwen3_moe": _ArchSpec(
        "qwen3_moe", "bpe-qwen", gated=True, tie=False, gqa=True, offset_norm=False, experts=4
    ),
    # eight experts, as Mixtral has: llama.cpp's presets treat 8-expert models specially
    "mixtral": _ArchSpec("mixtral", "spm", gated=True, tie=False, gqa=True, offset_norm=False, experts=8),
    "olmo2": _ArchSpec(
        "olmo2", "bpe-gpt2", gated=True, tie=False, gqa=True, offset_norm=False, pre_norm=False
    ),
    "granite": _ArchSpec("granite", "bpe-gpt2", gated=True, tie=True, gqa=True, offset_norm=False),
    "smollm3": _ArchSpec("smollm3", "bpe-qwen", gated=True, tie=True, gqa=True, offset_norm=False),
}


# Hyper-parameters the newer architectures need beyond the common ones (tiny, but not trivial:
# Granite's multipliers and Gemma 3's sliding window are far from their neutral values, so a
# conversion that dropped them would change the logits).
_GRANITE_MULTIPLIERS = dict(
    embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0
)


GEMMA3_SLIDING_WINDOW = 32
"""Sliding window of the tiny Gemma 3 models (short, so test prompts reach past it)."""


def _spec(arch: str) -> _ArchSpec:
    try:
        return _SPECS[arch]
    except KeyError:
        raise FactoryError(
            f"The tiny-model factory cannot build architecture {arch!r}.",
            hint=f"Choose one of {', '.join(ARCHITECTURES)}.",
        ) from None
