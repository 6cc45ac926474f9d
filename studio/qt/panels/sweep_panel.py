"""The bit-width sweep of one tensor: SNR against bits per weight for every INT granularity (the cliff
marked), the group-size curves at each bit width, the GGUF types as labelled points, and the table.

The rows come from ``studio.core.lab.sweep.sweep_tensor`` run in a job; the panel only draws them.
"""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core.lab.sweep import sweep_tensor
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread, read_only_table, run_controls
from studio.qt.placeholder import set_placeholder
from studio.qt.state import StudioState
from studio.qt.theme import follow_theme, plot_colors, series_color, set_status, style_plot

__all__ = ["COLUMNS", "SERIES", "SweepPanel"]

COLUMNS = ("Scheme", "Bits/weight", "SNR (dB)", "MSE", "Cosine")
# The INT lines of the SNR-against-bits chart: (label, granularity, group, symmetric).
SERIES: tuple[tuple[str, str, int | None, bool], ...] = (
    ("per-tensor sym", "per-tensor", None, True),
    ("per-channel sym", "per-channel", None, True),
    ("per-channel asym", "per-channel", None, False),
    ("g256 asym", "group", 256, False),
    ("g128 asym", "group", 128, False),
    ("g64 asym", "group", 64, False),
    ("g32 asym", "group", 32, False),
)
CHART_MAX_BPW = 9.5
EXACT_SNR_DB = 100.0  # float32 round-off: the tensor is on that type's grid already
SNR_CAP_DB = 120.0  # 16-bit rows of a float16 tensor are exact (infinite SNR): drawn at the top


def _snr(x: float) -> float:
    return min(x, SNR_CAP_DB) if math.isfinite(x) else SNR_CAP_DB


class SweepPanel(JobPanel, QWidget):
    """Pick a tensor of the open model; sweep it in the background; draw the cliff and the table."""

    resultShown = Signal(object)  # the SweepResult just drawn
    errorShown = Signal(str)
    cancelled_text = "Sweep cancelled."

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.init_task(state, jobs, "sweep", progress=True)
        self.result: Any = None
        self._items: list[Any] = []
        self._build()
        state.modelOpened.connect(self._on_model)
        state.modelClosed.connect(self._on_model)
        state.tensorSelected.connect(self._on_tensor_selected)
        follow_theme(state, self._apply_theme)
        self._on_model()

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        self.tensor_combo = QComboBox(self)
        self.tensor_combo.setMinimumContentsLength(40)
        self.tensor_combo.setToolTip("A weight matrix of the open model (the selected tensor by default)")
        self.gguf_check = QCheckBox("GGUF types", self)
        self.gguf_check.setChecked(True)
        self.gguf_check.setToolTip("Also quantize with every GGUF type at its own bits per weight")
        self.run_button, self.cancel_button, self.progress, self.status = run_controls(self, "Sweep")
        self.status.setText("Open a model, pick a tensor and press Sweep.")
        self.summary = QLabel("", self)
        self.summary.setWordWrap(True)

        top = QHBoxLayout()
        top.addWidget(QLabel("Tensor:", self))
        top.addWidget(self.tensor_combo, 1)
        top.addWidget(self.gguf_check)
        top.addWidget(self.run_button)
        top.addWidget(self.cancel_button)

        self.plot = pg.PlotWidget(self)
        self.plot.setTitle("SNR against bits per weight")
        self.plot.setLabel("bottom", "bits per weight (scales included)")
        self.plot.setLabel("left", "SNR (dB)")
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.plot.addLegend(offset=(10, 10))
        self.cliff_line = pg.InfiniteLine(angle=0, movable=False)
        self.cliff_line.label = pg.InfLineLabel(self.cliff_line, "", position=0.98, anchors=[(1, 1), (1, 1)])
        self.plot.addItem(self.cliff_line)

        self.group_plot = pg.PlotWidget(self)
        self.group_plot.setTitle("Group size at each bit width (asymmetric)")
        self.group_plot.setLabel("bottom", "values per scale (log₂)")
        self.group_plot.setLabel("left", "SNR (dB)")
        self.group_plot.showGrid(x=True, y=True, alpha=0.3)
        self.group_plot.addLegend(offset=(-10, 10))

        self.table = read_only_table(self, COLUMNS)
        self.table.setSortingEnabled(False)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)

        plots = QSplitter(Qt.Orientation.Horizontal, self)
        plots.addWidget(self.plot)
        plots.addWidget(self.group_plot)
        plots.setStretchFactor(0, 3)
        plots.setStretchFactor(1, 2)
        self.cliff_line.hide()  # until a sweep draws its cliff
        for plot in (self.plot, self.group_plot):
            set_placeholder(plot, "Pick a tensor and press Sweep")
        split = QSplitter(Qt.Orientation.Vertical, self)
        split.addWidget(plots)
        split.addWidget(self.table)
        split.setSizes([600, 300])
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.summary)
        lay.addWidget(split, 1)

    # -- inputs -----------------------------------------------------------------------------------

    @Slot()
    def _on_model(self, *_args: Any) -> None:
        self.tensor_combo.clear()
        info = self.state.info
        if info is not None:
            for t in info.tensors:
                if len(t.shape) >= 2:  # a sweep of a norm vector says nothing
                    self.tensor_combo.addItem(t.name)
            if self.state.selected_tensor:
                self.select_tensor(self.state.selected_tensor)
        self.update_controls()

    @Slot(str)
    def _on_tensor_selected(self, name: str) -> None:
        if name and not self.running:
            self.select_tensor(name)

    def select_tensor(self, name: str) -> bool:
        """Sweep ``name`` next; False when it is not one of the listed weight matrices."""
        i = self.tensor_combo.findText(name)
        if i >= 0:
            self.tensor_combo.setCurrentIndex(i)
        return i >= 0

    # -- running ----------------------------------------------------------------------------------

    @Slot()
    def start(self) -> bool:
        """Sweep the chosen tensor in the background; False without a model or tensor."""
        assert_gui_thread("SweepPanel.start")
        checkpoint, name = self.state.checkpoint, self.tensor_combo.currentText()
        if checkpoint is None or not name:
            return False
        gguf = self.gguf_check.isChecked()

        def work(ctx: Any) -> Any:
            return sweep_tensor(checkpoint, name, ctx, **({} if gguf else {"gguf_types": ()}))

        self.status.setText(f"Sweeping {name}…")
        self.progress.setRange(0, 0)
        self.task.start(f"Sweep {name}", work)
        self.update_controls()
        return True

    def on_done(self, result: Any) -> None:
        self.update_controls()
        self.show_result(result)

    def update_controls(self) -> None:
        busy = self.running
        self.progress.setVisible(busy)
        self.run_button.setEnabled(not busy and self.tensor_combo.count() > 0)
        self.cancel_button.setEnabled(busy)
        self.tensor_combo.setEnabled(not busy)

    # -- results ----------------------------------------------------------------------------------

    def show_result(self, result: Any) -> None:
        """Draw a ``SweepResult``: both charts, the cliff line, the summary and the table."""
        assert_gui_thread("SweepPanel.show_result")
        self.result = result
        self._draw(result)
        self.table.setRowCount(len(result.rows))
        for r, row in enumerate(result.rows):
            scheme = row.scheme + (f" (as {row.applied})" if row.applied else "")
            cells = (scheme, f"{row.bpw:.3f}", f"{row.snr_db:.2f}", f"{row.mse:.3e}", f"{row.cosine:.6f}")
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        rows, cols = result.shape
        set_status(
            self.status,
            f"{result.tensor}: {rows} × {cols}, {len(result.rows)} schemes in {result.seconds:.1f} s."
            + (f" Skipped: {'; '.join(result.skipped)}." if result.skipped else ""),
        )
        self.summary.setText(_summary(result))
        self.resultShown.emit(result)

    def _clear(self) -> None:
        for plot, item in self._items:
            plot.removeItem(item)
        self._items = []
        for plot in (self.plot, self.group_plot):
            legend = plot.getPlotItem().legend
            if legend is not None:
                legend.clear()

    def _add(self, plot: Any, item: Any) -> Any:
        plot.addItem(item)
        self._items.append((plot, item))
        return item

    def _draw(self, result: Any) -> None:
        for plot in (self.plot, self.group_plot):
            set_placeholder(plot, None)
        self.cliff_line.show()
        self._clear()
        c = plot_colors(bool(self.state.dark))
        # The cliff lives at 2-6 bits: 16-bit rows stay in the table, off the chart; a type the weights
        # already sit on (a model dequantized from Q4_1 re-rounds to Q4_1 exactly) is drawn at the top.
        near = [r.snr_db for r in result.rows if r.bpw <= CHART_MAX_BPW and r.snr_db < EXACT_SNR_DB]
        top = max(near, default=40.0) + 8

        def y(r: Any) -> float:
            return r.snr_db if r.snr_db < top else top - 3

        for i, (label, gran, group, sym) in enumerate(SERIES):
            rows = result.series(gran, group, sym)
            if not rows:
                continue
            colour = series_color(i)
            self._add(
                self.plot,
                pg.PlotDataItem(
                    [r.bpw for r in rows],
                    [_snr(r.snr_db) for r in rows],
                    pen=pg.mkPen(colour, width=2),
                    symbol="o",
                    symbolSize=6,
                    symbolBrush=pg.mkBrush(colour),
                    name=label,
                ),
            )
        gguf = [r for r in result.rows if r.kind == "gguf" and not r.applied]
        if gguf:
            self._add(
                self.plot,
                pg.ScatterPlotItem(
                    [r.bpw for r in gguf],
                    [y(r) for r in gguf],
                    symbol="d",
                    size=9,
                    brush=pg.mkBrush(c["fg"]),
                    pen=pg.mkPen(None),
                    name="GGUF types",
                ),
            )
            for r in gguf:
                exact = r.snr_db >= top
                t = pg.TextItem(
                    r.scheme + (" (exact: on its grid)" if exact else ""), color=c["fg"], anchor=(0, 1)
                )
                t.setPos(r.bpw, y(r))
                self._add(self.plot, t)
        self.cliff_line.setValue(result.cliff_snr_db)
        self.cliff_line.label.setFormat(f"cliff: SNR {result.cliff_snr_db:g} dB")
        for cliff in result.cliffs:
            if cliff.granularity == "per-channel" and cliff.symmetric and cliff.bpw_at_line is not None:
                mark = pg.InfiniteLine(pos=cliff.bpw_at_line, angle=90, movable=False)
                mark.setPen(pg.mkPen(c["outlier"], width=1, style=Qt.PenStyle.DashLine))
                self._add(self.plot, mark)
        self.plot.setXRange(1.5, CHART_MAX_BPW, padding=0)
        self.plot.setYRange(min(0.0, *near), top, padding=0)
        # group-size curves: one line per bit width, SNR against log2(group)
        bits = sorted({r.bits for r in result.rows if r.kind == "int" and r.granularity == "group"})
        for i, b in enumerate(b for b in bits if b <= 8):
            pts = sorted(
                (r.group, r.snr_db)
                for r in result.rows
                if r.kind == "int" and r.granularity == "group" and r.bits == b and not r.symmetric
            )
            if pts:
                colour = series_color(i)
                self._add(
                    self.group_plot,
                    pg.PlotDataItem(
                        [math.log2(g) for g, _ in pts],
                        [_snr(s) for _, s in pts],
                        pen=pg.mkPen(colour, width=2),
                        symbol="o",
                        symbolSize=6,
                        symbolBrush=pg.mkBrush(colour),
                        name=f"INT{b}",
                    ),
                )
        groups = sorted({r.group for r in result.rows if r.kind == "int" and r.granularity == "group"})
        self.group_plot.getAxis("bottom").setTicks([[(math.log2(g), str(g)) for g in groups]])

    def plotted_series(self) -> dict[str, list[tuple[float, float]]]:
        """Each drawn line's (x, y) points by its legend name, in both charts."""
        out: dict[str, list[tuple[float, float]]] = {}
        for plot, item in self._items:
            if isinstance(item, pg.PlotDataItem) and item.name():
                key = item.name() if plot is self.plot else f"group {item.name()}"
                xs, ys = item.xData, item.yData
                out[key] = [(float(x), float(y)) for x, y in zip(xs, ys, strict=True)]
        return out

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        c = plot_colors(dark)
        for plot in (self.plot, self.group_plot):
            style_plot(plot, dark)
        self.cliff_line.setPen(pg.mkPen(c["outlier"], width=2, style=Qt.PenStyle.DashLine))
        self.cliff_line.label.setColor(c["outlier"])
        if self.result is not None:
            self._draw(self.result)


def _summary(result: Any) -> str:
    """The sweep in words: where the per-channel cliff is, and how group size ranks at 4 bits."""
    parts = []
    for cliff in result.cliffs:
        if cliff.granularity == "per-channel" and cliff.symmetric:
            parts.append(
                f"Per-channel symmetric INT stays above {result.cliff_snr_db:g} dB down to "
                f"{cliff.lowest_good_bits} bits; below that is the cliff."
                if cliff.lowest_good_bits is not None
                else f"Per-channel symmetric INT is below {result.cliff_snr_db:g} dB at every width."
            )
    at4 = {
        r.group: r.snr_db
        for r in result.rows
        if r.kind == "int" and r.granularity == "group" and r.bits == 4 and not r.symmetric
    }
    if at4:
        ranked = " > ".join(f"g{g} {at4[g]:.1f} dB" for g in sorted(at4, key=lambda g: -at4[g]))
        parts.append(f"At 4 bits (asymmetric), by SNR: {ranked}.")
    return " ".join(parts)
