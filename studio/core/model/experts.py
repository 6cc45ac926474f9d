"""Mixture-of-experts structure of a checkpoint, as llama.cpp lays it out in GGUF.

llama.cpp merges each layer's experts into one 3-D tensor per projection (``blk.N.ffn_gate_exps``,
``ffn_up_exps``, ``ffn_down_exps``: experts × rows × columns), while most checkpoints store one 2-D
tensor per expert (``model.layers.N.mlp.experts.E.gate_proj.weight``). Calibration (counting the
tokens routed to each expert, one importance vector per expert) and export meet here:
``expert_layout`` says which checkpoint tensor is expert E of which merged tensor, and
``merge_expert_imatrix`` turns per-expert statistics into what llama-imatrix stores for a merged
tensor (``in_sum2`` of n_experts × n_columns and ``counts`` per expert) and what the exporter takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError, StudioError
from studio.core.gguf.layout import layout
from studio.core.modelinfo import ModelInfo, Role, experts_of

EXPERT_ROLES = frozenset({Role.FFN_GATE_EXPS, Role.FFN_UP_EXPS, Role.FFN_GATE_UP_EXPS, Role.FFN_DOWN_EXPS})
"""Roles of expert weights (merged 3-D GGUF tensors and the per-expert checkpoint tensors)."""


@dataclass(frozen=True)
class ExpertTensor:
    """One merged GGUF expert tensor and the checkpoint tensors it is made of."""

    gguf_name: str  # e.g. "blk.3.ffn_down_exps.weight" (also its plan key and imatrix name)
    role: Role
    layer: int
    sources: tuple[str, ...]  # checkpoint tensor of expert e at index e (empty if stored merged)
    n_experts: int
    rows: int  # rows per expert (output features)
    n_per_row: int  # columns (input features): the length of one expert's importance vector


@dataclass(frozen=True)
class ExpertLayout:
    """Experts per layer, experts used per token, the merged tensors and each layer's router."""

    n_experts: int
    n_used: int
    tensors: tuple[ExpertTensor, ...]
    routers: Mapping[int, str]  # layer → checkpoint name of its router (ffn_gate_inp) weight
    _by_source: Mapping[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    def expert_of(self, name: str) -> tuple[ExpertTensor, int] | None:
        """(merged tensor, expert index) of a checkpoint tensor, or None if it is not an expert."""
        hit = self._by_source.get(name)
        return (self.tensors[hit[0]], hit[1]) if hit is not None else None

    def in_layer(self, layer: int) -> tuple[ExpertTensor, ...]:
        """The merged expert tensors of one layer."""
        return tuple(t for t in self.tensors if t.layer == layer)


def expert_layout(info: ModelInfo) -> ExpertLayout | None:
    """The expert structure of ``info`` (None for a dense model or one the exporter cannot map)."""
    try:
        lay = layout(info)
    except StudioError:
        return None
    n_exp, n_used = experts_of(info.config, lay.params)
    merged = [tm for tm in lay.tensors if tm.n_experts > 1 and tm.role in EXPERT_ROLES]
    if not merged:
        return None
    tensors: list[ExpertTensor] = []
    by_source: dict[str, tuple[int, int]] = {}
    for tm in merged:
        sources = tm.sources if len(tm.sources) == tm.n_experts else ()
        for e, s in enumerate(sources):
            by_source[s] = (len(tensors), e)
        assert tm.role is not None and tm.layer is not None
        tensors.append(
            ExpertTensor(tm.gguf_name, tm.role, tm.layer, sources, tm.n_experts, tm.shape[1], tm.shape[2])
        )
    routers = {
        tm.layer: (tm.sources[0] if len(tm.sources) == 1 else tm.hf_name)
        for tm in lay.tensors
        if tm.role is Role.FFN_ROUTER
        and tm.layer is not None
        and tm.gguf_name.endswith("ffn_gate_inp.weight")
    }
    return ExpertLayout(
        n_exp or merged[0].n_experts,
        n_used,
        tuple(tensors),
        MappingProxyType(routers),
        MappingProxyType(by_source),
    )


@dataclass(frozen=True)
class ExpertImatrix:
    """llama-imatrix's entry for one merged expert tensor."""

    in_sum2: np.ndarray  # (n_experts, n_per_row): Σx² of the inputs each expert saw
    counts: np.ndarray  # (n_experts,): tokens routed to each expert

    def mean(self) -> np.ndarray:
        """Σx²/count per expert ((n_experts, n_per_row)); experts that saw no token get ones, so
        they are quantized as without an importance matrix rather than with zero weights."""
        out = np.ones_like(self.in_sum2, dtype=np.float32)
        seen = self.counts > 0
        out[seen] = self.in_sum2[seen] / self.counts[seen, None]
        return out


def merge_expert_imatrix(
    experts: ExpertLayout, per_expert: Mapping[str, tuple[Any, int]]
) -> dict[str, ExpertImatrix]:
    """Per-expert statistics keyed by checkpoint tensor name (Σx² vector, tokens routed) → one
    ``ExpertImatrix`` per merged GGUF tensor; ``{name: entry.mean()}`` is what ``export_gguf`` takes
    as ``imatrix`` for those tensors."""
    out: dict[str, ExpertImatrix] = {}
    for t in experts.tensors:
        if not t.sources:
            continue
        sums = np.zeros((t.n_experts, t.n_per_row), dtype=np.float32)
        counts = np.zeros(t.n_experts, dtype=np.float32)
        found = False
        for e, name in enumerate(t.sources):
            if name not in per_expert:
                continue
            v, n = per_expert[name]
            v = np.asarray(v, dtype=np.float32).reshape(-1)
            if v.size != t.n_per_row:
                raise QuantizationError(
                    f"The statistics for {name} have {v.size} values; expert {e} of {t.gguf_name} has "
                    f"{t.n_per_row} input columns."
                )
            sums[e] = v
            counts[e] = float(n)
            found = True
        if found:
            out[t.gguf_name] = ExpertImatrix(sums, counts)
    return out


__all__ = [
    "EXPERT_ROLES",
    "ExpertImatrix",
    "ExpertLayout",
    "ExpertTensor",
    "expert_layout",
    "merge_expert_imatrix",
]
