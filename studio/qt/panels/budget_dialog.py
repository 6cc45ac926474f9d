"""The budget plan dialog: scan the open model's sensitivity, move a budget along the predicted size/KL
front (llama.cpp's presets as points on it), and hand the chosen plan to the plan editor.

A thin face over ``studio.core.calib.sensitivity`` (the scan, in a job) and
``studio.core.quant.allocate`` (the front, the presets' points and the plan for a budget, instant).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from studio.core.errors import StudioError
from studio.core.jobs import JobContext
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.state import StudioState
from studio.qt.theme import set_status

__all__ = ["BudgetDialog", "bits_colour"]

PRESETS = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")


def bits_colour(bpw: float) -> QColor:
    """Red at 2 bits per weight through yellow to green at 16 (the plan table's colouring)."""
    t = min(1.0, max(0.0, (bpw - 2.0) / 14.0))
    return QColor.fromHsvF(t / 3.0, 0.45, 0.95)


class BudgetDialog(JobPanel, QDialog):
    """Scan, then choose a budget; ``Use plan`` makes the allocation the window's plan."""

    errorShown = Signal(str)
    planChosen = Signal(object)  # the Allocation handed to the plan editor

    def __init__(self, state: StudioState, jobs: JobManager, parent: Any = None) -> None:
        QDialog.__init__(self, parent)
        self.init_task(state, jobs, "sensitivity")
        self.setWindowTitle("Budget plan")
        self.scan: Any = None
        self.imatrix: Any = None
        self.front: tuple[Any, ...] = ()
        self.presets: tuple[Any, ...] = ()
        self.allocation: Any = None
        self.text_edit = QLineEdit(self, placeholderText="calibration text file (empty: the built-in text)")
        self.exclude_edit = QLineEdit(self, placeholderText="types not to choose, e.g. Q4_1,Q5_1")
        self.scan_button = QPushButton("Scan", self)
        self.budget_edit = QLineEdit(self, placeholderText="105454336, 4.5GB, 4.8bpw, vram=8GB")
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.use_button = QPushButton("Use plan", self)
        self.result = QLabel(self)
        self.status = QLabel(self)
        self.table = QTableWidget(0, 3, self)
        self.table.setHorizontalHeaderLabels(["tensor", "type", "bits/weight"])
        import pyqtgraph as pg

        self.plot = pg.PlotWidget(self, labels={"bottom": "file bytes", "left": "predicted KL"})
        self.curve = self.plot.plot([], [], pen="c", symbol="o", symbolSize=4)
        self.preset_dots = pg.ScatterPlotItem(size=9, brush="y")
        self.chosen_dot = pg.ScatterPlotItem(size=12, brush="r")
        self.plot.addItem(self.preset_dots)
        self.plot.addItem(self.chosen_dot)
        row = QHBoxLayout()
        row.addWidget(self.text_edit)
        row.addWidget(self.exclude_edit)
        row.addWidget(self.scan_button)
        brow = QHBoxLayout()
        brow.addWidget(QLabel("Budget", self))
        brow.addWidget(self.budget_edit)
        brow.addWidget(self.use_button)
        lay = QVBoxLayout(self)
        for w in (row, brow):
            lay.addLayout(w)
        for widget in (self.slider, self.plot, self.result, self.table, self.status):
            lay.addWidget(widget)
        self.scan_button.clicked.connect(self.start_scan)
        self.budget_edit.editingFinished.connect(self.replan)
        self.slider.valueChanged.connect(self._slid)
        self.use_button.clicked.connect(self.use_plan)
        self.update_controls()

    # ------------------------------------------------------------------ scan (a job)

    @Slot()
    def start_scan(self) -> None:
        """Calibrate (imatrix) and scan the open model in the background."""
        info = self.state.info
        if info is None:
            self.show_error("Open a model first.")
            return
        text = self.text_edit.text().strip() or "builtin"

        def work(ctx: JobContext) -> tuple[Any, Any]:
            from studio.core.calib import calibrate, imatrix_from_stats
            from studio.core.calib.sensitivity import ScanSettings, scan_sensitivity

            stats = calibrate(info.path, text, device="cpu", dtype="float32", histogram=False, ctx=ctx)
            im = imatrix_from_stats(stats, info)
            return scan_sensitivity(info.path, text, ScanSettings(), imatrix=im, ctx=ctx), im

        set_status(self.status, "Scanning …")
        self.task.start("Sensitivity scan", work)
        self.update_controls()

    def on_done(self, result: Any) -> None:
        """The scan finished: show its front."""
        self.set_scan(*result)

    def update_controls(self) -> None:
        """Scan while idle; choose once a scan is there."""
        self.scan_button.setEnabled(not self.running)
        for w in (self.budget_edit, self.slider, self.use_button):
            w.setEnabled(self.scan is not None and not self.running)

    # ------------------------------------------------------------------ budget (instant)

    def _exclude(self) -> tuple[str, ...]:
        return tuple(t.strip().upper() for t in self.exclude_edit.text().split(",") if t.strip())

    def set_scan(self, scan: Any, imatrix: Any = None) -> None:
        """Show ``scan``'s size/KL front and the presets on it, and plan for the budget field (or the middle)."""
        from studio.core.quant.allocate import pareto_front, preset_points

        info = self.state.info
        self.scan, self.imatrix = scan, imatrix
        ex = self._exclude()
        cands = tuple(q for q in scan.types if q not in ex)
        self.front = pareto_front(info, scan, candidates=cands, exclude=ex)
        self.presets = preset_points(info, scan, PRESETS)
        self.curve.setData([p.file_bytes for p in self.front], [p.kl for p in self.front])
        self.preset_dots.setData([{"pos": (p.file_bytes, p.kl), "data": p.label} for p in self.presets])
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(0, len(self.front) - 1))
        self.slider.setValue(len(self.front) // 2)
        self.slider.blockSignals(False)
        if not self.budget_edit.text().strip() and self.front:
            self.budget_edit.setText(str(self.front[len(self.front) // 2].file_bytes))
        self.update_controls()
        self.replan()

    @Slot(int)
    def _slid(self, i: int) -> None:
        if 0 <= i < len(self.front):
            self.budget_edit.setText(str(self.front[i].file_bytes))
            self.replan()

    @Slot()
    def replan(self) -> None:
        """The plan for the budget field from the scan (no model runs); a bad budget is one sentence."""
        if self.scan is None:
            return
        from studio.core.quant.allocate import allocate, parse_budget

        info = self.state.info
        ex = self._exclude()
        try:
            a = allocate(
                info,
                self.scan,
                parse_budget(self.budget_edit.text()),
                candidates=tuple(q for q in self.scan.types if q not in ex),
                exclude=ex,
                imatrix=self.imatrix,
                method="imatrix",
            )
        except StudioError as err:
            self.allocation = None
            self.show_error(str(err))
            return
        self.allocation = a
        self.chosen_dot.setData([a.file_bytes], [a.predicted_kl])
        self.result.setText(
            f"{a.file_bytes:,} B file, {a.bpw:.2f} bpw, predicted KL {a.predicted_kl:.4f}"
            + (f", measured {a.measured_kl:.4f}" if a.measured_kl is not None else "")
        )
        set_status(self.status, " ".join(a.notes))
        self._fill_table(a)

    def _fill_table(self, a: Any) -> None:
        from studio.core.quant.types import QTYPES

        rows = [(t.name, a.plan.types[t.name]) for t in self.scan.tensors]
        self.table.setRowCount(len(rows))
        for r, (name, q) in enumerate(rows):
            bpw = QTYPES[q].bits_per_weight
            items = (QTableWidgetItem(name), QTableWidgetItem(q), QTableWidgetItem(f"{bpw:.2f}"))
            for c, it in enumerate(items):
                it.setBackground(bits_colour(bpw))
                self.table.setItem(r, c, it)

    @Slot()
    def use_plan(self) -> None:
        """Make the chosen plan the window's plan (the plan editor shows it)."""
        if self.allocation is None:
            return
        self.state.set_plan(self.allocation.plan)
        self.planChosen.emit(self.allocation)
