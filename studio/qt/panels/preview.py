"""Quantization preview of the selected tensor: SNR, cosine, error histogram, overlaid histograms, worst channels.

The numbers come from ``studio.core.preview.preview_tensor`` run in a job; this widget shows them.
With an importance matrix in the state (computed on the Calibrate page or loaded there), "with
imatrix" quantizes as llama-quantize does with it, and the activation-weighted MSE shows what the
layer's output loses.
"""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.preview import PreviewResult, block_schemes, generic_schemes, imatrix_entry, preview_tensor
from studio.qt import widgets
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread, choose, page_layout, read_only_table
from studio.qt.placeholder import set_placeholder
from studio.qt.state import StudioState
from studio.qt.theme import ERROR_FILL_ALPHA, fill_color, follow_theme, plot_colors, style_plot

__all__ = ["PreviewPanel", "format_db"]

EMPTY_TEXT = "Select a tensor and press Preview to see its quantization error"

DEFAULT_QTYPE = "Q4_K"


def format_db(v: float) -> str:
    """``22.93 dB`` (or ``inf dB`` for a lossless round trip)."""
    return f"{v:.2f} dB" if math.isfinite(v) else f"{v} dB"


class PreviewPanel(JobPanel, QWidget):
    """Quantize the selected tensor to a chosen qtype and show what it costs.

    The qtypes offered are the GGUF block types, then generic INT/FP8 ones (for analysis only: a GGUF
    file cannot hold them).
    """

    previewShown = Signal(object)  # the PreviewResult just drawn
    errorShown = Signal(str)

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.init_task(state, jobs, "quantize")
        self.result: PreviewResult | None = None
        self._key: tuple[str, str, bool] | None = None  # (tensor, qtype, with imatrix) of the newest preview
        self._build(DEFAULT_QTYPE)
        state.tensorSelected.connect(self._on_tensor_selected)
        state.imatrixChanged.connect(lambda _im: self.update_controls())
        state.modelOpened.connect(lambda _c: self.clear())
        state.modelClosed.connect(self.clear)
        follow_theme(state, self._apply_theme)
        self._on_tensor_selected(state.selected_tensor)

    def _build(self, default_qtype: str) -> None:
        self.qtype_combo = QComboBox(self)
        for q in block_schemes():
            self.qtype_combo.addItem(q)
        self.qtype_combo.insertSeparator(self.qtype_combo.count())
        for q in generic_schemes():
            self.qtype_combo.addItem(q)
        choose(self.qtype_combo, default_qtype, by_text=True)
        self.imatrix_check = QCheckBox("with imatrix", self)
        self.imatrix_check.setChecked(True)
        self.imatrix_check.setToolTip(
            "Quantize with the importance matrix (Calibrate page) as llama-quantize does; Q8_0 ignores it"
        )
        self.run_button = widgets.button(
            "Preview", self, self.start, tip="Quantize the selected tensor to this type and measure the error"
        )
        self.tensor_label = QLabel("No tensor selected.", self)
        top = QHBoxLayout()
        top.addWidget(self.tensor_label, 1)
        top.addWidget(QLabel("Type:", self))
        top.addWidget(self.qtype_combo)
        top.addWidget(self.imatrix_check)
        top.addWidget(self.run_button)

        self.status = QLabel("", self)
        self.status.setWordWrap(True)
        self.snr_label = QLabel("–", self)
        self.cosine_label = QLabel("–", self)
        self.mse_label = QLabel("–", self)
        self.maxerr_label = QLabel("–", self)
        self.bpw_label = QLabel("–", self)
        self.wmse_label = QLabel("–", self)
        self.wmse_label.setToolTip(
            "Each column's squared error weighted by its mean x² in the calibration run"
        )
        self.applied_label = QLabel("–", self)
        self.applied_label.setWordWrap(True)
        form = QFormLayout()
        form.addRow("SNR", self.snr_label)
        form.addRow("cosine similarity", self.cosine_label)
        form.addRow("MSE", self.mse_label)
        form.addRow("max |error|", self.maxerr_label)
        form.addRow("activation-weighted MSE", self.wmse_label)
        form.addRow("bits per weight", self.bpw_label)
        form.addRow("type used", self.applied_label)

        self.err_plot = pg.PlotWidget(self)
        ep = self.err_plot.getPlotItem()
        ep.setTitle("Error (dequantized − original)")
        ep.setLabel("left", "log10(1 + count)")
        self.err_item = ep.plot([0.0, 1.0], [0.0], stepMode="center", fillLevel=0)
        self.overlay_plot = pg.PlotWidget(self)
        op = self.overlay_plot.getPlotItem()
        op.setTitle("Original and dequantized values")
        op.setLabel("left", "log10(1 + count)")
        op.addLegend(offset=(-10, 10))
        self.orig_item = op.plot([0.0, 1.0], [0.0], stepMode="center", name="original")
        self.deq_item = op.plot([0.0, 1.0], [0.0], stepMode="center", name="dequantized")

        self.worst_table = read_only_table(self, ["channel", "MSE", "SNR (dB)", "absmax"])
        self.worst_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)

        side = QWidget(self)
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addLayout(form)
        sl.addWidget(QLabel("Worst output channels:", self))
        sl.addWidget(self.worst_table, 1)

        plots = QSplitter(Qt.Orientation.Vertical, self)
        plots.addWidget(self.overlay_plot)
        plots.addWidget(self.err_plot)
        for plot in (self.overlay_plot, self.err_plot):
            set_placeholder(plot, EMPTY_TEXT)
        page_layout(self, top, self.status, plots, side, 3)

    # -- public -----------------------------------------------------------------------------------

    @property
    def qtype(self) -> str:
        """The qtype chosen in the combo."""
        return self.qtype_combo.currentText()

    def set_qtype(self, qtype: str) -> None:
        """Choose ``qtype`` in the combo (ValueError if it is not offered)."""
        if not choose(self.qtype_combo, qtype, by_text=True):
            raise ValueError(f"qtype {qtype!r} is not offered")

    def imatrix_for(self, name: str) -> Any:
        """The state's importance matrix if it has an entry for ``name`` (and "with imatrix" is on), else None."""
        im, info = self.state.imatrix, self.state.info
        if im is None or info is None or not name or not self.imatrix_check.isChecked():
            return None
        try:
            imatrix_entry(im, info, name)
        except StudioError:
            return None
        return im

    @Slot()
    def start(self) -> None:
        """Preview the chosen qtype on the selected tensor (ignored while the same preview runs)."""
        assert_gui_thread("PreviewPanel.start")
        ckpt = self.state.checkpoint
        name = self.state.selected_tensor
        if ckpt is None or not name:
            return
        imatrix = self.imatrix_for(name)
        key = (name, self.qtype, imatrix is not None)
        if self.running and self._key == key:
            # Repeated clicks start one job (test_preview.py::test_five_rapid_clicks_start_one_job).
            return
        self._key = key
        qtype = key[1]
        with_im = " with the imatrix" if imatrix is not None else ""
        self.status.setText(f"Quantizing {name} to {qtype}{with_im}…")

        def work(ctx: Any) -> PreviewResult:
            return preview_tensor(ckpt, name, qtype, imatrix=imatrix, ctx=ctx)

        self.task.start(f"Preview {qtype}{with_im} on {name}", work)
        self.update_controls()

    @Slot()
    def clear(self) -> None:
        """Forget the shown preview."""
        assert_gui_thread("PreviewPanel.clear")
        self.task.cancel(quiet=True)
        self._key = None
        self.result = None
        for item in (self.err_item, self.orig_item, self.deq_item):
            item.setData([0.0, 1.0], [0.0], stepMode="center")
        for plot in (self.overlay_plot, self.err_plot):
            set_placeholder(plot, EMPTY_TEXT)
        for lab in (
            self.snr_label,
            self.cosine_label,
            self.mse_label,
            self.maxerr_label,
            self.bpw_label,
            self.wmse_label,
        ):
            lab.setText("–")
        self.applied_label.setText("–")
        self.worst_table.setRowCount(0)
        self.status.setText("")
        self._on_tensor_selected(self.state.selected_tensor)

    def show_result(self, r: PreviewResult) -> None:
        """Draw ``r`` (GUI thread only)."""
        assert_gui_thread("PreviewPanel.show_result")
        self.result = r
        m = r.metrics
        self.snr_label.setText(format_db(m.snr_db))
        self.cosine_label.setText(f"{m.cosine:.6f}")
        self.mse_label.setText(f"{m.mse:.4g}")
        self.maxerr_label.setText(f"{m.max_abs_error:.4g}")
        self.wmse_label.setText("–" if r.weighted_mse is None else f"{r.weighted_mse:.4g}")
        self.bpw_label.setText(f"{r.bits_per_weight:.4g}" if math.isfinite(r.bits_per_weight) else "–")
        applied = r.applied if r.fallback_reason is None else f"{r.applied} (fallback: {r.fallback_reason})"
        self.applied_label.setText(applied)
        for plot in (self.overlay_plot, self.err_plot):
            set_placeholder(plot, None)
        self.err_item.setData(r.error_hist.edges, r.error_hist.log_counts(), stepMode="center", fillLevel=0)
        self.orig_item.setData(r.original_hist.edges, r.original_hist.log_counts(), stepMode="center")
        self.deq_item.setData(r.dequantized_hist.edges, r.dequantized_hist.log_counts(), stepMode="center")
        self.worst_table.setRowCount(len(r.worst_channels))
        for i, ch in enumerate(r.worst_channels):
            for j, v in enumerate((str(ch.index), f"{ch.mse:.4g}", f"{ch.snr_db:.2f}", f"{ch.absmax:.4g}")):
                self.worst_table.setItem(i, j, QTableWidgetItem(v))
        self.status.setText(f"{r.name}: {r.scheme}" + (" with the imatrix" if r.imatrix_used else ""))
        self.previewShown.emit(r)

    # -- slots ------------------------------------------------------------------------------------

    def on_done(self, result: PreviewResult) -> None:
        self.update_controls()
        self.show_result(result)

    @Slot(str)
    def _on_tensor_selected(self, name: str) -> None:
        self.tensor_label.setText(f"<b>{name}</b>" if name else "No tensor selected.")
        self.update_controls()

    def update_controls(self) -> None:
        ok = self.state.checkpoint is not None and bool(self.state.selected_tensor)
        self.run_button.setEnabled(ok and not self.running)
        has = self.state.imatrix is not None
        self.imatrix_check.setEnabled(has and not self.running)
        self.imatrix_check.setText("with imatrix" if has else "with imatrix (none: Calibrate page)")

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        c = plot_colors(dark)
        style_plot(self.err_plot, dark)
        style_plot(self.overlay_plot, dark)
        self.err_item.setPen(pg.mkPen(c["outlier"]))
        self.err_item.setBrush(fill_color(c["outlier"], ERROR_FILL_ALPHA))
        self.orig_item.setPen(pg.mkPen(c["main"], width=2))
        self.deq_item.setPen(pg.mkPen(c["second"], width=1, style=Qt.PenStyle.DashLine))
