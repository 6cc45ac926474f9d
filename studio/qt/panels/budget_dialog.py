"""The budget plan dialog: scan the open model's sensitivity, move a budget along the predicted size/KL
front (llama.cpp's presets as points on it), see where the KL comes from (a heat map of layers × roles and
the most sensitive tensors; a click opens the tensor in the inspector), and hand the chosen plan to the
plan editor. After the plan is exported (or on Measure) a job measures its KL with every tensor quantized
at once, and the dialog shows it next to the prediction, as a point on the front.

A thin face over ``studio.core.calib.sensitivity`` (the scan and the measurement, in a job),
``studio.core.calib.sensitivity_map`` (the map and the ranking) and ``studio.core.quant.allocate`` (the
front, the presets' points and the plan for a budget, instant).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSlider,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.jobs import JobContext
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.state import StudioState
from studio.qt.theme import follow_theme, plot_colors, set_status, style_plot

__all__ = ["PLAN_TYPES", "BudgetDialog", "Measured", "bits_colour"]

PRESETS = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
PLAN_TYPES = "plan"  # the map's choice "each tensor at the plan's type"
DEFAULT_MAP_TYPE = "Q4_K"
TOP_N = 20  # bars of the ranked chart by default
KL_FLOOR = 1e-9  # a KL of 0 (all F16) on the front's log axis


def _log(kl: float) -> float:
    """The front's y: log10 KL (the axis shows it as KL)."""
    return math.log10(max(kl, KL_FLOOR))


def bits_colour(bpw: float) -> QColor:
    """Red at 2 bits per weight through yellow to green at 16 (the plan table's colouring)."""
    t = min(1.0, max(0.0, (bpw - 2.0) / 14.0))
    return QColor.fromHsvF(t / 3.0, 0.45, 0.95)


@dataclass(frozen=True)
class Measured:
    """A plan's KL measured with every tensor quantized at once (on the scan's chunks) beside its prediction."""

    what: str  # "the plan" or the exported file's name
    types: dict[str, str]  # HF name → qtype measured
    file_bytes: int
    predicted_kl: float | None  # None when the file has types the scan did not measure
    measured_kl: float
    verify_kl: float | None = None  # the export's own check (llama.cpp on its verify text), when it ran
    verify_tokens: int = 0

    def describe(self) -> str:
        """One line: predicted and measured KL (and the file's verify KL)."""
        pred = (
            "not predicted (types the scan did not measure)"
            if self.predicted_kl is None
            else (f"predicted KL {self.predicted_kl:.4f}")
        )
        text = f"{self.what}: {pred}, measured {self.measured_kl:.4f}"
        if self.predicted_kl:
            text += f" (×{self.measured_kl / self.predicted_kl:.2f})"
        text += " on the scan's chunks with every tensor quantized at once"
        if self.verify_kl is not None:
            text += f"; the file's verify KL {self.verify_kl:.4f} over {self.verify_tokens} tokens"
        return text + "."


class BudgetDialog(JobPanel, QDialog):
    """Scan, then choose a budget; ``Use plan`` makes the allocation the window's plan."""

    errorShown = Signal(str)
    planChosen = Signal(object)  # the Allocation handed to the plan editor
    tensorOpened = Signal(str)  # a heat map cell or bar was clicked: the window shows the inspector
    measuredShown = Signal(object)  # a Measured

    def __init__(self, state: StudioState, jobs: JobManager, parent: Any = None) -> None:
        QDialog.__init__(self, parent)
        self.init_task(state, jobs, "sensitivity", progress=True)
        self.setWindowTitle("Budget plan")
        self.resize(1100, 760)
        self.scan: Any = None
        self.imatrix: Any = None
        self.scan_text: Any = "builtin"
        self.front: tuple[Any, ...] = ()
        self.presets: tuple[Any, ...] = ()
        self.allocation: Any = None
        self.measured: Measured | None = None
        self._used: set[str] = set()  # names of the plans handed to the window (their exports are measured)
        self._queued: Any = None  # a measurement asked for while another job ran
        self.text_edit = QLineEdit(self, placeholderText="calibration text file (empty: the built-in text)")
        self.exclude_edit = QLineEdit(self, placeholderText="types not to choose, e.g. Q4_1,Q5_1")
        self.scan_button = QPushButton("Scan", self)
        self.budget_edit = QLineEdit(self, placeholderText="105454336, 4.5GB, 4.8bpw, vram=8GB")
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.use_button = QPushButton("Use plan", self)
        self.measure_button = QPushButton("Measure", self)
        self.measure_button.setToolTip(
            "Measure the plan's KL with every tensor quantized at once, on the scan's chunks (a job)"
        )
        self.cancel_button = QPushButton("Cancel", self)
        self.progress = QProgressBar(self)
        self.result = QLabel(self)
        self.result.setWordWrap(True)
        self.measured_label = QLabel(self)
        self.measured_label.setWordWrap(True)
        self.status = QLabel(self)
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 3, self)
        self.table.setHorizontalHeaderLabels(["tensor", "type", "bits/weight"])
        import pyqtgraph as pg

        from studio.qt.panels.sensitivity_views import RankedBars, SensitivityHeatMap

        # y is log10 KL (the front spans three decades), the left axis labels it as powers of ten
        self.plot = pg.PlotWidget(self, labels={"bottom": "file bytes", "left": "KL"})
        left = self.plot.getPlotItem().getAxis("left")
        left.setLogMode(False, True)
        left.enableAutoSIPrefix(False)  # "0.02", not "2·10¹ (×0.001)"
        self.legend = self.plot.addLegend(offset=(-10, 10))
        self.curve = self.plot.plot([], [], symbol="o", symbolSize=4, name="predicted front")
        self.preset_dots = pg.ScatterPlotItem(size=9, name="llama.cpp presets (predicted)")
        self.chosen_dot = pg.ScatterPlotItem(size=12, name="this plan (predicted)")
        self.measured_dot = pg.ScatterPlotItem(size=16, symbol="x", name="measured")
        for item in (self.preset_dots, self.chosen_dot, self.measured_dot):
            self.plot.addItem(item)
        self.preset_labels: list[Any] = []
        self.heat = SensitivityHeatMap(state, self)
        self.bars = RankedBars(state, self)
        self.map_type = QComboBox(self)
        self.top_n = QSpinBox(self, minimum=1, maximum=1000, value=TOP_N)
        self.views = QTabWidget(self)
        self.views.addTab(self.plot, "Size/KL front")
        self.views.addTab(self._sensitivity_page(), "Sensitivity")
        self.views.addTab(self.table, "Plan table")
        row = QHBoxLayout()
        row.addWidget(self.text_edit)
        row.addWidget(self.exclude_edit)
        row.addWidget(self.scan_button)
        brow = QHBoxLayout()
        brow.addWidget(QLabel("Budget", self))
        brow.addWidget(self.budget_edit)
        brow.addWidget(self.use_button)
        brow.addWidget(self.measure_button)
        prow = QHBoxLayout()
        prow.addWidget(self.progress, 1)
        prow.addWidget(self.cancel_button)
        lay = QVBoxLayout(self)
        for w in (row, brow):
            lay.addLayout(w)
        lay.addWidget(self.slider)
        lay.addWidget(self.views, 1)
        for widget in (self.result, self.measured_label):
            lay.addWidget(widget)
        lay.addLayout(prow)
        lay.addWidget(self.status)
        self.scan_button.clicked.connect(self.start_scan)
        self.budget_edit.editingFinished.connect(self.replan)
        self.slider.valueChanged.connect(self._slid)
        self.use_button.clicked.connect(self.use_plan)
        self.measure_button.clicked.connect(self.measure_plan)
        self.cancel_button.clicked.connect(self.cancel)
        self.map_type.currentIndexChanged.connect(self.redraw_sensitivity)
        self.top_n.valueChanged.connect(self.redraw_sensitivity)
        self.heat.tensorClicked.connect(self.open_tensor)
        self.bars.tensorClicked.connect(self.open_tensor)
        state.exported.connect(self._on_exported)
        state.modelOpened.connect(self.clear)
        state.modelClosed.connect(self.clear)
        follow_theme(state, self._apply_theme)
        self.update_controls()

    def _apply_theme(self, dark: bool) -> None:
        import pyqtgraph as pg

        c = plot_colors(dark)
        style_plot(self.plot, dark)
        self.curve.setPen(pg.mkPen(c["main"]))
        self.curve.setSymbolBrush(pg.mkBrush(c["main"]))
        self.preset_dots.setBrush(pg.mkBrush(c["second"]))
        self.chosen_dot.setBrush(pg.mkBrush(c["outlier"]))
        self.measured_dot.setBrush(pg.mkBrush(c["fg"]))
        self.measured_dot.setPen(pg.mkPen(c["fg"], width=2))
        self.legend.setLabelTextColor(c["fg"])
        for label in self.preset_labels:
            label.setColor(c["fg"])

    def _sensitivity_page(self) -> QWidget:
        page = QWidget(self)
        top = QHBoxLayout()
        top.addWidget(QLabel("KL at", page))
        top.addWidget(self.map_type)
        top.addWidget(QLabel("most sensitive", page))
        top.addWidget(self.top_n)
        hint = QLabel("Click a cell or a bar to open that tensor in the inspector.", page)
        hint.setEnabled(False)
        top.addWidget(hint, 1)
        split = QSplitter(Qt.Orientation.Horizontal, page)
        split.addWidget(self.heat)
        split.addWidget(self.bars)
        split.setSizes([560, 440])
        lay = QVBoxLayout(page)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(split, 1)
        return page

    # ------------------------------------------------------------------ scan (a job)

    @Slot()
    def start_scan(self) -> None:
        """Calibrate (imatrix) and scan the open model in the background."""
        info = self.state.info
        if info is None:
            self.show_error("Open a model first.")
            return
        text = self.text_edit.text().strip() or "builtin"
        cluster = self.state.cluster  # the window's device choice: a Ray cluster runs the scan's pairs

        def work(ctx: JobContext) -> tuple[Any, Any]:
            from studio.core.calib import calibrate, imatrix_from_stats
            from studio.core.calib.sensitivity import ScanSettings, scan_sensitivity
            from studio.core.executor import open_executor

            stats = calibrate(info.path, text, device="cpu", dtype="float32", histogram=False, ctx=ctx)
            im = imatrix_from_stats(stats, info)
            executor = open_executor(cluster)
            try:
                return scan_sensitivity(
                    info.path, text, ScanSettings(), imatrix=im, ctx=ctx, executor=executor
                ), im
            finally:
                executor.close()

        self.scan_text = text
        set_status(self.status, "Scanning …")
        self.task.start("Sensitivity scan", work)
        self.update_controls()

    def on_done(self, result: Any) -> None:
        """A scan finished (show its front) or a measurement did (show it beside the prediction)."""
        if isinstance(result, Measured):
            self.show_measured(result)
        else:
            self.set_scan(*result)
        self._start_queued()

    def on_error(self, message: str) -> None:
        """The job failed: one sentence; a queued measurement still runs."""
        JobPanel.on_error(self, message)
        self._start_queued()

    def on_cancel(self) -> None:
        """The job was cancelled: nothing changes."""
        self._queued = None
        self.progress.reset()
        set_status(self.status, "Cancelled.")
        self.update_controls()

    def update_controls(self) -> None:
        """Scan while idle; choose and measure once a scan is there; cancel while a job runs."""
        self.scan_button.setEnabled(not self.running)
        self.cancel_button.setEnabled(self.running)
        for w in (self.budget_edit, self.slider, self.use_button):
            w.setEnabled(self.scan is not None and not self.running)
        self.measure_button.setEnabled(self.allocation is not None and not self.running)

    @Slot()
    def clear(self, *_: Any) -> None:
        """Forget the scan (another model was opened or the model closed)."""
        self.task.cancel(quiet=True)
        self.scan = self.imatrix = self.allocation = self.measured = self._queued = None
        self.front = self.presets = ()
        self._used.clear()
        for item in (self.curve, self.preset_dots, self.chosen_dot, self.measured_dot):
            item.setData([], [])
        self._label_presets()
        self.heat.set_grid(None)
        self.bars.set_rows((), {}, {})
        self.table.setRowCount(0)
        for label in (self.result, self.measured_label, self.status):
            label.setText("")
        self.update_controls()

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
        self.curve.setData([p.file_bytes for p in self.front], [_log(p.kl) for p in self.front])
        self.preset_dots.setData([{"pos": (p.file_bytes, _log(p.kl)), "data": p.label} for p in self.presets])
        self._label_presets()
        self.measured_dot.setData([], [])
        self.measured = None
        self.measured_label.setText("")
        self._fill_map_types(scan)
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(0, len(self.front) - 1))
        self.slider.setValue(len(self.front) // 2)
        self.slider.blockSignals(False)
        if not self.budget_edit.text().strip() and self.front:
            self.budget_edit.setText(str(self.front[len(self.front) // 2].file_bytes))
        self.update_controls()
        self.replan()
        self.redraw_sensitivity()

    def _fill_map_types(self, scan: Any) -> None:
        self.map_type.blockSignals(True)
        self.map_type.clear()
        self.map_type.addItem("the plan's type", PLAN_TYPES)
        for q in scan.types:
            self.map_type.addItem(q, q)
        i = self.map_type.findData(DEFAULT_MAP_TYPE)
        self.map_type.setCurrentIndex(i if i >= 0 else min(1, self.map_type.count() - 1))
        self.map_type.blockSignals(False)

    def _label_presets(self) -> None:
        import pyqtgraph as pg

        for label in self.preset_labels:
            self.plot.removeItem(label)
        self.preset_labels = []
        fg = plot_colors(self.state.dark)["fg"]
        for p in self.presets:
            label = pg.TextItem(p.label, color=fg, anchor=(0.5, 1.2))
            label.setPos(p.file_bytes, _log(p.kl))
            self.plot.addItem(label)
            self.preset_labels.append(label)

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
            self.update_controls()
            self.show_error(str(err))
            return
        self.allocation = a
        self.chosen_dot.setData([a.file_bytes], [_log(a.predicted_kl)])
        self.result.setText(
            f"{a.file_bytes:,} B file, {a.bpw:.2f} bpw, predicted KL {a.predicted_kl:.4f}"
            + (f", measured {a.measured_kl:.4f}" if a.measured_kl is not None else "")
        )
        set_status(self.status, " ".join(a.notes))
        self._fill_table(a)
        self.update_controls()
        if self.map_type.currentData() == PLAN_TYPES:
            self.redraw_sensitivity()

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
        """Make the chosen plan the window's plan (the plan editor shows it) and the scan's imatrix the window's."""
        if self.allocation is None:
            return
        self._used.add(self.allocation.plan.name)
        if self.imatrix is not None:
            # The plan was chosen (and is measured) with the scan's imatrix: the export quantizes with it too.
            self.state.set_imatrix(self.imatrix)
        self.state.set_plan(self.allocation.plan)
        self.planChosen.emit(self.allocation)

    # ------------------------------------------------------------------ where the KL comes from

    def map_types(self) -> Any:
        """What the map and the bars read: one qtype, or the plan's HF name → qtype (None without a plan)."""
        key = self.map_type.currentData()
        if key == PLAN_TYPES:
            return None if self.allocation is None else dict(self.allocation.plan.types)
        return key

    @Slot()
    def redraw_sensitivity(self, *_: Any) -> None:
        """Draw the heat map and the ranked bars at the chosen type."""
        from studio.core.calib.sensitivity_map import ranked_tensors, sensitivity_grid

        types = self.map_types() if self.scan is not None else None
        if types is None:
            self.heat.set_grid(None)
            self.bars.set_rows((), {}, {})
            return
        self.heat.set_grid(sensitivity_grid(self.scan, types))
        labels = {t.name: t.gguf_name for t in self.scan.tensors}
        roles = {t.name: t.role for t in self.scan.tensors}
        self.bars.set_rows(ranked_tensors(self.scan, types, self.top_n.value()), labels, roles)

    @Slot(str)
    def open_tensor(self, name: str) -> None:
        """Select ``name`` in the window (the inspector shows it) and announce it."""
        self.state.select_tensor(name)
        self.tensorOpened.emit(name)

    # ------------------------------------------------------------------ measured KL (a job)

    @Slot()
    def measure_plan(self) -> None:
        """Measure the chosen plan's KL (every tensor quantized at once) in the background."""
        a = self.allocation
        if a is None:
            return
        self._measure("the plan", dict(a.plan.types), a.file_bytes)

    @Slot(object)
    def _on_exported(self, outcome: Any) -> None:
        # Only a plan this dialog handed out, of the model it scanned: a preset's export costs no job.
        r = outcome.result
        if self.scan is None or r.plan_name not in self._used:
            return
        by_gguf = {t.gguf_name: t.name for t in self.scan.tensors}
        types = {by_gguf[g]: q for g, q in r.tensor_types.items() if g in by_gguf}
        if len(types) != len(self.scan.tensors):
            return  # not this scan's model
        v = outcome.verification
        verify = getattr(v, "mean_kl", None) if v is not None else None
        self._measure(r.path.name, types, r.file_bytes, verify, int(getattr(v, "n_tokens", 0) or 0))

    def _measure(
        self, what: str, types: dict[str, str], file_bytes: int, verify_kl: Any = None, verify_tokens: int = 0
    ) -> None:
        info, scan, imatrix, text = self.state.info, self.scan, self.imatrix, self.scan_text
        if info is None or scan is None:
            return
        try:
            predicted: float | None = scan.predicted_kl(types)
        except KeyError:
            predicted = None

        def work(ctx: JobContext) -> Measured:
            from studio.core.calib.sensitivity import ScanSettings, measure_plans

            (kl,) = measure_plans(info.path, [types], text, ScanSettings(), imatrix=imatrix, ctx=ctx)
            return Measured(what, types, file_bytes, predicted, kl, verify_kl, verify_tokens)

        if self.running:
            self._queued = (what, work)  # after the running job
            set_status(self.status, f"Measuring {what} once the running job ends …")
            return
        self._start_measure(what, work)

    def _start_measure(self, what: str, work: Any) -> None:
        set_status(self.status, f"Measuring {what} …")
        self.task.start(f"Measuring the KL of {what}", work)
        self.update_controls()

    def _start_queued(self) -> None:
        queued, self._queued = self._queued, None
        if queued is not None and not self.running:
            self._start_measure(*queued)

    def show_measured(self, m: Measured) -> None:
        """Show a measurement beside its prediction, and as a point on the front."""
        self.measured = m
        self.progress.reset()
        self.measured_dot.setData([m.file_bytes], [_log(m.measured_kl)])
        self.measured_label.setText(m.describe())
        set_status(self.status, "")
        self.update_controls()
        self.measuredShown.emit(m)
