"""What folding a rotation into the weights does to a matrix's input channels: the absmax of every
input channel before and after (``studio.core.model.rotate``), and the histogram of those absmaxes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from studio.core.errors import StudioError
from studio.core.model.rotate import RotatedCheckpoint, Rotation


@dataclass(frozen=True)
class RotationEffect:
    """Per-input-channel absmax of one matrix unrotated (``before``) and rotated (``after``), and
    their histograms over shared log10 bins (``edges``)."""

    name: str
    before: np.ndarray
    after: np.ndarray
    edges: np.ndarray  # log10(absmax) bin edges
    hist_before: np.ndarray
    hist_after: np.ndarray

    @staticmethod
    def spread(values: np.ndarray) -> float:
        """Largest channel absmax over the median channel's: how far the worst outlier stands out."""
        med = float(np.median(values))
        return float(values.max()) / med if med > 0 else float("inf")

    def channel(self, index: int) -> tuple[float, float]:
        """(before, after) absmax of input channel ``index``."""
        return float(self.before[index]), float(self.after[index])

    @property
    def worst(self) -> int:
        """The input channel with the largest absmax before the rotation (the outlier it spreads out)."""
        return int(np.argmax(self.before))

    def channel_note(self, index: int) -> str:
        """``channel N: absmax before → after`` ("" when ``index`` is not an input channel)."""
        if not 0 <= index < len(self.before):
            return ""
        b, a = self.channel(index)
        return f"channel {index}: absmax {b:.3g} → {a:.3g}"

    def sentence(self, index: int | None = None) -> str:
        """One line for the window: the outlier spread before and after, and ``index``'s absmax (without
        one: the channel that stood out most before)."""
        text = (
            f"Rotated: the largest input channel is {self.spread(self.before):.1f}× the median before, "
            f"{self.spread(self.after):.1f}× after"
        )
        note = self.channel_note(self.worst if index is None else index)
        return text + (f"; {note}" if note else "") + "."

    def curves(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bin edges in absmax, log10(1 + count) before, after): the two histograms as the window draws them,
        on one absmax axis (log-spaced bins) so the outlier's bin and where its mass went sit side by side."""
        return 10.0**self.edges, np.log10(1.0 + self.hist_before), np.log10(1.0 + self.hist_after)


def rotation_effect(view: RotatedCheckpoint, name: str, *, bins: int = 48) -> RotationEffect:
    """The input channels of matrix ``name`` before and after ``view``'s rotation."""
    inner = view.inner
    if name not in inner or len(inner.info.tensor(name).shape) != 2:
        raise StudioError(f"{name} is not a matrix of this model, so rotation has no input channels to show.")
    axis = 1 if inner.info.tensor(name).transposed else 0  # GPT-2's Conv1D stores (in, out)
    before = np.abs(inner.read(name)).max(axis=axis)
    after = np.abs(view.read(name)).max(axis=axis)
    both = np.log10(np.maximum(np.concatenate([before, after]), 1e-30))
    edges = np.linspace(float(both.min()), float(both.max()) + 1e-9, bins + 1)
    hb, _ = np.histogram(np.log10(np.maximum(before, 1e-30)), edges)
    ha, _ = np.histogram(np.log10(np.maximum(after, 1e-30)), edges)
    return RotationEffect(name, before, after, edges, hb, ha)


def default_rotation() -> Rotation:
    """The rotation the Inspector shows (seed 0, R1 and R2), as ``export --rotate`` writes it."""
    return Rotation()
