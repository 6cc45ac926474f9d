"""Hugging Face → GGUF architecture mapping: GGUF arch name, tensor names, shapes and the
transforms llama.cpp expects (Q/K row permutation, Conv1D transpose, Gemma's norm + 1)."""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import gguf
import numpy as np

from studio.core.errors import ExportError
from studio.core.modelinfo import ModelInfo, Role

# config.json model_type → GGUF architecture name (llama.cpp's LLM_ARCH names).
_ARCHES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",  # llama.cpp's converter writes Mistral as the llama architecture
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "phi3": "phi3",
    "gpt2": "gpt2",
    "bert": "bert",
}

# HF tensors that llama.cpp does not use (buffers, heads for other tasks).
_SKIP = re.compile(
    r"(^|\.)rotary_emb\.inv_freq$|(^|\.)position_ids$|^pooler\.|^cls\.|"
    r"\.attn\.bias$|\.attn\.masked_bias$"
)


class Transform(str, Enum):
    """What happens to a tensor's values on the way from HF to GGUF."""

    NONE = "none"
    PERMUTE_Q = "permute_q"  # llama-family rope: HF half-split rows → interleaved pairs
    PERMUTE_K = "permute_k"
    TRANSPOSE = "transpose"  # GPT-2 Conv1D stores (in, out)
    PLUS_ONE = "plus_one"  # Gemma RMSNorm multiplies by (1 + w); llama.cpp by w
    CONVERTER = "converter"  # computed by llama.cpp's converter (studio.core.gguf.llama_converter)


@dataclass(frozen=True)
class TensorMap:
    """One HF tensor as it appears in the GGUF file."""

    hf_name: str
    gguf_name: str
    shape: tuple[int, ...]  # numpy shape of the GGUF tensor (ggml ne reversed)
    transform: Transform
    layer: int | None
    # set by llama.cpp's converter layouts: the role from the GGUF name, and the checkpoint tensors
    # the values come from (several for merged experts, in expert order). ``hf_name`` is then the
    # plan key: the checkpoint name when one tensor maps to one, else the GGUF name.
    role: Role | None = None
    sources: tuple[str, ...] = ()

    @property
    def n_experts(self) -> int:
        """Experts merged in this tensor (its first dimension when 3-D), 0 for ordinary tensors."""
        return self.shape[0] if len(self.shape) == 3 else 0

    @property
    def n_per_row(self) -> int:
        """Length of a row (ggml ne[0]): the dimension quantization blocks run along."""
        return self.shape[-1] if self.shape else 1


@dataclass(frozen=True)
class Layout:
    """Every tensor of a checkpoint mapped to GGUF, in checkpoint order."""

    arch: str
    tensors: tuple[TensorMap, ...]
    skipped: tuple[str, ...]  # HF tensors not written (buffers, unused heads, tied lm_head)
    tied_embeddings: bool  # True when there is no output.weight (llama.cpp reuses token_embd)
    source: str = "studio"  # "studio" (our mapping) or "llama.cpp" (llama.cpp's converter)
    # the converter's ``{arch}.*`` hyper-parameters (expert_count, attention.sliding_window, ...)
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def converted(self) -> bool:
        """Whether llama.cpp's converter makes this layout's tensors."""
        return self.source == "llama.cpp"

    def by_hf(self) -> dict[str, TensorMap]:
        """Mapping from HF name to its TensorMap."""
        return {t.hf_name: t for t in self.tensors}


def gguf_arch(info: ModelInfo) -> str:
    """The GGUF architecture name for a checkpoint; ExportError if unsupported."""
    arch = _ARCHES.get(str(info.model_type).lower())
    if arch is None:
        raise ExportError(
            f"GGUF export does not support model type {info.model_type!r} ({info.path}).",
            hint="Supported: " + ", ".join(sorted(_ARCHES)) + ".",
        )
    return arch


def hparam(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` present in a config (text_config merged in), else ``default``."""
    for k in keys:
        if k in config and config[k] is not None:
            return config[k]
    tc = config.get("text_config")
    if isinstance(tc, dict):
        for k in keys:
            if k in tc and tc[k] is not None:
                return tc[k]
    return default


def head_counts(config: dict[str, Any]) -> tuple[int, int]:
    """(n_head, n_head_kv) from a HF config."""
    n_head = int(hparam(config, "num_attention_heads", "n_head", "n_heads", default=1))
    n_kv = int(hparam(config, "num_key_value_heads", "n_kv_heads", default=n_head))
    return n_head, n_kv


@functools.lru_cache(maxsize=16)  # building one walks every name pattern x block; maps are only read
def _tensor_name_map(arch: str, n_blocks: int) -> Any:
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    return gguf.get_tensor_name_map(arch_enum, n_blocks)


def _normalize(model_type: str, name: str) -> str:
    # BERT checkpoints from BertFor* classes prefix everything with "bert."
    if model_type == "bert" and name.startswith("bert."):
        return name[len("bert.") :]
    return name


def studio_converts(info: ModelInfo) -> bool:
    """Whether the studio's own mapping covers this checkpoint's model type."""
    return str(info.model_type).lower() in _ARCHES


def gguf_layout(info: Any) -> Any:
    """The identity ``Layout`` of a GGUF file: every tensor keeps its name and stored shape."""
    maps = []
    for t in info.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        maps.append(TensorMap(t.name, t.name, tuple(t.shape), Transform.NONE, int(m.group(1)) if m else None))
    arch = str(info.config.get("model_type") or info.model_type)
    names = {t.name for t in info.tensors}
    return Layout(arch, tuple(maps), (), "output.weight" not in names)


def studio_layout(info: ModelInfo) -> Layout:
    """The studio's own mapping of a checkpoint of one of its families (``studio_converts``): every
    tensor's GGUF name, shape and transform; ``layout.layout`` chooses between it and the others."""
    arch = gguf_arch(info)
    mt = str(info.model_type).lower()
    cfg = info.config
    n_blocks = int(info.n_layers or hparam(cfg, "num_hidden_layers", "n_layer", default=0))
    tmap = _tensor_name_map(arch, n_blocks)
    names = {t.name for t in info.tensors}
    tie_cfg = bool(hparam(cfg, "tie_word_embeddings", default=mt in ("gemma", "gemma2", "gpt2")))
    out: list[TensorMap] = []
    skipped: list[str] = []
    for t in info.tensors:
        name = _normalize(mt, t.name)
        if _SKIP.search(name):
            skipped.append(t.name)
            continue
        if name == "lm_head.weight":
            # Gemma never uses lm_head; others drop it when tied to the embeddings (GPT-2's config
            # usually says nothing, which means tied; a rotated GPT-2 has its own head)
            if mt in ("gemma", "gemma2") or (tie_cfg and _has_embed(names)):
                skipped.append(t.name)
                continue
        if mt == "bert" and name.startswith("lm_head"):
            skipped.append(t.name)
            continue
        gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None and (len(t.shape) == 0 or 0 in t.shape):
            # an unknown 0-d scalar or empty tensor carries nothing llama.cpp could use
            # (tests/core/export/test_export_faults.py::test_empty_and_scalar_tensors_are_skipped_with_a_note)
            skipped.append(t.name)
            continue
        if gname is None:
            raise ExportError(
                f"Tensor {t.name!r} of {info.path} has no GGUF name for architecture {arch}.",
                hint="The checkpoint may be a variant this exporter does not support.",
            )
        shape = tuple(int(s) for s in t.shape)
        transform = Transform.NONE
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            transform = Transform.PERMUTE_Q
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            transform = Transform.PERMUTE_K
        elif arch == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            transform = Transform.TRANSPOSE
            shape = shape[::-1]
        elif arch in ("gemma", "gemma2") and name.endswith("norm.weight"):
            transform = Transform.PLUS_ONE
        m = re.match(r"blk\.(\d+)\.", gname)
        out.append(TensorMap(t.name, gname, shape, transform, int(m.group(1)) if m else None))
    gnames = [t.gguf_name for t in out]
    dup = {n for n, k in collections.Counter(gnames).items() if k > 1}
    if dup:
        raise ExportError(f"Several tensors of {info.path} map to the same GGUF tensor {sorted(dup)[0]!r}.")
    tied = "output.weight" not in gnames
    return Layout(arch, tuple(out), tuple(skipped), tied)


def _has_embed(names: set[str]) -> bool:
    return any(n.endswith(("embed_tokens.weight", "wte.weight", "word_embeddings.weight")) for n in names)


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder Q/K rows from HF's rotate-half layout to the interleaved pairs llama.cpp's
    llama rope expects (per head: rows [0..d/2) and [d/2..d) become interleaved)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def apply_transform(x: np.ndarray, tm: TensorMap, config: dict[str, Any]) -> np.ndarray:
    """The GGUF values of one tensor from its HF values (float32 in, float32 out)."""
    if tm.transform is Transform.NONE:
        return x
    if tm.transform is Transform.TRANSPOSE:
        return np.ascontiguousarray(x.T)
    if tm.transform is Transform.PLUS_ONE:
        return x + np.float32(1.0)
    n_head, n_kv = head_counts(config)
    heads = n_head if tm.transform is Transform.PERMUTE_Q else n_kv
    return np.ascontiguousarray(permute_rows(x, heads))
