"""Model overview: one per-tensor statistic over all layers and roles; clicking a point selects that tensor.

The summaries come from ``studio.core.stats.overview.model_overview`` run in a job (statistics are
shared with the inspector through the same cache). After a calibration run (``StudioState``'s
activation statistics) a bar chart below counts each layer's activation outlier features
(``studio.core.calib.analysis.layer_outlier_counts``) by the same outlier rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from studio.core.calib.analysis import FeatureRule, FeatureRuleKind, LayerOutliers, layer_outlier_counts
from studio.core.stats.cache import StatsCache
from studio.core.stats.overview import ModelOverview, OverviewMetric, model_overview
from studio.core.stats.tensor_stats import OutlierKind
from studio.qt import widgets
from studio.qt.fmt import role_text
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread
from studio.qt.panels.inspector import make_rule_widgets, rule_from_widgets
from studio.qt.placeholder import set_placeholder
from studio.qt.state import StudioState
from studio.qt.theme import follow_theme, plot_colors, role_color, style_plot

__all__ = ["OverviewPanel"]


class OverviewPanel(JobPanel, QWidget):
    """A scatter of one statistic per weight matrix; hard tensors stand out, a click selects one."""

    overviewShown = Signal(object)  # the ModelOverview drawn
    errorShown = Signal(str)
    cancelled_text = "Analysis cancelled."

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.init_task(state, jobs, "statistics")
        self.cache = StatsCache()  # replace it with the inspector's to share the statistics
        self.overview: ModelOverview | None = None
        self._names: list[str] = []
        self._build()
        state.modelOpened.connect(lambda _c: self.clear())
        state.modelClosed.connect(self.clear)
        state.tensorSelected.connect(self._mark_selected)
        state.activationsChanged.connect(self._draw_activation_outliers)
        follow_theme(state, self._apply_theme)
        self._draw_activation_outliers(state.activation_stats)
        self.update_controls()

    def _build(self) -> None:
        self.metric_combo = QComboBox(self)
        for m in OverviewMetric:
            self.metric_combo.addItem(m.label)
        self.metric_combo.currentIndexChanged.connect(self._redraw)
        self.rule_combo, self.rule_spin = make_rule_widgets(self)
        self.run_button = widgets.button(
            "Analyze all tensors",
            self,
            self.start,
            tip="Compute statistics of every weight matrix (in the background)",
        )
        self.status = QLabel("Open a model, then analyze it to see which tensors are hard to quantize.", self)
        self.status.setWordWrap(True)
        top = QHBoxLayout()
        top.addWidget(QLabel("Show:", self))
        top.addWidget(self.metric_combo)
        top.addWidget(QLabel("Outliers:", self))
        top.addWidget(self.rule_combo)
        top.addWidget(self.rule_spin)
        top.addStretch(1)
        top.addWidget(self.run_button)

        self.plot = pg.PlotWidget(self)
        pi = self.plot.getPlotItem()
        pi.setLabel("bottom", "tensor (by layer)")
        pi.showGrid(x=False, y=True, alpha=0.3)
        self.scatter = pg.ScatterPlotItem(size=9, hoverable=True, tip=self._tip)
        self.scatter.sigClicked.connect(self._on_clicked)
        pi.addItem(self.scatter)
        self.selected_marker = pg.ScatterPlotItem(size=16, brush=None)  # its pen follows the theme
        pi.addItem(self.selected_marker)
        # which colour is which role: one entry per role drawn (filled in _redraw)
        self.legend = pi.addLegend(offset=(-10, 10))
        if hasattr(self.legend, "setColumnCount"):
            self.legend.setColumnCount(3)
        self._legend_samples: list[Any] = []
        set_placeholder(self.plot, "Press “Analyze all tensors” to see which tensors are hard to quantize")

        self.layer_outliers: tuple[LayerOutliers, ...] = ()
        self.act_plot = pg.PlotWidget(self)
        ap = self.act_plot.getPlotItem()
        ap.setLabel("bottom", "layer")
        ap.setLabel("left", "outlier features")
        ap.showGrid(x=False, y=True, alpha=0.3)
        self.act_bars = pg.BarGraphItem(x=[], height=[], width=0.8)
        ap.addItem(self.act_bars)
        self.act_label = QLabel("", self)
        self.act_label.setWordWrap(True)
        for w in (self.rule_combo, self.rule_spin):
            sig = w.currentIndexChanged if w is self.rule_combo else w.valueChanged
            sig.connect(lambda *_: self._draw_activation_outliers(self.state.activation_stats))

        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.status)
        lay.addWidget(self.plot, 3)
        lay.addWidget(self.act_plot, 1)
        lay.addWidget(self.act_label)

    # -- public -----------------------------------------------------------------------------------

    @property
    def metric(self) -> OverviewMetric:
        """The statistic plotted."""
        return list(OverviewMetric)[max(0, self.metric_combo.currentIndex())]

    def set_metric(self, metric: OverviewMetric) -> None:
        """Plot ``metric``."""
        self.metric_combo.setCurrentIndex(list(OverviewMetric).index(metric))

    @Slot()
    def start(self) -> None:
        """Analyze every weight matrix of the open model (ignored while an analysis runs)."""
        assert_gui_thread("OverviewPanel.start")
        ckpt = self.state.checkpoint
        if ckpt is None or self.running:
            return
        rule = rule_from_widgets(self.rule_combo, self.rule_spin)
        cache = self.cache

        def work(ctx: Any) -> ModelOverview:
            return model_overview(ckpt, rule=rule, cache=cache, ctx=ctx)

        self.status.setText("Analyzing every weight matrix…")
        self.task.start("Statistics of all tensors", work)
        self.update_controls()

    @Slot()
    def clear(self) -> None:
        """Forget the overview (another model was opened)."""
        assert_gui_thread("OverviewPanel.clear")
        self.task.cancel(quiet=True)  # another model: the analysis of this one is not wanted
        self.overview = None
        self._names = []
        self.scatter.setData([])
        self.selected_marker.setData([])
        self.legend.clear()
        set_placeholder(self.plot, "Press “Analyze all tensors” to see which tensors are hard to quantize")
        self.status.setText("Analyze the model to see which tensors are hard to quantize.")
        self.update_controls()

    def show_overview(self, overview: ModelOverview) -> None:
        """Draw ``overview`` (GUI thread only)."""
        assert_gui_thread("OverviewPanel.show_overview")
        self.overview = overview
        set_placeholder(self.plot, None)
        self._redraw()
        worst = overview.worst(self.metric, 3)
        names = ", ".join(t.name for t in worst)
        self.status.setText(f"{len(overview.tensors)} tensors; highest {self.metric.label}: {names}")
        self.overviewShown.emit(overview)

    def point_position(self, name: str) -> tuple[float, float]:
        """Where tensor ``name`` is drawn (for tests and tooltips)."""
        i = self._names.index(name)
        x, y = self.scatter.getData()
        return float(x[i]), float(y[i])

    # -- slots ------------------------------------------------------------------------------------

    def on_done(self, result: ModelOverview) -> None:
        self.update_controls()
        self.show_overview(result)

    @Slot()
    def _redraw(self, *_: Any) -> None:
        ov = self.overview
        if ov is None:
            return
        values = ov.values(self.metric)
        self._names = ov.names()
        finite = np.where(np.isfinite(values), values, 0.0)
        spots = [
            {
                "pos": (float(i), float(v)),
                "data": t.name,
                "brush": pg.mkBrush(role_color(t.role)),
                "pen": pg.mkPen(None),
            }
            for i, (t, v) in enumerate(zip(ov.tensors, finite, strict=True))
        ]
        self.scatter.setData(spots)
        self._fill_legend(ov)
        self.plot.getPlotItem().setLabel("left", self.metric.label)
        self._set_layer_ticks(ov)
        self._mark_selected(self.state.selected_tensor)

    def _fill_legend(self, ov: ModelOverview) -> None:
        self.legend.clear()
        self._legend_samples = []
        for role in dict.fromkeys(t.role for t in ov.tensors):
            sample = pg.ScatterPlotItem(size=9, brush=pg.mkBrush(role_color(role)), pen=pg.mkPen(None))
            self._legend_samples.append(sample)
            self.legend.addItem(sample, role_text(role))

    def legend_labels(self) -> list[str]:
        """The legend's entries, in order (one per role drawn)."""
        return [label.text for _sample, label in self.legend.items]

    def _set_layer_ticks(self, ov: ModelOverview) -> None:
        ticks = []
        last = object()
        for i, t in enumerate(ov.tensors):
            if t.layer != last:
                ticks.append((float(i), "–" if t.layer is None else str(t.layer)))
                last = t.layer
        self.plot.getPlotItem().getAxis("bottom").setTicks([ticks])

    def _tip(self, x: float, y: float, data: Any) -> str:
        return f"{data}\n{self.metric.label}: {y:.4g}"

    def _on_clicked(self, _item: Any, points: Any, *_: Any) -> None:
        if points is None or len(points) == 0:
            return
        name = points[0].data()
        if name:
            self.state.select_tensor(str(name))

    @Slot(str)
    def _mark_selected(self, name: str) -> None:
        if name in self._names:
            x, y = self.point_position(name)
            self.selected_marker.setData([x], [y])
        else:
            self.selected_marker.setData([])

    def feature_rule(self) -> FeatureRule:
        """The outlier rule of the controls, for activation features (|x| ≥ t or k × median)."""
        rule = rule_from_widgets(self.rule_combo, self.rule_spin)
        if rule.kind is OutlierKind.ABS:
            return FeatureRule(FeatureRuleKind.ABS, rule.value)
        return FeatureRule.k_median(rule.value)

    @Slot(object)
    def _draw_activation_outliers(self, stats: Any) -> None:
        """Bars of outlier features per layer of the last calibration run (hidden without one)."""
        has = stats is not None
        self.act_plot.setVisible(has)
        self.act_label.setVisible(has)
        if not has:
            self.layer_outliers = ()
            self.act_bars.setOpts(x=[], height=[])
            return
        rule = self.feature_rule()
        self.layer_outliers = layer_outlier_counts(stats, rule)
        x = np.array([lo.layer for lo in self.layer_outliers], dtype=np.float64)
        h = np.array([lo.n_features for lo in self.layer_outliers], dtype=np.float64)
        self.act_bars.setOpts(x=x, height=h, width=0.8)
        self.act_plot.getPlotItem().setTitle(
            f"Activation outlier features per layer ({rule.label()}), {stats.n_tokens:,} calibration tokens"
        )
        worst = sorted(self.layer_outliers, key=lambda lo: (-lo.n_features, lo.layer))[:3]
        parts = [
            f"layer {lo.layer}: {lo.n_features} (channels {', '.join(map(str, lo.channels[:6]))}"
            f"{'…' if len(lo.channels) > 6 else ''}; max |x| {lo.max_absmax:.4g})"
            for lo in worst
            if lo.n_features
        ]
        total = int(h.sum())
        self.act_label.setText(
            f"{total} outlier features over {len(self.layer_outliers)} layers"
            + (": " + "; ".join(parts) if parts else ".")
        )

    def update_controls(self) -> None:
        self.run_button.setEnabled(self.state.checkpoint is not None and not self.running)

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        style_plot(self.plot, dark)
        style_plot(self.act_plot, dark)
        c = plot_colors(dark)
        self.selected_marker.setPen(pg.mkPen(c["outlier"], width=2))
        self.act_bars.setOpts(brush=pg.mkBrush(c["second"]), pen=pg.mkPen(c["fg"]))
        self.legend.setLabelTextColor(c["fg"])
