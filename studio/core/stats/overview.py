"""One statistic per tensor over a whole model, so the layers that are hard to quantize stand out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from studio.core.jobs import JobContext, null_context
from studio.core.modelinfo import Role, TensorInfo
from studio.core.stats.cache import StatsCache
from studio.core.stats.tensor_stats import OutlierRule, TensorStats, tensor_stats

__all__ = ["ModelOverview", "OverviewMetric", "TensorSummary", "model_overview", "summarize"]


class OverviewMetric(str, Enum):
    """A per-tensor number the overview chart can show."""

    OUTLIER_SHARE = "outlier_share"  # share of elements above the outlier rule
    OUTLIER_CHANNELS = "outlier_channels"  # share of input channels whose absmax is an outlier
    KURTOSIS = "kurtosis"  # excess kurtosis of the values
    SCALE_RATIO = "scale_ratio"  # max / median absmax over output channels

    @property
    def label(self) -> str:
        """Axis label."""
        return {
            OverviewMetric.OUTLIER_SHARE: "outlier share (elements)",
            OverviewMetric.OUTLIER_CHANNELS: "outlier share (input channels)",
            OverviewMetric.KURTOSIS: "excess kurtosis",
            OverviewMetric.SCALE_RATIO: "max / median channel scale",
        }[self]


@dataclass(frozen=True)
class TensorSummary:
    """The overview numbers of one tensor."""

    name: str
    role: Role
    layer: int | None
    shape: tuple[int, ...]
    outlier_share: float
    outlier_channels: float
    kurtosis: float
    scale_ratio: float
    absmax: float
    std: float

    def value(self, metric: OverviewMetric) -> float:
        """The number ``metric`` names."""
        return float(getattr(self, OverviewMetric(metric).value))


def summarize(stats: TensorStats, info: TensorInfo, rule: OutlierRule) -> TensorSummary:
    """The overview numbers of one tensor from its statistics."""
    cols = stats.absmax_in
    return TensorSummary(
        name=info.name,
        role=info.role,
        layer=info.layer,
        shape=tuple(info.shape),
        outlier_share=stats.element_outlier_share(rule),
        outlier_channels=float(rule.mask(cols).mean()) if cols.size else 0.0,
        kurtosis=stats.kurtosis,
        scale_ratio=stats.scale_ratio("out"),
        absmax=stats.absmax,
        std=stats.std,
    )


@dataclass(frozen=True)
class ModelOverview:
    """Summaries of the model's weight matrices, in plot order (by layer, then role, then name)."""

    rule: OutlierRule
    tensors: tuple[TensorSummary, ...]

    def values(self, metric: OverviewMetric) -> np.ndarray:
        """``metric`` of every tensor, as float64 (non-finite values become NaN)."""
        v = np.array([t.value(metric) for t in self.tensors], dtype=np.float64)
        v[~np.isfinite(v)] = np.nan
        return v

    def names(self) -> list[str]:
        """Tensor names in plot order."""
        return [t.name for t in self.tensors]

    def worst(self, metric: OverviewMetric, k: int = 5) -> list[TensorSummary]:
        """The ``k`` tensors with the largest ``metric``."""
        v = self.values(metric)
        order = np.argsort(np.nan_to_num(v, nan=-math.inf))[::-1]
        return [self.tensors[i] for i in order[:k]]


def _plot_order(t: TensorInfo) -> tuple[int, str, str]:
    # Layer-less tensors (embeddings before, output head after) bracket the blocks.
    if t.layer is not None:
        layer = t.layer
    else:
        layer = 1 << 30 if t.role in (Role.OUTPUT,) else -1
    return layer, t.role.value, t.name


def overview_tensors(info: Any) -> list[TensorInfo]:
    """The tensors an overview covers: every matrix (2-D or more) of the model, in plot order."""
    return sorted((t for t in info.tensors if len(t.shape) >= 2 and t.n_elements > 0), key=_plot_order)


def model_overview(
    checkpoint: Any,
    *,
    rule: OutlierRule | None = None,
    cache: StatsCache | None = None,
    ctx: JobContext | None = None,
) -> ModelOverview:
    """Summaries of every weight matrix of an opened checkpoint (statistics come from ``cache`` when there)."""
    ctx = ctx or null_context()
    rule = rule or OutlierRule()
    todo = overview_tensors(checkpoint.info)
    total = sum(t.n_elements for t in todo) or 1
    done = 0
    out: list[TensorSummary] = []
    for t in todo:
        ctx.check_cancelled()
        # the overview reports per tensor; cancelling it stops the tensor in flight
        stats = tensor_stats(checkpoint, t.name, cache=cache, ctx=ctx.muted())
        out.append(summarize(stats, t, rule))
        done += t.n_elements
        ctx.report(done, total, t.name)
    return ModelOverview(rule, tuple(out))
