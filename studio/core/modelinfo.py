"""Typed description of an opened checkpoint: its tensors, their roles and layers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


class Role(str, Enum):
    """What a tensor does in the network, independent of the architecture's naming."""

    TOKEN_EMBD = "token_embd"
    POS_EMBD = "pos_embd"
    TYPE_EMBD = "type_embd"
    ATTN_Q = "attn_q"
    ATTN_K = "attn_k"
    ATTN_V = "attn_v"
    ATTN_QKV = "attn_qkv"
    ATTN_OUT = "attn_output"
    FFN_GATE = "ffn_gate"
    FFN_UP = "ffn_up"
    FFN_GATE_UP = "ffn_gate_up"
    FFN_DOWN = "ffn_down"
    # mixture of experts: the router, and the expert weights (one 3-D tensor per layer in GGUF,
    # one 2-D tensor per expert in most checkpoints)
    FFN_ROUTER = "ffn_gate_inp"
    FFN_GATE_EXPS = "ffn_gate_exps"
    FFN_UP_EXPS = "ffn_up_exps"
    FFN_GATE_UP_EXPS = "ffn_gate_up_exps"
    FFN_DOWN_EXPS = "ffn_down_exps"
    NORM = "norm"
    OUTPUT = "output"
    OTHER = "other"
    UNKNOWN = "unknown"


class CheckpointFormat(str, Enum):
    """How the weights are stored on disk."""

    SAFETENSORS = "safetensors"
    PYTORCH = "pytorch"
    GGUF = "gguf"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint, known from the file header alone (no data read)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors spelling for HF checkpoints ("F32", "BF16", ...), GGML type name for GGUF
    nbytes: int
    file: Path
    role: Role = Role.UNKNOWN
    layer: int | None = None
    # True for a 2-D weight stored (in_features, out_features) instead of nn.Linear's (out, in):
    # GPT-2's Conv1D layers. Exporters must transpose it before writing GGUF.
    transposed: bool = False

    @property
    def n_elements(self) -> int:
        """Number of elements (1 for a 0-d scalar)."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelInfo:
    """What we know about a checkpoint without reading any tensor data."""

    path: Path
    format: CheckpointFormat
    architecture: str  # e.g. "LlamaForCausalLM"; "unknown" when the config does not say
    model_type: str  # config.json's model_type, e.g. "llama"
    config: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    n_layers: int
    warnings: tuple[str, ...] = field(default=())
    # what pure functions of this info derived from it, by name (``gguf.layout.layout``): the window's
    # estimates asked for the GGUF layout 57 times while a 32-layer model opened (170 ms of a worker
    # holding the GIL); not copied by ``dataclasses.replace``, so a changed info derives its own
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def parameters(self) -> int:
        """Total number of elements over all tensors."""
        return sum(t.n_elements for t in self.tensors)

    @property
    def weight_bytes(self) -> int:
        """Total bytes of tensor data as stored."""
        return sum(t.nbytes for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called ``name``; KeyError if there is none."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


ROTATION_CONFIG_KEY = "_quant_studio_rotation"
"""Where a rotated view's config carries its ``quantize.rotation.*`` metadata (no HF config uses it;
``studio.core.model.rotate``): the layers below the model see from it that the values are rotated."""


def rotation_config(info: ModelInfo) -> dict[str, Any]:
    """The ``quantize.rotation.*`` keys a rotated view's config carries (empty for a model as it is)."""
    meta = info.config.get(ROTATION_CONFIG_KEY)
    return dict(meta) if isinstance(meta, dict) else {}


def config_int(cfg: dict[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` that ``cfg`` holds as a positive int (bools are not ints here); None if none."""
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def experts_of(config: dict[str, Any], params: Any = None) -> tuple[int, int]:
    """(experts per layer, experts used per token) of a mixture-of-experts model; (0, 0) if dense."""
    params = params or {}
    n = params.get("expert_count") or config_int(
        config, "num_local_experts", "num_experts", "n_routed_experts"
    )
    used = params.get("expert_used_count") or config_int(
        config, "num_experts_per_tok", "num_experts_per_token", "top_k_experts"
    )
    return (int(n), int(used or 0)) if n and int(n) > 1 else (0, 0)
