"""The activation views of one linear: AWQ saliency and SmoothQuant migration, over a calibration run.

Both draw per-input-channel curves from ``studio.core.calib.analysis`` (``awq_saliency``,
``smoothquant``) over the channel's activation statistics (``InputStats``) and the weight's columns
(``WeightColumns``, streamed from the checkpoint in the Calibrate panel's job). Computing them is
O(channels), so the α slider redraws on the GUI thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from studio.core.calib.analysis import Saliency, SmoothQuantResult, awq_saliency, smoothquant
from studio.qt import widgets
from studio.qt.panels.plot_axes import thin_log_ticks
from studio.qt.placeholder import set_placeholder
from studio.qt.theme import plot_colors, style_plot

__all__ = ["SaliencyView", "SmoothQuantView"]

_NO_DATA = "Calibrate the model, then select a linear weight to see its input channels."
_PLACEHOLDER = "Run Calibrate to see activations"


def _channel_plot(parent: QWidget, title: str, left: str) -> pg.PlotWidget:
    w = pg.PlotWidget(parent)
    item = w.getPlotItem()
    item.setTitle(title)
    item.setLabel("bottom", "input channel")
    item.setLabel("left", left)
    item.setLogMode(y=True)  # channels span orders of magnitude: outliers stand out on a log axis
    thin_log_ticks(item.getAxis("left"))  # 1-2-5 labels: the minor ticks' labels would overlap
    item.setDownsampling(auto=True, mode="peak")
    item.setClipToView(True)
    item.addLegend(offset=(-10, 10))
    return w


def _positive(a: np.ndarray) -> np.ndarray:
    # a log axis cannot show 0 (dead channels): draw them at the smallest positive value
    a = np.asarray(a, dtype=np.float64)
    pos = a[a > 0]
    return np.where(a > 0, a, pos.min() if pos.size else 1.0)


class _ChannelView(QWidget):
    """What both views share: a row of controls, a caption, and channel plots that follow the theme."""

    shown = Signal(object)  # the Saliency or SmoothQuantResult just drawn
    label: QLabel

    def _arrange(self, top: QHBoxLayout, *plots: pg.PlotWidget) -> None:
        self._plots = plots
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.label)
        for plot in plots:
            lay.addWidget(plot, 1)

    def _show(self, caption: str, result: Any) -> None:
        self.label.setText(caption)
        self.shown.emit(result)

    def recolor(self, dark: bool) -> None:
        """Follow the theme."""
        for plot in self._plots:
            style_plot(plot, dark)
        self._color_curves(plot_colors(dark))

    def _color_curves(self, c: dict[str, Any]) -> None:  # pragma: no cover - each view colours its own
        raise NotImplementedError


class SaliencyView(_ChannelView):
    """AWQ's salience per input channel, ‖W[:, j]‖ × rms(x_j), with the most salient share marked."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.saliency: Saliency | None = None
        self.share_spin = widgets.spin_box(
            self,
            0.1,
            50.0,
            1.0,
            decimals=1,
            suffix=" % of channels",
            tip="The most salient channels to mark (AWQ protects about 1 %)",
        )
        self.share_spin.valueChanged.connect(self._redraw)
        self.label = QLabel(_NO_DATA, self)
        self.label.setWordWrap(True)
        self.plot = _channel_plot(self, "AWQ saliency: weight column norm × activation rms", "salience")
        pi = self.plot.getPlotItem()
        self.curve = pi.plot([], [], name="salience")
        # a data item, not a bare scatter: it follows the plot's log axis
        self.top = pi.plot([], [], pen=None, symbol="o", symbolSize=7, symbolPen=None, name="most salient")
        top = QHBoxLayout()
        top.addWidget(QLabel("Mark the top", self))
        top.addWidget(self.share_spin)
        top.addStretch(1)
        self._arrange(top, self.plot)
        set_placeholder(self.plot, _PLACEHOLDER)

    @property
    def share(self) -> float:
        """The share of channels marked (0..1)."""
        return float(self.share_spin.value()) / 100.0

    def set_data(self, stats: Any, columns: Any, name: str = "") -> None:
        """Show the salience of weight ``name`` from its ``InputStats`` and ``WeightColumns`` (None clears)."""
        if stats is None or columns is None:
            self.saliency = None
            self.curve.setData([], [])
            self.top.setData([], [])
            self.label.setText(_NO_DATA)
            set_placeholder(self.plot, _PLACEHOLDER)
            return
        set_placeholder(self.plot, None)
        self.saliency = awq_saliency(columns, stats, name=name)
        self._redraw()

    @Slot()
    def _redraw(self, *_: Any) -> None:
        s = self.saliency
        if s is None:
            return
        y = _positive(s.per_channel)
        self.curve.setData(np.arange(y.size, dtype=np.float64), y)
        idx = s.top(self.share)
        self.top.setData(idx.astype(np.float64), y[idx])
        head = ", ".join(str(int(i)) for i in idx[:8])
        self._show(
            f"<b>{s.name}</b>: the top {100 * self.share:g} % of channels ({idx.size}) hold "
            f"{100 * s.top_mass(self.share):.1f} % of the salience (uniform: {100 * self.share:g} %). "
            f"Most salient: {head}{'…' if idx.size > 8 else ''}.",
            s,
        )

    def _color_curves(self, c: dict[str, Any]) -> None:
        self.curve.setPen(pg.mkPen(c["main"]))
        self.top.setSymbolBrush(pg.mkBrush(c["outlier"]))


class SmoothQuantView(_ChannelView):
    """SmoothQuant's migration s_j = max|X_j|^α / max|W_j|^(1−α): the ranges before and after, for an α."""

    STEPS = 100  # slider positions over α ∈ [0, 1]

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.result: SmoothQuantResult | None = None
        self._act: np.ndarray | None = None
        self._w: np.ndarray | None = None
        self._name = ""
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.slider.setRange(0, self.STEPS)
        self.slider.setValue(self.STEPS // 2)
        self.slider.setToolTip("α: how much of the activations' range moves into the weights")
        self.slider.valueChanged.connect(self._redraw)
        self.alpha_label = QLabel(self)
        self.label = QLabel(_NO_DATA, self)
        self.label.setWordWrap(True)
        self.act_plot = _channel_plot(self, "Activation range per input channel, max |X_j|", "max |x|")
        self.w_plot = _channel_plot(self, "Weight range per input channel, max |W_j|", "max |w|")
        self.w_plot.setXLink(self.act_plot)  # one channel axis
        ap, wp = self.act_plot.getPlotItem(), self.w_plot.getPlotItem()
        self.act_before = ap.plot([], [], name="before")
        self.act_after = ap.plot([], [], name="after ÷ s")
        self.w_before = wp.plot([], [], name="before")
        self.w_after = wp.plot([], [], name="after × s")
        top = QHBoxLayout()
        top.addWidget(QLabel("α", self))
        top.addWidget(self.slider, 1)
        top.addWidget(self.alpha_label)
        self._arrange(top, self.act_plot, self.w_plot)
        self._show_alpha()
        for plot in (self.act_plot, self.w_plot):
            set_placeholder(plot, _PLACEHOLDER)

    @property
    def alpha(self) -> float:
        """The α chosen on the slider."""
        return self.slider.value() / self.STEPS

    def set_alpha(self, alpha: float) -> None:
        """Move the slider to ``alpha`` (0..1)."""
        self.slider.setValue(round(alpha * self.STEPS))

    def set_data(self, stats: Any, columns: Any, name: str = "") -> None:
        """Show weight ``name``'s migration from its ``InputStats`` and ``WeightColumns`` (None clears)."""
        if stats is None or columns is None:
            self.result, self._act, self._w = None, None, None
            for c in (self.act_before, self.act_after, self.w_before, self.w_after):
                c.setData([], [])
            self.label.setText(_NO_DATA)
            for plot in (self.act_plot, self.w_plot):
                set_placeholder(plot, _PLACEHOLDER)
            return
        for plot in (self.act_plot, self.w_plot):
            set_placeholder(plot, None)
        self._act, self._w, self._name = stats.channel_absmax, columns.absmax, name
        self._redraw()

    def _show_alpha(self) -> None:
        self.alpha_label.setText(f"{self.alpha:.2f}")

    @Slot()
    def _redraw(self, *_: Any) -> None:
        self._show_alpha()
        if self._act is None or self._w is None:
            return
        r = smoothquant(self._act, self._w, self.alpha)
        self.result = r
        x = np.arange(r.scales.size, dtype=np.float64)
        self.act_before.setData(x, _positive(r.act_before))
        self.act_after.setData(x, _positive(r.act_after))
        self.w_before.setData(x, _positive(r.weight_before))
        self.w_after.setData(x, _positive(r.weight_after))
        (a0, a1), (w0, w1) = r.act_spread, r.weight_spread
        self._show(
            f"<b>{self._name}</b>, α = {r.alpha:.2f}: activation max / median {a0:.3g} → {a1:.3g}, "
            f"weight max / median {w0:.3g} → {w1:.3g}; largest activation {r.act_before.max():.4g} → "
            f"{r.act_after.max():.4g}.",
            r,
        )

    def _color_curves(self, c: dict[str, Any]) -> None:
        for before, after in ((self.act_before, self.act_after), (self.w_before, self.w_after)):
            before.setPen(pg.mkPen(c["main"]))
            after.setPen(pg.mkPen(c["second"]))
