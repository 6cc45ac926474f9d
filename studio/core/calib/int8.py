"""LLM.int8() analysis: outlier feature dimensions per layer and the INT8 matmul error with and without them.

For each decoder layer and each linear in it, on a sample of the calibration activations X and the
layer's real weight W: the reference Y = X Wᵀ; INT8 vector-wise quantization (per-row absmax of X,
per-output-channel absmax of W, both to [-127, 127], integer products summed exactly); and the
mixed-precision decomposition of LLM.int8() where the outlier feature dimensions of X (and the
matching columns of W) stay in FP16 and only the rest goes through INT8. The error is
‖Ŷ − Y‖ / ‖Y‖. Outliers are channels whose absmax over all calibration tokens reaches 3×, 6× or 10×
the input's mean magnitude, or the paper's |x| ≥ 6.

``Int8Analysis`` is a runner consumer; give it the ``ActivationCollector`` of the same run and put
the collector first, so each layer's statistics are complete when the layer is analysed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from studio.core.calib.analysis import FeatureRule, outlier_features
from studio.core.calib.runner import Consumer, LayerView, LinearSite, RunSpec

DEFAULT_RULES = (FeatureRule.k_mean(3), FeatureRule.k_mean(6), FeatureRule.k_mean(10), FeatureRule.llm_int8())


def int8_matmul(x: Any, w: Any) -> Any:
    """X Wᵀ through LLM.int8()'s vector-wise INT8 quantization (float64 in, float64 out; torch tensors)."""
    import torch

    sx = x.abs().amax(dim=1, keepdim=True) / 127.0
    sw = w.abs().amax(dim=1, keepdim=True) / 127.0
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    sw = torch.where(sw > 0, sw, torch.ones_like(sw))
    xq = torch.clamp(torch.round(x / sx), -127, 127)
    wq = torch.clamp(torch.round(w / sw), -127, 127)
    return (xq @ wq.T) * sx * sw.T


def mixed_matmul(x: Any, w: Any, keep: Any) -> Any:
    """LLM.int8()'s decomposition: columns ``keep`` (bool mask) in FP16, the rest in INT8."""
    import torch

    out = torch.zeros((x.shape[0], w.shape[0]), dtype=torch.float64, device=x.device)
    rest = ~keep
    if bool(rest.any()):
        out += int8_matmul(x[:, rest], w[:, rest])
    if bool(keep.any()):
        out += x[:, keep].half().double() @ w[:, keep].half().double().T
    return out


@dataclass(frozen=True)
class Int8Row:
    """One linear under one outlier rule."""

    layer: int
    site: str
    rule: str
    threshold: float
    n_features: int  # outlier feature dimensions of its input
    n_cols: int
    err_int8: float  # relative error of plain INT8
    err_mixed: float  # relative error with the outlier dimensions in FP16


@dataclass(frozen=True)
class Int8LayerSummary:
    """One decoder layer under one rule: features flagged in its hidden-size inputs, errors over all its linears."""

    layer: int
    rule: str
    n_features: int
    err_int8: float
    err_mixed: float


@dataclass(frozen=True)
class Int8Report:
    """The analysis of every layer, and how many calibration tokens it used per linear."""

    rows: tuple[Int8Row, ...]
    layers: tuple[Int8LayerSummary, ...]
    sample_tokens: int


class Int8Analysis(Consumer):
    """Runner consumer that analyses each layer while its weights are on the device."""

    def __init__(
        self, collector: Any, *, rules: Sequence[FeatureRule] = DEFAULT_RULES, sample_tokens: int = 512
    ) -> None:
        self.collector = collector
        self.rules = tuple(rules)
        self.sample_tokens = int(sample_tokens)
        self._samples: dict[str, list[Any]] = {}
        self._rows: list[Int8Row] = []
        self._layers: list[Int8LayerSummary] = []
        self._hidden = 0
        self._taken = 0

    def start(self, spec: RunSpec) -> None:
        """Reset."""
        self._samples.clear()
        self._rows.clear()
        self._layers.clear()
        self._hidden = spec.hidden
        self._taken = 0

    def observe(self, site: LinearSite, x: Any, chunk: int, expert: int = 0) -> None:
        """Keep the first ``sample_tokens`` rows entering each linear (copied to the CPU in float64)."""
        if site.kind == "experts":
            return
        got = self._samples.setdefault(site.name, [])
        have = sum(int(a.shape[0]) for a in got)
        if have < self.sample_tokens:
            got.append(x[: self.sample_tokens - have].detach().to("cpu").double())

    def layer_collected(self, view: LayerView) -> None:
        """Analyse the layer's linears with their real weights."""
        import torch

        per_rule: dict[str, list[float]] = {r.label(): [0.0, 0.0, 0.0] for r in self.rules}
        feats: dict[str, set[int]] = {r.label(): set() for r in self.rules}
        for site in view.sites:
            parts = self._samples.pop(site.name, None)
            stats = self.collector.stats_of(site.name)
            if not parts or stats is None:
                continue
            x = torch.cat(parts)
            self._taken = max(self._taken, int(x.shape[0]))
            w = view.weight(site).detach().to("cpu").double()
            if site.kind == "conv1d":
                w = w.T
            y = x @ w.T
            ref = float((y * y).sum())
            if ref <= 0:
                continue
            d8 = float(((int8_matmul(x, w) - y) ** 2).sum())
            for rule in self.rules:
                idx = outlier_features(stats, rule)
                keep = torch.zeros(stats.n_cols, dtype=torch.bool)
                keep[torch.as_tensor(idx, dtype=torch.long)] = True
                dm = float(((mixed_matmul(x, w, keep) - y) ** 2).sum())
                lab = rule.label()
                self._rows.append(
                    Int8Row(
                        view.index,
                        site.name,
                        lab,
                        rule.threshold(stats),
                        int(idx.size),
                        stats.n_cols,
                        (d8 / ref) ** 0.5,
                        (dm / ref) ** 0.5,
                    )
                )
                acc = per_rule[lab]
                acc[0] += ref
                acc[1] += d8
                acc[2] += dm
                if stats.n_cols == self._hidden:
                    feats[lab].update(int(i) for i in idx)
        for rule in self.rules:
            lab = rule.label()
            ref, d8, dm = per_rule[lab]
            if ref > 0:
                self._layers.append(
                    Int8LayerSummary(view.index, lab, len(feats[lab]), (d8 / ref) ** 0.5, (dm / ref) ** 0.5)
                )

    def report(self) -> Int8Report:
        """Everything analysed so far."""
        return Int8Report(tuple(self._rows), tuple(self._layers), self._taken)


__all__ = [
    "DEFAULT_RULES",
    "Int8Analysis",
    "Int8LayerSummary",
    "Int8Report",
    "Int8Row",
    "int8_matmul",
    "mixed_matmul",
]
