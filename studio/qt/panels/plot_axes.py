"""Plot axes in the studio's units: file sizes in decimal MB/GB (as the Hub shows them) for data kept in
bytes, and a second axis of bits per weight for the same bytes."""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg

__all__ = ["BpwAxis", "SizeAxis", "decimals", "nice_step", "thin_log_ticks"]


def decimals(step: float) -> int:
    """How many decimals a tick step needs (0.25 → 2, 2.5 → 1, 10 → 0)."""
    text = f"{step:.6g}"
    return 0 if "." not in text or "e" in text else len(text.split(".")[1])


def nice_step(span: float, most: int = 8) -> float:
    """The smallest of 1, 2, 2.5 and 5 times a power of ten that cuts ``span`` into at most ``most`` steps."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / most
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= raw)


class SizeAxis(pg.AxisItem):
    """An axis over bytes labelled in MB, or GB from 2 GB on (decimal units, as everywhere in the studio)."""

    def __init__(self, orientation: str = "bottom", what: str = "file size", **kw: Any) -> None:
        super().__init__(orientation, **kw)
        self.what = what
        self.enableAutoSIPrefix(False)
        self.set_extent(0)

    def set_extent(self, largest: float) -> None:
        """Choose MB or GB for data up to ``largest`` bytes (and name the unit in the label)."""
        self.div, unit = (1e9, "GB") if largest >= 2e9 else (1e6, "MB")
        self.setLabel(f"{self.what} ({unit})")

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:  # noqa: N802
        """Round MB/GB values."""
        lo, hi = minVal / self.div, maxVal / self.div
        most = max(2, int(size / 70))  # a label needs about 70 px
        step = nice_step(hi - lo, most)
        first = math.ceil(lo / step) * step
        n = int((hi - first) / step + 1e-9) + 1
        return [(step * self.div, [(first + i * step) * self.div for i in range(max(0, n))])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802
        """Values in the axis's unit with as many decimals as the step needs."""
        places = decimals(spacing / self.div)
        return [f"{v / self.div:.{places}f}" for v in values]


class BpwAxis(pg.AxisItem):
    """A second axis over the same bytes in bits per weight: ``bpw = offset + slope × bytes``."""

    def __init__(self, orientation: str = "top", **kw: Any) -> None:
        super().__init__(orientation, **kw)
        self.enableAutoSIPrefix(False)
        self.setLabel("bits per weight")
        self.offset, self.slope = 0.0, 0.0

    def set_map(self, points: list[tuple[float, float]]) -> None:
        """Fit the line through (bytes, bpw) ``points`` (their ends); no ticks with fewer than two."""
        pts = sorted(points)
        if len(pts) < 2 or pts[-1][0] == pts[0][0]:
            self.offset, self.slope = 0.0, 0.0
        else:
            (x0, y0), (x1, y1) = pts[0], pts[-1]
            self.slope = (y1 - y0) / (x1 - x0)
            self.offset = y0 - self.slope * x0
        self.picture = None  # pyqtgraph redraws the ticks on the next paint
        self.update()

    def bpw(self, nbytes: float) -> float:
        """Bits per weight at ``nbytes`` on the main axis."""
        return self.offset + self.slope * nbytes

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:  # noqa: N802
        """Round bits per weight, placed where their bytes are."""
        if self.slope <= 0:
            return []
        lo, hi = self.bpw(minVal), self.bpw(maxVal)
        step = nice_step(hi - lo, max(2, int(size / 60)))
        first = math.ceil(lo / step) * step
        n = int((hi - first) / step + 1e-9) + 1
        return [
            (step / self.slope, [(first + i * step - self.offset) / self.slope for i in range(max(0, n))])
        ]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802
        """Bits per weight with the step's decimals."""
        places = min(3, decimals(spacing * self.slope))
        return [f"{self.bpw(v):.{places}f}" for v in values]


def thin_log_ticks(axis: pg.AxisItem) -> None:
    """Ticks of a log ``axis`` at 1, 2 and 5 times each power of ten only: pyqtgraph labels every
    minor tick (0.3, 0.4 … 0.9), and in a plot a few hundred pixels tall those labels overlap."""

    def log_ticks(minVal: float, maxVal: float, size: float, stdTicks: Any) -> list[tuple[Any, list[float]]]:  # noqa: N803
        lo, hi = math.floor(minVal), math.ceil(maxVal)
        marks = [e + math.log10(k) for e in range(lo, hi + 1) for k in (1, 2, 5)]
        inside = [m for m in marks if minVal <= m <= maxVal]
        if len(inside) > max(2, int(size / 25)):  # too many for the height: the decades only
            inside = [m for m in inside if abs(m - round(m)) < 1e-9]
        return [(None, inside)]

    axis.logTickValues = log_ticks  # type: ignore[method-assign]
