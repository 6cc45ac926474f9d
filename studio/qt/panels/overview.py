"""Model overview: one per-tensor statistic over all layers and roles; clicking a point selects that tensor.

The summaries come from ``studio.core.stats.overview.model_overview`` run in a job (statistics are
shared with the inspector through the same cache).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from studio.core.stats.cache import StatsCache
from studio.core.stats.overview import ModelOverview, OverviewMetric, model_overview
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread
from studio.qt.panels.inspector import make_rule_widgets, rule_from_widgets
from studio.qt.state import StudioState
from studio.qt.theme import follow_theme, plot_colors, role_color, style_plot

__all__ = ["OverviewPanel"]


class OverviewPanel(JobPanel, QWidget):
    """A scatter of one statistic per weight matrix; hard tensors stand out, a click selects one."""

    overviewShown = Signal(object)  # the ModelOverview drawn
    errorShown = Signal(str)

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
        follow_theme(state, self._apply_theme)
        self.update_controls()

    def _build(self) -> None:
        self.metric_combo = QComboBox(self)
        for m in OverviewMetric:
            self.metric_combo.addItem(m.label)
        self.metric_combo.currentIndexChanged.connect(self._redraw)
        self.rule_combo, self.rule_spin = make_rule_widgets(self)
        self.run_button = QPushButton("Analyze all tensors", self)
        self.run_button.setToolTip("Compute statistics of every weight matrix (in the background)")
        self.run_button.clicked.connect(self.start)
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

        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.status)
        lay.addWidget(self.plot, 1)

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
        self.status.setText("Analyze the model to see which tensors are hard to quantize.")
        self.update_controls()

    def show_overview(self, overview: ModelOverview) -> None:
        """Draw ``overview`` (GUI thread only)."""
        assert_gui_thread("OverviewPanel.show_overview")
        self.overview = overview
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

    def on_cancel(self) -> None:
        self.update_controls()
        self.status.setText("Analysis cancelled.")

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
        self.plot.getPlotItem().setLabel("left", self.metric.label)
        self._set_layer_ticks(ov)
        self._mark_selected(self.state.selected_tensor)

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

    def update_controls(self) -> None:
        self.run_button.setEnabled(self.state.checkpoint is not None and not self.running)

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        style_plot(self.plot, dark)
        self.selected_marker.setPen(pg.mkPen(plot_colors(dark)["outlier"], width=2))
