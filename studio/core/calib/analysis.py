"""What the activation views show, as plain functions over ``InputStats`` / ``ActivationStats``.

* ``channel_profile``: per input channel, activation absmax / rms next to the weight's per-input-channel
  absmax (one channel axis), with outlier features marked by |x| ≥ 6 (LLM.int8()) and by k × median.
* ``activation_histogram``: the log-binned |x| histogram of one linear's input.
* ``awq_saliency``: which input channels matter, weight column norm × activation norm.
* ``smoothquant``: migration factors s_j = max|X_j|^α / max|W_j|^(1−α) and the ranges after migration.
* ``layer_outlier_counts`` / ``top_outlier_features``: outlier features per layer for the overview.
* ``weight_columns``: per-input-channel absmax and L2 norm of a weight, streamed from the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from studio.core.calib.accumulators import InputStats, hist_edges
from studio.core.errors import CalibrationError
from studio.core.stats.tensor_stats import is_transposed, row_reader


class FeatureRuleKind(str, Enum):
    """How the outlier-feature threshold is set."""

    ABS = "abs"  # |x| ≥ value (LLM.int8() uses 6)
    K_MEDIAN = "k_median"  # channel absmax > value × median of the channels' absmax
    K_MEAN = "k_mean"  # channel absmax ≥ value × mean |x| over all elements (LLM.int8() analysis)


@dataclass(frozen=True)
class FeatureRule:
    """A rule that marks input channels (feature dimensions) as outliers from their activation absmax."""

    kind: FeatureRuleKind = FeatureRuleKind.ABS
    value: float = 6.0

    @classmethod
    def llm_int8(cls) -> FeatureRule:
        """|x| ≥ 6, the outlier threshold of LLM.int8()."""
        return cls(FeatureRuleKind.ABS, 6.0)

    @classmethod
    def k_median(cls, k: float = 5.0) -> FeatureRule:
        """absmax above k × the median channel absmax."""
        return cls(FeatureRuleKind.K_MEDIAN, float(k))

    @classmethod
    def k_mean(cls, k: float) -> FeatureRule:
        """absmax at least k × the mean magnitude of the input."""
        return cls(FeatureRuleKind.K_MEAN, float(k))

    def threshold(self, stats: InputStats) -> float:
        """The magnitude from which a channel of ``stats`` is an outlier."""
        if self.kind is FeatureRuleKind.ABS:
            return float(self.value)
        if self.kind is FeatureRuleKind.K_MEAN:
            return float(self.value) * stats.mean_magnitude
        am = stats.channel_absmax
        return float(self.value) * float(np.median(am)) if am.size else float("inf")

    def mask(self, stats: InputStats) -> np.ndarray:
        """Boolean mask over the input channels."""
        am = stats.channel_absmax
        t = self.threshold(stats)
        return am > t if self.kind is FeatureRuleKind.K_MEDIAN else am >= t

    def label(self) -> str:
        """Short text for a legend or a table."""
        if self.kind is FeatureRuleKind.ABS:
            return f"|x| ≥ {self.value:g}"
        if self.kind is FeatureRuleKind.K_MEAN:
            return f"≥ {self.value:g} × mean |x|"
        return f"> {self.value:g} × median"


def outlier_features(stats: InputStats, rule: FeatureRule | None = None) -> np.ndarray:
    """Indices of the input channels of ``stats`` that ``rule`` (default |x| ≥ 6) marks as outliers."""
    return np.flatnonzero((rule or FeatureRule.llm_int8()).mask(stats))


# ------------------------------------------------------------------------------------------ profile


@dataclass(frozen=True, eq=False)
class ChannelProfile:
    """One linear's input channels on one axis: what the activations do and what the weight holds."""

    name: str
    act_absmax: np.ndarray  # float32 (n,)
    act_rms: np.ndarray  # float64 (n,)
    act_mean_abs: np.ndarray  # float64 (n,)
    weight_absmax: np.ndarray | None  # float32 (n,): the weight's absmax per input channel
    abs_threshold: float
    kmedian_threshold: float
    outliers_abs: np.ndarray  # channel indices with absmax ≥ abs_threshold
    outliers_kmedian: np.ndarray  # channel indices with absmax > k × median


def channel_profile(
    stats: InputStats,
    weight_absmax_in: Any = None,
    *,
    name: str = "",
    abs_threshold: float = 6.0,
    k: float = 5.0,
) -> ChannelProfile:
    """Activation and weight per input channel; ``weight_absmax_in`` is e.g. ``TensorStats.absmax_in``."""
    w = None
    if weight_absmax_in is not None:
        w = np.asarray(weight_absmax_in, dtype=np.float32).reshape(-1)
        if w.size != stats.n_cols:
            raise CalibrationError(
                f"The weight {name or ''} has {w.size} input channels; its activations have {stats.n_cols}."
            )
    r_abs = FeatureRule(FeatureRuleKind.ABS, abs_threshold)
    r_med = FeatureRule.k_median(k)
    return ChannelProfile(
        name,
        stats.channel_absmax,
        stats.rms,
        stats.mean_abs,
        w,
        abs_threshold,
        r_med.threshold(stats),
        outlier_features(stats, r_abs),
        outlier_features(stats, r_med),
    )


@dataclass(frozen=True, eq=False)
class ActivationHistogram:
    """Counts of |x| in log2 bins (eight per octave); ``edges`` are |x| values, one more than ``counts``.

    The first bin is [0, 2^-24) (zeros included), the last [2^16, inf): plot bins 1..n-2 on a log axis.
    """

    edges: np.ndarray
    counts: np.ndarray

    @property
    def total(self) -> int:
        """Elements counted."""
        return int(self.counts.sum())

    def log_counts(self) -> np.ndarray:
        """``log10(1 + counts)`` for plotting."""
        return np.log10(1.0 + self.counts.astype(np.float64))

    def share_above(self, t: float) -> float:
        """Share of elements with |x| above ``t`` (to within one bin)."""
        if self.total == 0:
            return 0.0
        i = int(np.searchsorted(self.edges, t, side="right")) - 1
        if i < 0:
            return 1.0
        return float(self.counts[i + 1 :].sum()) / self.total


def activation_histogram(stats: InputStats) -> ActivationHistogram:
    """The |x| histogram of one linear's input."""
    return ActivationHistogram(hist_edges(), stats.hist)


# ------------------------------------------------------------------------------------------ weights


@dataclass(frozen=True, eq=False)
class WeightColumns:
    """Per input channel of a weight: absmax and L2 norm over its output channels."""

    name: str
    absmax: np.ndarray  # float32 (n_in,)
    norm: np.ndarray  # float64 (n_in,)


def weight_columns(checkpoint: Any, name: str, *, chunk_rows: int = 4096) -> WeightColumns:
    """Stream the weight ``name`` of an opened checkpoint and reduce it per input channel."""
    info = checkpoint.info.tensor(name)
    if len(info.shape) != 2:
        raise CalibrationError(f"{name} is not a matrix (shape {tuple(info.shape)}).")
    rows, cols = int(info.shape[0]), int(info.shape[1])
    read = row_reader(checkpoint, name)
    transposed = is_transposed(checkpoint, name)  # GPT-2 Conv1D: stored rows are input channels
    if transposed:
        amax = np.zeros(rows, dtype=np.float32)
        sq = np.zeros(rows, dtype=np.float64)
        for a in range(0, rows, chunk_rows):
            x = np.asarray(read(a, min(rows, a + chunk_rows)), dtype=np.float32)
            amax[a : a + x.shape[0]] = np.abs(x).max(axis=1)
            sq[a : a + x.shape[0]] = (x.astype(np.float64) ** 2).sum(axis=1)
    else:
        amax = np.zeros(cols, dtype=np.float32)
        sq = np.zeros(cols, dtype=np.float64)
        for a in range(0, rows, chunk_rows):
            x = np.asarray(read(a, min(rows, a + chunk_rows)), dtype=np.float32)
            np.maximum(amax, np.abs(x).max(axis=0), out=amax)
            sq += (x.astype(np.float64) ** 2).sum(axis=0)
    return WeightColumns(name, amax, np.sqrt(sq))


# ------------------------------------------------------------------------------------------ AWQ


@dataclass(frozen=True, eq=False)
class Saliency:
    """AWQ's view of a linear: the salience of each input channel, weight column norm × activation rms."""

    name: str
    per_channel: np.ndarray  # float64 (n,)
    weight_norm: np.ndarray
    act_rms: np.ndarray

    @property
    def order(self) -> np.ndarray:
        """Channels from most to least salient."""
        return np.argsort(-self.per_channel, kind="stable")

    def top(self, share: float = 0.01) -> np.ndarray:
        """The most salient ``share`` of the channels (at least one)."""
        n = max(1, int(round(share * self.per_channel.size)))
        return self.order[:n]

    def top_mass(self, share: float = 0.01) -> float:
        """The part of the total salience held by the top ``share`` of the channels."""
        total = float(self.per_channel.sum())
        return float(self.per_channel[self.top(share)].sum()) / total if total > 0 else 0.0


def awq_saliency(weight_norm: Any, stats: InputStats, *, name: str = "") -> Saliency:
    """Salience per input channel from the weight's column norms and the activations' rms."""
    w = np.asarray(getattr(weight_norm, "norm", weight_norm), dtype=np.float64).reshape(-1)
    if w.size != stats.n_cols:
        raise CalibrationError(
            f"The weight {name} has {w.size} input channels; its activations have {stats.n_cols}."
        )
    rms = stats.rms
    return Saliency(name, w * rms, w, rms)


# ------------------------------------------------------------------------------------------ SmoothQuant


@dataclass(frozen=True, eq=False)
class SmoothQuantResult:
    """Migration factors for one α and the per-channel ranges before and after migrating them."""

    alpha: float
    scales: np.ndarray  # s_j
    act_before: np.ndarray  # max |X_j|
    act_after: np.ndarray  # max |X_j| / s_j
    weight_before: np.ndarray  # max |W_j|
    weight_after: np.ndarray  # max |W_j| · s_j

    @staticmethod
    def _spread(a: np.ndarray) -> float:
        med = float(np.median(a)) if a.size else 0.0
        return float(a.max()) / med if med > 0 else float("inf")

    @property
    def act_spread(self) -> tuple[float, float]:
        """(before, after) of max / median channel range of the activations: what INT8 per-tensor scales waste."""
        return self._spread(self.act_before), self._spread(self.act_after)

    @property
    def weight_spread(self) -> tuple[float, float]:
        """(before, after) of max / median channel range of the weight."""
        return self._spread(self.weight_before), self._spread(self.weight_after)


def smoothquant(
    act_absmax: Any, weight_absmax_in: Any, alpha: float = 0.5, *, eps: float = 1e-5
) -> SmoothQuantResult:
    """s_j = max|X_j|^α / max|W_j|^(1−α) (clamped at ``eps``; 1 where a channel is dead)."""
    if not 0.0 <= alpha <= 1.0:
        raise CalibrationError(f"SmoothQuant's α must lie in [0, 1], not {alpha}.")
    a = np.asarray(getattr(act_absmax, "channel_absmax", act_absmax), dtype=np.float64).reshape(-1)
    w = np.asarray(weight_absmax_in, dtype=np.float64).reshape(-1)
    if a.size != w.size:
        raise CalibrationError(
            f"SmoothQuant needs one weight range per activation channel ({w.size} vs {a.size})."
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(a, alpha) / np.power(w, 1.0 - alpha)
    dead = (a <= 0) | (w <= 0) | ~np.isfinite(s)
    s = np.where(dead, 1.0, np.maximum(s, eps))
    return SmoothQuantResult(float(alpha), s, a, a / s, w, w * s)


# ------------------------------------------------------------------------------------------ overview


@dataclass(frozen=True)
class LayerOutliers:
    """Outlier features of one decoder layer: hidden-size channels any of its linears' inputs flag."""

    layer: int
    n_features: int
    channels: tuple[int, ...]
    max_absmax: float
    by_site: tuple[tuple[str, int], ...]  # (site name, outlier channels in its input)


def _hidden_size(stats: Any) -> int:
    return int(stats.hidden[0].absmax.size) if stats.hidden else 0


def layer_outlier_counts(stats: Any, rule: FeatureRule | None = None) -> tuple[LayerOutliers, ...]:
    """Per decoder layer, the outlier features (``rule``, default |x| ≥ 6) of its inputs."""
    rule = rule or FeatureRule.llm_int8()
    hidden = _hidden_size(stats)
    out = []
    for layer in sorted({s.layer for s in stats.sites if s.layer is not None}):
        chans: set[int] = set()
        peak = 0.0
        by_site = []
        for s in stats.layer_sites(layer):
            st = stats.inputs[s.name]
            idx = outlier_features(st, rule)
            by_site.append((s.name, int(idx.size)))
            if st.n_cols == hidden:
                chans.update(int(i) for i in idx)
            peak = max(peak, float(st.channel_absmax.max()) if st.n_cols else 0.0)
        out.append(LayerOutliers(layer, len(chans), tuple(sorted(chans)), peak, tuple(by_site)))
    return tuple(out)


@dataclass(frozen=True)
class OutlierFeature:
    """One outlier channel of one linear's input."""

    layer: int | None
    site: str
    channel: int
    absmax: float
    rms: float
    ratio: float  # absmax over the median channel absmax of that input


def top_outlier_features(
    stats: Any, rule: FeatureRule | None = None, limit: int = 20
) -> tuple[OutlierFeature, ...]:
    """The largest outlier channels over the whole model, one row per (input, channel); inputs shared by
    several linears (q/k/v) are listed once."""
    rule = rule or FeatureRule.llm_int8()
    rows = []
    seen: set[int] = set()
    for s in stats.sites:
        st = stats.inputs[s.name]
        if id(st) in seen:
            continue
        seen.add(id(st))
        am = st.channel_absmax
        med = float(np.median(am)) if am.size else 0.0
        rms = st.rms
        for c in outlier_features(st, rule):
            rows.append(
                OutlierFeature(
                    s.layer,
                    s.name,
                    int(c),
                    float(am[c]),
                    float(rms[c]),
                    float(am[c]) / med if med > 0 else float("inf"),
                )
            )
    rows.sort(key=lambda r: -r.absmax)
    return tuple(rows[:limit])


__all__ = [
    "ActivationHistogram",
    "ChannelProfile",
    "FeatureRule",
    "FeatureRuleKind",
    "LayerOutliers",
    "OutlierFeature",
    "Saliency",
    "SmoothQuantResult",
    "WeightColumns",
    "activation_histogram",
    "awq_saliency",
    "channel_profile",
    "layer_outlier_counts",
    "outlier_features",
    "smoothquant",
    "top_outlier_features",
    "weight_columns",
]
