"""Architecture adapters: the role and layer index of every tensor name, per model family.

Roles follow llama.cpp's GGUF naming: a bias gets the role of its module (``q_proj.bias`` is
``ATTN_Q``, like ``blk.N.attn_q.bias`` in GGUF), so callers that care about matrices should also look
at ``len(shape)``. For a known architecture a name no rule claims is ``OTHER`` (a buffer, a pooler);
for an unknown architecture only the obvious roles (embeddings, norms, output head) are given and the
rest stay ``UNKNOWN``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from studio.core.gguf.converter_bundle import bundle_dir, find_bundle, known_architectures
from studio.core.gguf.converter_roles import role_table
from studio.core.modelinfo import Role

# `.layers.N.` (Llama & co.), `.h.N.` (GPT-2), `.layer.N.` (BERT), `.blocks.N.`; `blk.N.` is GGUF.
_DIGITS_RE = re.compile(r"\.\d+\.")
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block|blk)\.(\d+)(?:\.|$)")

_Rules = tuple[tuple[re.Pattern[str], Role], ...]


def _rules(*pairs: tuple[str, Role]) -> _Rules:
    return tuple((re.compile(p), r) for p, r in pairs)


def parse_layer(name: str) -> int | None:
    """The block index in a tensor name (``model.layers.3.mlp...`` -> 3), or None outside blocks."""
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


# Llama, Mistral, Qwen2/3, Gemma/2/3, Phi-3 share the `model.layers.N.{self_attn,mlp}.*` layout.
_DECODER_RULES = _rules(
    (r"(?:^|\.)embed_tokens\.", Role.TOKEN_EMBD),
    (r"(?:^|\.)lm_head\.", Role.OUTPUT),
    (r"self_attn\.qkv_proj\.", Role.ATTN_QKV),
    (r"self_attn\.q_proj\.", Role.ATTN_Q),
    (r"self_attn\.k_proj\.", Role.ATTN_K),
    (r"self_attn\.v_proj\.", Role.ATTN_V),
    (r"self_attn\.o_proj\.", Role.ATTN_OUT),
    (r"self_attn\.[qk]_norm\.", Role.NORM),
    # mixture of experts (Qwen-MoE `mlp.experts.N.*_proj`, Mixtral `block_sparse_moe.experts.N.w1..3`,
    # or experts already fused per layer into 3-D `experts.gate_up_proj`/`experts.down_proj`)
    (r"(?:mlp|block_sparse_moe)\.gate\.(?:weight|bias)$|shared_expert_gate\.", Role.FFN_ROUTER),
    (r"\.experts\.\d+\.(?:gate_proj|w1)\.", Role.FFN_GATE_EXPS),
    (r"\.experts\.\d+\.(?:up_proj|w3)\.", Role.FFN_UP_EXPS),
    (r"\.experts\.\d+\.(?:down_proj|w2)\.", Role.FFN_DOWN_EXPS),
    (r"\.experts\.gate_up_proj", Role.FFN_GATE_UP_EXPS),
    (r"\.experts\.down_proj", Role.FFN_DOWN_EXPS),
    (r"shared_experts?\.gate_proj\.", Role.FFN_GATE),
    (r"shared_experts?\.up_proj\.", Role.FFN_UP),
    (r"shared_experts?\.down_proj\.", Role.FFN_DOWN),
    (r"mlp\.gate_up_proj\.", Role.FFN_GATE_UP),
    (r"mlp\.gate_proj\.", Role.FFN_GATE),
    (r"mlp\.up_proj\.", Role.FFN_UP),
    (r"mlp\.down_proj\.", Role.FFN_DOWN),
    (r"(?:layernorm|_norm)\.weight$|(?:layernorm|_norm)\.bias$", Role.NORM),
    (r"(?:^|\.)norm\.(?:weight|bias)$", Role.NORM),
)

# GPT-2: transformer.{wte,wpe,h.N.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj},ln_f}.
# Its Linear layers are Conv1D modules whose weights are stored (in, out), transposed vs nn.Linear.
_GPT2_RULES = _rules(
    (r"(?:^|\.)wte\.", Role.TOKEN_EMBD),
    (r"(?:^|\.)wpe\.", Role.POS_EMBD),
    (r"(?:^|\.)lm_head\.", Role.OUTPUT),
    (r"attn\.c_attn\.", Role.ATTN_QKV),
    (r"attn\.c_proj\.", Role.ATTN_OUT),
    (r"mlp\.c_fc\.", Role.FFN_UP),
    (r"mlp\.c_proj\.", Role.FFN_DOWN),
    (r"(?:^|\.)ln_(?:1|2|f)\.", Role.NORM),
)
_GPT2_CONV1D = re.compile(r"(?:attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")

# BERT (with or without the `bert.` prefix, as sentence-transformers saves it).
_BERT_RULES = _rules(
    (r"embeddings\.word_embeddings\.", Role.TOKEN_EMBD),
    (r"embeddings\.position_embeddings\.", Role.POS_EMBD),
    (r"embeddings\.token_type_embeddings\.", Role.TYPE_EMBD),
    (r"attention\.self\.query\.", Role.ATTN_Q),
    (r"attention\.self\.key\.", Role.ATTN_K),
    (r"attention\.self\.value\.", Role.ATTN_V),
    (r"attention\.output\.dense\.", Role.ATTN_OUT),
    (r"intermediate\.dense\.", Role.FFN_UP),
    (r"layer\.\d+\.output\.dense\.", Role.FFN_DOWN),
    (r"LayerNorm\.", Role.NORM),
    (r"cls\.predictions\.decoder\.", Role.OUTPUT),
)

# GGUF names as llama.cpp writes them (blk.N.attn_q.weight, ...).
_GGUF_RULES = _rules(
    (r"^token_embd\.", Role.TOKEN_EMBD),
    (r"^position_embd\.|^pos_embd\.", Role.POS_EMBD),
    (r"^token_types\.", Role.TYPE_EMBD),
    (r"norm\.(?:weight|bias)$", Role.NORM),
    (r"^output\.", Role.OUTPUT),
    (r"\.attn_qkv\.", Role.ATTN_QKV),
    (r"\.attn_q\.", Role.ATTN_Q),
    (r"\.attn_k\.", Role.ATTN_K),
    (r"\.attn_v\.", Role.ATTN_V),
    (r"\.attn_output\.", Role.ATTN_OUT),
    (r"\.ffn_gate_inp(?:_shexp)?\.", Role.FFN_ROUTER),
    (r"\.ffn_gate_up_exps\.", Role.FFN_GATE_UP_EXPS),
    (r"\.ffn_gate_exps\.", Role.FFN_GATE_EXPS),
    (r"\.ffn_up_exps\.", Role.FFN_UP_EXPS),
    (r"\.ffn_down_exps\.", Role.FFN_DOWN_EXPS),
    (r"\.ffn_gate_up\.", Role.FFN_GATE_UP),
    (r"\.ffn_gate\.", Role.FFN_GATE),
    (r"\.ffn_up\.", Role.FFN_UP),
    (r"\.ffn_down\.", Role.FFN_DOWN),
)

# What any architecture's names make obvious.
_OBVIOUS_RULES = _rules(
    (r"(?:^|\.)(?:embed_tokens|wte|word_embeddings|tok_embeddings|embed_in)\.", Role.TOKEN_EMBD),
    (r"(?:^|\.)(?:wpe|position_embeddings)\.", Role.POS_EMBD),
    (r"(?:^|\.)(?:lm_head|embed_out)\.", Role.OUTPUT),
    (r"(?:norm|ln_\w+|LayerNorm)\.(?:weight|bias)$", Role.NORM),
)


@dataclass(frozen=True)
class Adapter:
    """Naming rules of one architecture family."""

    family: str
    rules: _Rules
    known: bool = True  # False: unmatched names are UNKNOWN rather than OTHER
    conv1d: re.Pattern[str] | None = None  # weights stored (in, out) instead of nn.Linear's (out, in)

    # Memo of layer-free name -> role; names differ mostly by layer number, so this stays small.
    _memo: dict[str, Role] = field(default_factory=dict, compare=False, repr=False)

    def role(self, name: str) -> Role:
        """The role of the tensor called ``name``."""
        key = _DIGITS_RE.sub(".0.", name)
        role = self._memo.get(key)
        if role is None:
            role = next((r for pattern, r in self.rules if pattern.search(key)), None)
            role = role or (Role.OTHER if self.known else Role.UNKNOWN)
            if len(self._memo) < 65536:  # bounded even for pathological names
                self._memo[key] = role
        return role

    def is_transposed(self, name: str) -> bool:
        """Whether this 2-D weight is stored (in_features, out_features), as GPT-2's Conv1D does."""
        return bool(self.conv1d and self.conv1d.search(name))


@dataclass(frozen=True)
class MappedAdapter(Adapter):
    """Roles looked up in a table of layer-free names (``model.layers.0.x.weight`` → role), as built
    from llama.cpp's converter's tensor map for architectures without rules of their own."""

    table: Mapping[str, Role] = field(default_factory=dict)

    def role(self, name: str) -> Role:
        """The role of the tensor called ``name``; a name the table does not list gets the obvious
        roles (embeddings, norms, head) or ``UNKNOWN``."""
        key = _EXPERT_RE.sub(".experts.", _DIGITS_RE.sub(".0.", name))
        for k in (key, key.rsplit(".", 1)[0]):
            if k in self.table:
                return self.table[k]
        return next((r for pattern, r in _OBVIOUS_RULES if pattern.search(key)), Role.UNKNOWN)


# `.experts.0.` → `.experts.`: the converter's map names the merged expert tensor, not each expert
_EXPERT_RE = re.compile(r"\.experts\.0\.")

DECODER = Adapter("decoder", _DECODER_RULES)
GPT2 = Adapter("gpt2", _GPT2_RULES, conv1d=_GPT2_CONV1D)
BERT = Adapter("bert", _BERT_RULES)
GGUF = Adapter("gguf", _GGUF_RULES)
GENERIC = Adapter("unknown", _OBVIOUS_RULES, known=False)

# config.json model_type -> adapter.
_BY_MODEL_TYPE: dict[str, Adapter] = {
    **dict.fromkeys(
        (
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "gemma",
            "gemma2",
            "gemma3_text",
            "phi3",
            "granite",
            "olmo",
            "olmo2",
            "olmo3",
            "smollm3",
            "qwen2_moe",
            "qwen3_moe",
            "mixtral",
            "olmoe",
            "granitemoe",
            "phimoe",
        ),
        DECODER,
    ),
    "gpt2": GPT2,
    "bert": BERT,
    "gguf": GGUF,
}

# Architecture class name prefixes, for configs that lack model_type.
_BY_ARCH_PREFIX = (
    ("Llama", DECODER),
    ("Mistral", DECODER),
    ("Qwen2", DECODER),
    ("Qwen3", DECODER),
    ("Gemma", DECODER),
    ("Phi3", DECODER),
    ("GPT2", GPT2),
    ("Bert", BERT),
)

KNOWN_MODEL_TYPES = frozenset(_BY_MODEL_TYPE) - {"gguf"}


def converter_adapter(hf_arch: str) -> Any:
    """An adapter whose roles come from llama.cpp's converter's tensor map, for an architecture only
    the converter knows; None when it does not know ``hf_arch`` (or is not installed)."""
    return _converter_adapter(hf_arch, str(bundle_dir()))


@functools.lru_cache(maxsize=64)  # asked once per tensor by some callers; the bundle does not change
def _converter_adapter(hf_arch: str, where: str) -> Any:
    if hf_arch not in known_architectures():
        return None
    b, _ = find_bundle()
    assert b is not None
    return MappedAdapter("llama.cpp converter", (), table=role_table(str(b.path)))


def adapter_for(model_type: str, architecture: str = "") -> Adapter:
    """The adapter for a config's ``model_type`` (or architecture class name); for an architecture
    only llama.cpp's converter knows, one from its tensor map; GENERIC if neither knows it."""
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    for prefix, adapter in _BY_ARCH_PREFIX:
        if architecture.startswith(prefix):
            return adapter
    if architecture and architecture != "unknown":
        mapped = converter_adapter(architecture)
        if mapped is not None:
            return mapped
    return GENERIC


def gguf_adapter() -> Adapter:
    """The adapter for tensor names inside a GGUF file."""
    return GGUF
