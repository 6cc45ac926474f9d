"""Weight inspector: histogram, per-channel absmax with outliers, |W| heat map and a statistics table.

Statistics are computed by ``studio.core.stats.tensor_stats`` in a job (streamed from the memory-mapped
file, cached per tensor); this widget only draws what comes back. After a calibration run (the
Calibrate page shares its ``ActivationStats`` through the state) a third row shows what entered the
selected linear: the |x| histogram, and the activation absmax per input channel on the same channel
axis as the weight's, outlier features marked by |x| ≥ 6 (LLM.int8()) and by k × median
(``studio.core.calib.analysis.channel_profile``). With "Rotated" the tensor is shown as ``export --rotate``
writes it, and a last row draws its per-input-channel absmax histogram before and after the rotation
(``studio.core.stats.rotation_effect``); the marked channel (the demo's 260), or else the outlier, is named
with its absmax before → after.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableWidgetItem,
    QWidget,
)

from studio.core.calib.analysis import ChannelProfile, activation_histogram, channel_profile
from studio.core.errors import StudioError
from studio.core.model.rotate import RotatedCheckpoint
from studio.core.stats.cache import StatsCache
from studio.core.stats.rotation_effect import RotationEffect, default_rotation, rotation_effect
from studio.core.stats.tensor_stats import DEFAULT_BINS, OutlierKind, OutlierRule, TensorStats, tensor_stats
from studio.qt import widgets
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread, page_layout, read_only_table
from studio.qt.placeholder import set_placeholder
from studio.qt.state import StudioState
from studio.qt.theme import (
    MAIN_FILL_ALPHA,
    SECOND_FILL_ALPHA,
    fill_color,
    follow_theme,
    plot_colors,
    style_plot,
)

__all__ = ["InspectorPanel", "rule_from_widgets"]

_RULE_CHOICES = (
    ("k × median", OutlierKind.K_MEDIAN, 5.0),
    ("|x| > t  (LLM.int8)", OutlierKind.ABS, 6.0),
)


def rule_from_widgets(combo: QComboBox, spin: QDoubleSpinBox) -> OutlierRule:
    """The outlier rule a (kind combo, value spin box) pair describes."""
    _, kind, _ = _RULE_CHOICES[max(0, combo.currentIndex())]
    return OutlierRule(kind, float(spin.value()))


def make_rule_widgets(parent: QWidget) -> tuple[QComboBox, QDoubleSpinBox]:
    """A combo for the outlier rule's kind and a spin box for its k or threshold."""
    combo = QComboBox(parent)
    for label, _, _ in _RULE_CHOICES:
        combo.addItem(label)
    spin = widgets.spin_box(
        parent,
        0.01,
        1e6,
        _RULE_CHOICES[0][2],
        decimals=2,
        tip="k for 'k × median', or the magnitude t for '|x| > t'",
    )

    def kind_changed(i: int) -> None:
        spin.setValue(_RULE_CHOICES[i][2])

    combo.currentIndexChanged.connect(kind_changed)
    return combo, spin


def _fmt(v: float) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.6g}"


class _ChannelPlot:
    """absmax per channel as a line, the outliers as red dots, the threshold as a dashed line."""

    def __init__(self, widget: pg.PlotWidget, title: str, xlabel: str) -> None:
        self.widget = widget
        item = widget.getPlotItem()
        item.setTitle(title)
        item.setLabel("bottom", xlabel)
        item.setLabel("left", "absmax")
        item.setDownsampling(auto=True, mode="peak")
        item.setClipToView(True)
        # Coloured by recolor(), which the panel calls with the theme before anything is drawn.
        self.curve = item.plot([], [])
        self.outliers = pg.ScatterPlotItem(size=6, pen=None)
        item.addItem(self.outliers)
        self.threshold = pg.InfiniteLine(angle=0, movable=False)
        item.addItem(self.threshold)
        self.note = pg.TextItem(
            "", anchor=(0, 0)
        )  # names one marked channel (the demo's outlier), below-right
        self.note.setZValue(50)
        item.addItem(self.note, ignoreBounds=True)
        self.mask = np.zeros(0, bool)
        self.values = np.zeros(0)

    def show(self, values: np.ndarray, rule: OutlierRule) -> None:
        x = np.arange(values.size, dtype=np.float64)
        self.values = values
        self.curve.setData(x, values)
        self.note.setText("")
        self.highlight(values, rule)

    def mark(self, channel: int, text: str) -> None:
        """Name ``channel`` on the plot with ``text``, beside its point (nothing if out of range)."""
        if 0 <= channel < self.values.size:
            self.note.setText(text)
            self.note.setPos(float(channel), float(self.values[channel]))

    def highlight(self, values: np.ndarray, rule: OutlierRule) -> None:
        self.mask = rule.mask(values)
        med = float(np.median(values)) if values.size else 0.0
        self.threshold.setValue(rule.threshold(med))
        idx = np.flatnonzero(self.mask)
        self.outliers.setData(x=idx.astype(np.float64), y=values[idx].astype(np.float64))

    def clear(self) -> None:
        self.curve.setData([], [])
        self.outliers.setData(x=[], y=[])
        self.note.setText("")
        self.mask = np.zeros(0, bool)
        self.values = np.zeros(0)

    def recolor(self, dark: bool) -> None:
        c = plot_colors(dark)
        style_plot(self.widget, dark)
        self.curve.setPen(pg.mkPen(c["main"]))
        self.outliers.setBrush(pg.mkBrush(c["outlier"]))
        self.threshold.setPen(pg.mkPen(c["outlier"], style=Qt.PenStyle.DashLine))
        self.note.setColor(c["outlier"])


class _SmoothImageItem(pg.ImageItem):
    """An image drawn with bilinear scaling: shrunk to fewer screen pixels than it has columns, a
    lone outlier column is blended in (and, saturated by the levels, stays visible) instead of being
    dropped by nearest-neighbour sampling."""

    def paint(self, p: Any, *args: Any) -> None:
        p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, True)
        super().paint(p, *args)


class InspectorPanel(JobPanel, QWidget):
    """Statistics of the selected tensor; recomputed (or taken from the cache) on every selection."""

    statsShown = Signal(str)  # tensor name, after its plots were drawn
    errorShown = Signal(str)  # the sentence shown for a failed computation
    bins = DEFAULT_BINS  # of the weight histogram

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.init_task(state, jobs, "statistics")
        self.cache = StatsCache()  # replace it with the overview's to share the statistics
        self.stats: TensorStats | None = None
        self._draw_token = 0
        self._job_name = ""  # the tensor of the newest statistics job
        self.profile: ChannelProfile | None = None  # the activations of the shown tensor's input
        self._rot_cache = StatsCache()  # the rotated view's statistics, apart from the model's own
        self._rot_view: RotatedCheckpoint | None = None
        self._note = ""  # the rotation's effect on the shown tensor, when "Rotated" is on
        self.effect: RotationEffect | None = None  # its input channels before and after, when "Rotated" is on
        self._build()
        state.activationsChanged.connect(lambda _s: self._draw_activations())
        state.tensorSelected.connect(self._on_tensor_selected)
        state.modelOpened.connect(self._on_model_opened)
        state.modelClosed.connect(self.clear)
        follow_theme(state, self._apply_theme)
        if state.checkpoint is not None and state.selected_tensor:
            self.request(state.selected_tensor)  # built lazily after the user already chose one

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        self.title = QLabel("Select a tensor in the model tree to see its statistics.", self)
        self.title.setWordWrap(True)  # a long name wraps instead of widening the page past the window
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status = QLabel("", self)
        self.status.setWordWrap(True)
        self.rule_combo, self.rule_spin = make_rule_widgets(self)
        self.rule_combo.currentIndexChanged.connect(self._rule_changed)
        self.rule_spin.valueChanged.connect(self._rule_changed)

        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(QLabel("Outliers:", self))
        top.addWidget(self.rule_combo)
        top.addWidget(self.rule_spin)
        self.rotate_box = QCheckBox("Rotated", self)
        self.rotate_box.setToolTip(
            "Show the tensor as export --rotate writes it: a randomised Hadamard rotation folded into the "
            "weights spreads outlier input channels over many"
        )
        self.rotate_box.toggled.connect(self._rotate_toggled)
        top.addWidget(self.rotate_box)
        self.act_abs_spin = widgets.spin_box(
            self,
            0.01,
            1e6,
            6.0,
            prefix="|x| ≥ ",
            tip="Activation outlier features by magnitude (LLM.int8() uses 6)",
        )
        self.act_k_spin = widgets.spin_box(
            self,
            1.0,
            1e4,
            5.0,
            prefix="> ",
            suffix=" × median",
            tip="Activation outlier features: channel absmax above k × the median channel's",
        )
        for spin in (self.act_abs_spin, self.act_k_spin):
            spin.valueChanged.connect(self._draw_activations)
        top.addWidget(QLabel("Activations:", self))
        top.addWidget(self.act_abs_spin)
        top.addWidget(self.act_k_spin)

        self.hist_plot = pg.PlotWidget(self)
        hp = self.hist_plot.getPlotItem()
        hp.setTitle("Weight histogram")
        hp.setLabel("left", "log10(1 + count)")
        hp.setLabel("bottom", "value")
        self.hist_item = hp.plot([0.0, 1.0], [0.0], stepMode="center", fillLevel=0)
        self.out_plot = pg.PlotWidget(self)
        self.out_channels = _ChannelPlot(self.out_plot, "absmax per output channel", "output channel")
        self.in_plot = pg.PlotWidget(self)
        self.in_channels = _ChannelPlot(self.in_plot, "absmax per input channel", "input channel")
        self.heat_plot = pg.PlotWidget(self)
        self.heat_plot.getPlotItem().setTitle("|W| (block max)")
        self.heat_plot.getPlotItem().setLabel("bottom", "input channel")
        self.heat_plot.getPlotItem().setLabel("left", "output channel")
        self.heat_plot.getPlotItem().invertY(True)
        self.heat_item = _SmoothImageItem(axisOrder="row-major")
        self.heat_item.setColorMap(pg.colormap.get("viridis"))
        self.heat_plot.addItem(self.heat_item)

        # with "Rotated": the per-input-channel absmax histogram before and after the rotation
        self.rot_plot = pg.PlotWidget(self)
        rp = self.rot_plot.getPlotItem()
        rp.setTitle("Input-channel absmax: before and after rotation")
        rp.setLabel("left", "log10(1 + channels)")
        rp.setLabel("bottom", "absmax of an input channel")
        rp.setLogMode(x=True)
        rp.addLegend(offset=(-10, 10))
        self.rot_before = rp.plot([1.0, 2.0], [0.0], stepMode="center", fillLevel=0, name="before")
        self.rot_after = rp.plot([1.0, 2.0], [0.0], stepMode="center", fillLevel=0, name="after")
        self.rot_plot.setVisible(False)

        self.act_hist_plot = pg.PlotWidget(self)
        ap = self.act_hist_plot.getPlotItem()
        ap.setLabel("left", "log10(1 + count)")
        ap.setLabel("bottom", "|x| entering this weight")
        ap.setLogMode(x=True)  # eight bins per octave
        self.act_hist_item = ap.plot([1.0, 2.0], [0.0], stepMode="center", fillLevel=0)
        self.act_hist_abs = pg.InfiniteLine(angle=90, movable=False)
        ap.addItem(self.act_hist_abs)
        self.act_plot = pg.PlotWidget(self)
        self.act_plot.setXLink(self.in_plot)  # one input-channel axis for the weight and its activations
        pi = self.act_plot.getPlotItem()
        pi.setLabel("bottom", "input channel")
        pi.setLabel("left", "activation absmax")
        pi.setDownsampling(auto=True, mode="peak")
        pi.setClipToView(True)
        pi.addLegend(offset=(-10, 10))
        self.act_curve = pi.plot([], [], name="max |x|")
        self.act_out_abs = pg.ScatterPlotItem(size=8, pen=None, name="|x| ≥ t")
        self.act_out_med = pg.ScatterPlotItem(size=11, symbol="t", brush=None, name="k × median")
        pi.addItem(self.act_out_med)
        pi.addItem(self.act_out_abs)
        self.act_line_abs = pg.InfiniteLine(angle=0, movable=False)
        self.act_line_med = pg.InfiniteLine(angle=0, movable=False)
        pi.addItem(self.act_line_abs)
        pi.addItem(self.act_line_med)
        self._set_activation_titles("Activations: run Calibrate to see them")
        self.act_plot.setXLink(None)
        for plot in (self.act_plot, self.act_hist_plot):
            set_placeholder(plot, "Run Calibrate to see activations")

        grid = QGridLayout()
        grid.addWidget(self.hist_plot, 0, 0)
        grid.addWidget(self.heat_plot, 0, 1)
        grid.addWidget(self.out_plot, 1, 0)
        grid.addWidget(self.in_plot, 1, 1)
        grid.addWidget(self.act_hist_plot, 2, 0)
        grid.addWidget(self.act_plot, 2, 1)
        grid.addWidget(self.rot_plot, 3, 0, 1, 2)
        plots = QWidget(self)
        plots.setLayout(grid)

        self.table = read_only_table(self, ["statistic", "value"])
        self.table.setMinimumWidth(240)  # values stay readable when the window is narrow
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)

        page_layout(self, top, self.status, plots, self.table, 4)

    # -- public -----------------------------------------------------------------------------------

    @property
    def rule(self) -> OutlierRule:
        """The outlier rule chosen in the panel."""
        return rule_from_widgets(self.rule_combo, self.rule_spin)

    @Slot()
    def clear(self) -> None:
        """Forget the shown tensor (the model was closed)."""
        assert_gui_thread("InspectorPanel.clear")
        self.task.cancel(quiet=True)
        self._job_name = ""
        self._draw_token += 1
        self.stats = None
        self._note = ""
        self.effect = None
        self._draw_rotation()
        self.hist_item.setData([0.0, 1.0], [0.0], stepMode="center")
        self.out_channels.clear()
        self.in_channels.clear()
        self.heat_item.clear()
        self._draw_activations()
        self.table.setRowCount(0)
        self.title.setText("Select a tensor in the model tree to see its statistics.")
        self.status.setText("")

    def mark_input_channel(self, tensor: str, channel: int, text: str) -> None:
        """Name input ``channel`` of ``tensor`` on its plot (now, or once its statistics are drawn)."""
        self._mark = (tensor, channel, text)
        if self.stats is not None:
            self._apply_mark(self.stats)

    def _apply_mark(self, stats: TensorStats) -> None:
        mark = getattr(self, "_mark", None)
        marked = mark is not None and mark[0] == stats.name
        eff = self.effect if self.effect is not None and self.effect.name == stats.name else None
        if (
            eff is not None
        ):  # rotated: the marked channel (else the outlier) named with its absmax before → after
            channel = mark[1] if marked else eff.worst
            self.in_channels.mark(channel, eff.channel_note(channel))
        elif marked:
            self.in_channels.mark(mark[1], mark[2])

    def _draw_rotation(self) -> None:
        """The absmax histograms before and after the rotation (the plot is hidden without "Rotated")."""
        eff, stats = self.effect, self.stats
        if eff is None or stats is None or eff.name != stats.name:
            self.rot_before.setData([1.0, 2.0], [0.0], stepMode="center")
            self.rot_after.setData([1.0, 2.0], [0.0], stepMode="center")
            self.rot_plot.setVisible(False)
            return
        edges, before, after = eff.curves()
        self.rot_before.setData(edges, before, stepMode="center", fillLevel=0)
        self.rot_after.setData(edges, after, stepMode="center", fillLevel=0)
        self.rot_plot.setVisible(True)

    def show_stats(self, stats: TensorStats, *, staged: bool = True) -> None:
        """Draw ``stats`` (GUI thread only); ``statsShown`` follows once every plot holds its data.

        Staged: one plot per event-loop turn, so the first (expensive) paint of four plots never
        blocks the GUI thread in one piece.
        """
        assert_gui_thread("InspectorPanel.show_stats")
        self.stats = stats
        self._draw_token += 1
        token = self._draw_token
        rule = self.rule

        def draw_hist() -> None:
            self.hist_item.setData(stats.hist.edges, stats.hist.log_counts(), stepMode="center", fillLevel=0)
            shape = " × ".join(str(s) for s in stats.shape)
            self.title.setText(f"<b>{stats.name}</b>  ({shape})")
            self.status.setText(self._note)

        def draw_heat() -> None:
            if stats.heatmap is None:
                self.heat_item.clear()
                return
            lo, hi = stats.heat_levels()
            # Clipped to the levels: pyqtgraph 0.14 wraps float values far above the top level
            # back into dark colours, which would hide exactly the strongest outlier columns.
            self.heat_item.setImage(np.minimum(stats.heatmap, hi), autoLevels=False, levels=(lo, hi))
            self.heat_item.setRect(QRectF(0, 0, len(stats.absmax_in), len(stats.absmax_out)))

        steps = [
            draw_hist,
            lambda: self.out_channels.show(stats.absmax_out, rule),
            lambda: (self.in_channels.show(stats.absmax_in, rule), self._apply_mark(stats)),
            draw_heat,
            self._draw_rotation,
            self._draw_activations,
            lambda: self._fill_table(stats, rule),
        ]

        def run(i: int) -> None:
            if token != self._draw_token:
                return  # another tensor (or a clear) came in between
            steps[i]()
            if i + 1 == len(steps):
                self.statsShown.emit(stats.name)
            elif staged:
                QTimer.singleShot(0, self, lambda: run(i + 1))
            else:
                run(i + 1)

        run(0)

    # -- slots ------------------------------------------------------------------------------------

    @Slot(object)
    def _on_model_opened(self, _checkpoint: Any) -> None:
        self._rot_view = None
        self._rot_cache = StatsCache()
        self.clear()
        if self.state.selected_tensor:
            # chosen for this model by a slot that ran before this one (``quant-studio MODEL --select T``
            # connects before the panel is built): the state forgets the old model's choice first
            self.request(self.state.selected_tensor)

    @Slot(bool)
    def _rotate_toggled(self, _on: bool) -> None:
        name = self.state.selected_tensor
        if self.state.checkpoint is not None and name:
            self._job_name = ""  # the same tensor, seen the other way
            self.request(name)

    @Slot(str)
    def _on_tensor_selected(self, name: str) -> None:
        assert_gui_thread("InspectorPanel._on_tensor_selected")
        if not name:
            self.clear()
            return
        self.request(name)

    def request(self, name: str) -> None:
        """Compute (or fetch from the cache) and show the statistics of ``name``."""
        ckpt = self.state.checkpoint
        if ckpt is None or name not in ckpt:
            return
        if self.running and self._job_name == name:
            # Already on its way: repeated requests start one job
            # (test_inspector.py::test_repeated_selection_starts_one_job).
            return
        view = self._rotated(ckpt) if self.rotate_box.isChecked() else None
        self._job_name = name
        self.status.setText(f"Computing statistics of {name}…")
        cache, bins = self.cache, self.bins
        mark = getattr(self, "_mark", None)
        channel = mark[1] if mark and mark[0] == name else None

        def work(ctx: Any) -> tuple[TensorStats, str, RotationEffect | None]:
            if view is None:
                return tensor_stats(ckpt, name, cache=cache, bins=bins, ctx=ctx), "", None
            stats = tensor_stats(view, name, cache=self._rot_cache, bins=bins, ctx=ctx)
            if len(stats.shape) != 2:
                return stats, "Rotated: this tensor is not a matrix.", None
            eff = rotation_effect(view, name)
            return stats, " ".join((eff.sentence(channel), *view.notes)), eff  # R2 alone: why

        self.task.start(f"Statistics of {name}", work)

    def _rotated(self, ckpt: Any) -> RotatedCheckpoint | None:
        """The rotated view of ``ckpt`` (made once per model); None, with the reason shown, if it has none."""
        if self._rot_view is None or self._rot_view.inner is not ckpt:
            try:
                self._rot_view = RotatedCheckpoint(ckpt, default_rotation())
            except StudioError as err:
                self._rot_view = None
                self.status.setText(err.message)
        return self._rot_view

    def on_done(self, result: tuple[TensorStats, str, RotationEffect | None]) -> None:
        self._note, self.effect = result[1], result[2]
        self.show_stats(result[0])

    @Slot()
    def _rule_changed(self, *_: Any) -> None:
        if self.stats is None:
            return
        rule = self.rule
        self.out_channels.highlight(self.stats.absmax_out, rule)
        self.in_channels.highlight(self.stats.absmax_in, rule)
        self._fill_table(self.stats, rule)

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        c = plot_colors(dark)
        for w in (self.hist_plot, self.heat_plot):
            style_plot(w, dark)
        self.hist_item.setPen(pg.mkPen(c["main"]))
        self.hist_item.setBrush(fill_color(c["main"], MAIN_FILL_ALPHA))
        self.out_channels.recolor(dark)
        self.in_channels.recolor(dark)
        style_plot(self.rot_plot, dark)
        self.rot_before.setPen(pg.mkPen(c["main"]))
        self.rot_before.setBrush(fill_color(c["main"], MAIN_FILL_ALPHA))
        self.rot_after.setPen(pg.mkPen(c["second"]))
        self.rot_after.setBrush(fill_color(c["second"], SECOND_FILL_ALPHA))
        style_plot(self.act_hist_plot, dark)
        style_plot(self.act_plot, dark)
        self.act_hist_item.setPen(pg.mkPen(c["second"]))
        self.act_hist_item.setBrush(fill_color(c["second"], SECOND_FILL_ALPHA))
        self.act_hist_abs.setPen(pg.mkPen(c["outlier"], style=Qt.PenStyle.DashLine))
        self.act_curve.setPen(pg.mkPen(c["second"]))
        self.act_out_abs.setBrush(pg.mkBrush(c["outlier"]))
        self.act_out_med.setPen(pg.mkPen(c["main"], width=2))
        self.act_line_abs.setPen(pg.mkPen(c["outlier"], style=Qt.PenStyle.DashLine))
        self.act_line_med.setPen(pg.mkPen(c["main"], style=Qt.PenStyle.DotLine))

    # -- activations ------------------------------------------------------------------------------

    def _set_activation_titles(self, text: str) -> None:
        self.act_plot.getPlotItem().setTitle(text)
        self.act_hist_plot.getPlotItem().setTitle("Activation |x| histogram")

    @Slot()
    def _draw_activations(self, *_: Any) -> None:
        """Draw what entered the shown weight in the last calibration run (or say why nothing can be)."""
        acts, stats = self.state.activation_stats, self.stats
        st = acts.inputs.get(stats.name) if acts is not None and stats is not None else None
        self.profile = None
        if st is None:
            self.act_hist_item.setData([1.0, 2.0], [0.0], stepMode="center")
            self.act_curve.setData([], [])
            self.act_out_abs.setData(x=[], y=[])
            self.act_out_med.setData(x=[], y=[])
            if acts is None:
                why = "Activations: run Calibrate to see them"
            else:
                why = "Activations: no linear layer the run observed reads this tensor"
            self._set_activation_titles(why)
            # a sentence instead of an empty pair of axes (unlinked: the weight's channel axis stays put)
            self.act_plot.setXLink(None)
            text = (
                "Run Calibrate to see activations"
                if acts is None
                else "No calibrated layer reads this tensor"
            )
            for plot in (self.act_plot, self.act_hist_plot):
                set_placeholder(plot, text)
            return
        for plot in (self.act_plot, self.act_hist_plot):
            set_placeholder(plot, None)
        self.act_plot.setXLink(self.in_plot)
        w_in = stats.absmax_in if stats.absmax_in.size == st.n_cols else None
        prof = channel_profile(
            st, w_in, name=stats.name, abs_threshold=self.act_abs_spin.value(), k=self.act_k_spin.value()
        )
        self.profile = prof
        h = activation_histogram(st)
        nz = np.flatnonzero(h.counts[1:-1]) + 1  # inner bins with elements (the log axis cannot show 0)
        if nz.size:
            a, b = int(nz[0]), int(nz[-1]) + 1
            self.act_hist_item.setData(
                h.edges[a : b + 1], h.log_counts()[a:b], stepMode="center", fillLevel=0
            )
        self.act_hist_abs.setValue(math.log10(prof.abs_threshold))
        x = np.arange(prof.act_absmax.size, dtype=np.float64)
        y = prof.act_absmax.astype(np.float64)
        self.act_curve.setData(x, y)
        self.act_out_abs.setData(x=prof.outliers_abs.astype(np.float64), y=y[prof.outliers_abs])
        self.act_out_med.setData(x=prof.outliers_kmedian.astype(np.float64), y=y[prof.outliers_kmedian])
        self.act_line_abs.setValue(prof.abs_threshold)
        self.act_line_med.setValue(prof.kmedian_threshold)
        # short titles (a quarter of the window wide); the table lists the channels
        self.act_plot.getPlotItem().setTitle(
            f"Activation absmax ({prof.outliers_abs.size} + {prof.outliers_kmedian.size} marked)"
        )
        self.act_hist_plot.getPlotItem().setTitle(
            f"Activation |x|: {100 * h.share_above(prof.abs_threshold):.3g} % ≥ {prof.abs_threshold:g}"
        )
        if self.stats is not None and self.table.rowCount():
            self._fill_table(self.stats, self.rule)

    # -- table ------------------------------------------------------------------------------------

    def _fill_table(self, s: TensorStats, rule: OutlierRule) -> None:
        n_out = int(self.out_channels.mask.sum())
        n_in = int(self.in_channels.mask.sum())
        rows = [
            ("shape", " × ".join(str(d) for d in s.shape)),
            ("elements", f"{s.n:,}"),
            ("min", _fmt(s.min)),
            ("max", _fmt(s.max)),
            ("mean", _fmt(s.mean)),
            ("std", _fmt(s.std)),
            ("excess kurtosis", _fmt(s.kurtosis)),
            ("median |x|", _fmt(s.median_abs)),
            (f"outlier share ({rule.label()})", f"{100 * s.element_outlier_share(rule):.4g} %"),
            ("outlier output channels", f"{n_out} of {s.absmax_out.size}"),
            ("outlier input channels", f"{n_in} of {s.absmax_in.size}"),
            ("max / median scale (out)", _fmt(s.scale_ratio("out"))),
            ("max / median scale (in)", _fmt(s.scale_ratio("in"))),
            ("NaN / inf", f"{s.n_nonfinite:,}"),
        ]
        p = self.profile
        if p is not None:

            def chans(idx: np.ndarray) -> str:
                head = ", ".join(str(int(i)) for i in idx[:12])
                return f"{idx.size} of {p.act_absmax.size}" + (
                    f": {head}{'…' if idx.size > 12 else ''}" if idx.size else ""
                )

            peak = int(np.argmax(p.act_absmax)) if p.act_absmax.size else 0
            rows += [
                (
                    "activation absmax",
                    f"{_fmt(float(p.act_absmax.max()))} (channel {peak})" if p.act_absmax.size else "–",
                ),
                (f"activation outliers (|x| ≥ {p.abs_threshold:g})", chans(p.outliers_abs)),
                (f"activation outliers (> {self.act_k_spin.value():g} × median)", chans(p.outliers_kmedian)),
            ]
        self.table.setRowCount(len(rows))
        for i, (k, v) in enumerate(rows):
            self.table.setItem(i, 0, QTableWidgetItem(k))
            self.table.setItem(i, 1, QTableWidgetItem(v))

    def table_value(self, key: str) -> str:
        """The text shown for statistic ``key`` (for tests and screenshots)."""
        for i in range(self.table.rowCount()):
            if self.table.item(i, 0).text() == key:
                return self.table.item(i, 1).text()
        raise KeyError(key)
