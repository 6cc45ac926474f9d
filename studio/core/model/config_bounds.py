"""Sizes a config claims, checked against the tensors a checkpoint really holds before anything loops.

``config.json`` (or GGUF metadata) is untrusted: ``num_hidden_layers: 10**12`` in a two-layer
checkpoint sent the name map into building 10^12 blocks, and a vocabulary size or an expert count
of that order pads lists or builds meta models just as long. A count is refused, in one sentence,
when it is above a cap no real model reaches *and* the tensors do not back it; a count within the
cap keeps today's meaning (a config may describe fewer layers than a file holds, e.g. MTP layers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from studio.core.errors import CorruptFileError, quote
from studio.core.model.adapters import parse_layer

__all__ = ["MAX_EXPERTS", "MAX_LAYERS", "MAX_VOCAB", "check_config_numbers", "check_gguf_numbers"]

MAX_LAYERS = 1024  # the deepest released LLMs have about 130 blocks
MAX_VOCAB = 1 << 22  # 4,194,304 tokens; the largest vocabularies are about 260k
MAX_EXPERTS = 4096  # the widest mixtures have 256-384 experts
MAX_DIM = 1 << 20  # hidden, intermediate, head sizes

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "block_count")
_VOCAB_KEYS = ("vocab_size", "n_vocab")
_EXPERT_KEYS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_experts_per_tok",
)
_DIM_KEYS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "n_embd",
    "n_head",
    "embedding_length",
    "feed_forward_length",
)


def _configs(config: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield config
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping):
            yield sub


def _ints(config: Mapping[str, Any], keys: tuple[str, ...]) -> Iterable[tuple[str, Any]]:
    for cfg in _configs(config):
        for k in keys:
            v = cfg.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                yield k, v


def _shown(v: Any) -> str:
    if isinstance(v, int) and v.bit_length() >= 64:
        return f"about 2**{v.bit_length()}"
    return f"{v:,}" if isinstance(v, int) else quote(v)


def check_config_numbers(
    config: Mapping[str, Any], tensors: Iterable[Any], where: Any, what: str = "config.json"
) -> None:
    """Refuse a layer, vocabulary, expert or dimension count in ``config`` that no tensor of the
    checkpoint backs and that is beyond any real model (``where`` names the checkpoint)."""
    tensors = list(tensors)
    layers = [t.layer for t in tensors if getattr(t, "layer", None) is not None]
    real_layers = max(layers) + 1 if layers else 0
    biggest_dim = max((max(t.shape) for t in tensors if getattr(t, "shape", None)), default=0)

    def refuse(key: str, v: Any, held: str) -> CorruptFileError:
        return CorruptFileError(
            f"{what} of {where} gives {key} = {_shown(v)}, but its tensors hold {held}; the config is damaged.",
            hint="Re-download the model or fix its config.",
        )

    for key, v in _ints(config, _LAYER_KEYS):
        if v < 0 or (v > MAX_LAYERS and v > real_layers):
            raise refuse(key, v, f"{real_layers} layers")
    for key, v in _ints(config, _VOCAB_KEYS):
        if v < 0 or (v > MAX_VOCAB and v > biggest_dim):
            raise refuse(key, v, f"at most {biggest_dim:,} rows")
    for key, v in _ints(config, _EXPERT_KEYS):
        if v < 0 or v > MAX_EXPERTS:
            raise refuse(key, v, "far fewer experts")
    for key, v in _ints(config, _DIM_KEYS):
        if v < 0 or (v > MAX_DIM and v > biggest_dim):
            raise refuse(key, v, f"at most {biggest_dim:,} values per dimension")


@dataclass(frozen=True)
class _Held:
    layer: int | None
    shape: tuple[int, ...]


def check_gguf_numbers(metadata: Mapping[str, Any], tensors: Iterable[Any], where: Any) -> None:
    """``check_config_numbers`` for GGUF metadata (``<arch>.block_count``, ``.expert_count``, ...)
    and the file's tensors (``name`` and ``shape``)."""
    arch = metadata.get("general.architecture")
    prefix = f"{arch}." if isinstance(arch, str) else "\0"
    flat = {k[len(prefix) :]: v for k, v in metadata.items() if k.startswith(prefix)}
    held = [_Held(parse_layer(t.name), tuple(int(d) for d in t.shape)) for t in tensors]
    check_config_numbers(flat, held, where, "The metadata")
