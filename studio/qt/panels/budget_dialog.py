"""The budget plan dialog: scan the open model's sensitivity, move a budget along the predicted size/KL
front (llama.cpp's presets as points on it), see where the KL comes from (a heat map of layers × roles and
the most sensitive tensors; a click opens the tensor in the inspector), and hand the chosen plan to the
plan editor. After the plan is exported (or on Measure) a job measures its KL with every tensor quantized
at once, and the dialog shows it next to the prediction, as a point on the front. As on the command line,
the scan keeps the last quarter of the calibration text held out (or a held-out file beside it): llama.cpp's
presets are measured on it and drawn on the same axes, the measurement adds the plan's held-out KL, and a
plan that does not beat the same-size preset there says so in one sentence (``studio.core.calib.heldout``).

A thin face over ``studio.core.calib.sensitivity`` (the scan and the measurement, in a job),
``studio.core.calib.sensitivity_map`` (the map and the ranking) and ``studio.core.plan.allocate`` (the
front, the presets' points and the plan for a budget, instant).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QColor, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
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

from studio.core.calib.budget_job import budget_job
from studio.core.calib.data import BUILTIN, guess_chunks
from studio.core.calib.heldout import (
    UNGUARDED_NOTE,
    guarded_scan,
    judge_against_points,
    preset_heldout_points,
    preset_plans,
    same_size_preset,
    texts,
)
from studio.core.calib.pipeline import calibrate_then_scan
from studio.core.calib.scan_settings import default_types
from studio.core.calib.sensitivity import ScanSettings, measure_plans
from studio.core.calib.sensitivity_map import ranked_tensors, sensitivity_grid
from studio.core.calib.stored_types import with_stored_copies
from studio.core.cluster import open_executor
from studio.core.errors import StudioError
from studio.core.evaluate.last_word import LastWordCheck, last_word_of_plan
from studio.core.export.verify import default_text
from studio.core.jobs import JobContext
from studio.core.model.rotate import RotatedCheckpoint, Rotation, rotation_of
from studio.core.plan.allocate import allocate, pareto_front, parse_budget, preset_points
from studio.core.quant.types import QTYPES
from studio.core.quant.warm import ensure_compiled
from studio.core.units import format_bytes, format_eta
from studio.qt import folders
from studio.qt.jobs import JobManager
from studio.qt.origin import inherited_types
from studio.qt.panel_job import JobPanel, PanelJob
from studio.qt.panels.plot_axes import BpwAxis, SizeAxis
from studio.qt.panels.sensitivity_views import RankedBars, SensitivityHeatMap
from studio.qt.state import StudioState
from studio.qt.theme import follow_theme, plot_colors, set_status, style_plot

__all__ = ["PLAN_TYPES", "BudgetDialog", "Measured", "Planned", "bits_colour", "last_word_check"]

PRESETS = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
PLAN_TYPES = "plan"  # the map's choice "each tensor at the plan's type"
DEFAULT_MAP_TYPE = "Q4_K"
TOP_N = 20  # bars of the ranked chart by default
KL_FLOOR = 1e-9  # a KL of 0 (all F16) on the front's log axis
SLIDER_PLAN_MS = 150  # the slider re-plans once it rests this long
ETA_WINDOW_S = 20.0  # the scan's ETA follows its rate over the last seconds of the current phase
ETA_MIN_S = 3.0  # no ETA before the phase has run this long


def _log(kl: float) -> float:
    """The front's y: log10 KL (the axis shows it as KL)."""
    return math.log10(max(kl, KL_FLOOR))


def bits_colour(bpw: float) -> QColor:
    """Red at 2 bits per weight through yellow to green at 16 (the plan table's colouring)."""
    t = min(1.0, max(0.0, (bpw - 2.0) / 14.0))
    return QColor.fromHsvF(t / 3.0, 0.45, 0.95)


def last_word_check(
    info: Any, predicted_kl: float, presets: Any, limit_bytes: int, heldout: Any, imatrix: Any
) -> LastWordCheck:
    """What llama.cpp's last word on a scan's plan needs, as ``export --budget`` builds it: the ``heldout``
    text (the verify text without one), the largest of llama.cpp's ``presets`` (``preset_plans``: i-quants
    too) within ``limit_bytes``, and the scan's ``imatrix``."""
    same = same_size_preset(list(presets), limit_bytes)
    return LastWordCheck(
        info,
        predicted_kl=predicted_kl,
        text=heldout.text if heldout is not None else default_text(),
        preset=None if same is None else same[0],
        imatrix=imatrix,
    )


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
    judgement: Any = None  # heldout.Judgement: the plan and the same-size preset on held-out text
    llama: Any = None  # evaluate.last_word.LastWord: llama.cpp's own KL of the file and of the preset

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
        text += "."
        if self.judgement is not None:  # beside the prediction: how the plan fares on text it never saw
            text += f" Held-out KL {self.judgement.heldout_kl:.4f}. {self.judgement.verdict}"
        if self.llama is not None:  # llama.cpp has the last word
            text += f" {self.llama.sentence}"
        return text


@dataclass(frozen=True)
class Planned:
    """What a planning job computed: the front and presets (when asked) and the plan for a budget."""

    budget: str  # the budget text planned for
    front: tuple[Any, ...] | None  # None: the front drawn already stands
    presets: tuple[Any, ...] | None
    allocation: Any  # the Allocation, or None when the budget was refused
    error: str = ""  # the one sentence of a refused budget
    preset_plans: Any = (
        None  # llama.cpp's presets for the model (heldout.preset_plans), kept for the next plans
    )


class BudgetDialog(JobPanel, QDialog):
    """Scan, then choose a budget; ``Use plan`` makes the allocation the window's plan.

    The scan reuses the Calibrate page's importance matrix when it was made from the same text, else
    the one the CLI cached for that text, and calibrates only when neither exists; scans are kept in
    the CLI's scan cache and, for this window, in memory. Planning (the front, the presets' points and
    the plan for a budget) runs in a job of its own, so the window never waits for it.
    """

    errorShown = Signal(str)
    planChosen = Signal(object)  # the Allocation handed to the plan editor
    planShown = Signal(object)  # the Allocation now shown (after a budget edit or a slider move)
    tensorOpened = Signal(str)  # a heat map cell or bar was clicked: the window shows the inspector
    measuredShown = Signal(object)  # a Measured

    def __init__(self, state: StudioState, jobs: JobManager, parent: Any = None) -> None:
        QDialog.__init__(self, parent)
        self.init_task(state, jobs, "sensitivity", progress=True)
        self.plan_task = PanelJob(
            jobs, "budget plan", self, on_done=self._show_planned, on_error=self._plan_failed
        )
        self.setWindowTitle("Budget plan")
        screen = QGuiApplication.primaryScreen()
        room = screen.availableGeometry() if screen is not None else None
        # a laptop's 1280×720 holds the whole dialog; a larger screen gets the comfortable size
        self.resize(
            min(1100, room.width() - 40) if room else 1100, min(760, room.height() - 40) if room else 760
        )
        self.scan: Any = None
        self.imatrix: Any = None
        self._preset_plans: Any = None
        self.scan_text: Any = "builtin"
        self.scan_settings: Any = None
        self.calibrated = False  # whether the last scan had to calibrate (it reuses an imatrix when it can)
        self._scans: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # this window's scans: key → set_scan's args
        self.heldout: Any = None  # the held-out CalibrationText plans are judged on (None: not judged)
        self.heldout_presets: tuple[Any, ...] = ()  # llama.cpp's presets measured on it (PresetPoint)
        self.front: tuple[Any, ...] = ()
        self.presets: tuple[Any, ...] = ()
        self.allocation: Any = None
        self.measured: Measured | None = None
        self._used: set[str] = set()  # names of the plans handed to the window (their exports are measured)
        self._queued: Any = None  # a measurement asked for while another job ran
        self._phase_start: tuple[float, int] = (0.0, 0)  # (when, total) of the scan's current phase
        self._samples: list[tuple[float, int]] = []  # (when, done) of the phase's recent progress reports
        self._scan_key: tuple[Any, ...] = ()
        self._scan_note = ""  # how the shown scan was made (reused, calibrated), kept in the status line
        self.text_edit = QLineEdit(self, placeholderText="empty: the built-in text (or the Calibrate page's)")
        self.text_edit.setToolTip("The calibration text the scan measures on (UTF-8, or a .jsonl of chats)")
        self.browse_button = QPushButton("Browse…", self)
        self.exclude_edit = QLineEdit(self, placeholderText="e.g. Q4_1,Q5_1")
        self.exclude_edit.setToolTip(
            "Quantization types the plan may not use, even as another type's fallback (Enter re-plans)"
        )
        self.heldout_edit = QLineEdit(self, placeholderText="empty: the last quarter of the calibration text")
        self.heldout_edit.setToolTip(
            "Text the plan is judged on against llama.cpp's preset of the same size (best of another kind)"
        )
        self.scan_button = QPushButton("Scan", self)
        self.rotate_check = QCheckBox("&Rotate", self)
        self.rotate_check.setToolTip(
            "Scan and plan the model as export --rotate writes it: a randomised Hadamard rotation folded into "
            "the weights (the imatrix and the scan measure the rotated model; a tied head is untied and its "
            "bytes are counted in the budget). The plan is exported rotated."
        )
        self.scan_info: Any = None  # the ModelInfo the shown scan measured (a rotated view's with Rotate)
        self._next_info: Any = None  # the running scan's
        self.budget_edit = QLineEdit(self, placeholderText="80MB, 4.5GB, 4.8bpw, vram=8GB")
        self.budget_edit.setToolTip("A file size, bits per weight, or memory (vram=…) the plan must fit in")
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.slider.setToolTip("Move along the predicted front: left smaller, right more faithful")
        self.use_button = QPushButton("Use plan", self)
        self.measure_button = QPushButton("Measure", self)
        self.measure_button.setToolTip(
            "Measure the plan's KL with every tensor quantized at once, on the scan's chunks (a job)"
        )
        self.cancel_button = QPushButton("Cancel", self)
        self.close_button = QPushButton("Close", self)
        for button in (
            self.browse_button,
            self.scan_button,
            self.use_button,
            self.measure_button,
            self.cancel_button,
            self.close_button,
        ):
            # Enter in a field must not press a button (it re-plans the budget or the exclusions instead)
            button.setAutoDefault(False)
            button.setDefault(False)
        self.progress = QProgressBar(self)
        self.result = QLabel(self)
        self.result.setWordWrap(True)
        self.measured_label = QLabel(self)
        self.measured_label.setWordWrap(True)
        self.status = QLabel(self)
        self.status.setWordWrap(True)
        # the scan's calibration: estimated peak memory and time before it starts (core job_estimate)
        self._estimate: tuple[Any, str] = (None, "")  # (the model info, its estimate line)
        self.estimate_label = QLabel(self)
        self.estimate_label.setWordWrap(True)
        self.table = QTableWidget(0, 4, self)
        self.table.setHorizontalHeaderLabels(["tensor", "type", "bits/weight", "size"])
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)  # full names: the column grows, it scrolls
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)

        # x is the file's bytes (labelled in MB/GB, bits per weight on top); y is log10 KL (the front
        # spans three decades), the left axis labels it as powers of ten
        self.size_axis, self.bpw_axis = SizeAxis("bottom"), BpwAxis("top")
        self.plot = pg.PlotWidget(self, axisItems={"bottom": self.size_axis, "top": self.bpw_axis})
        self.plot.setMinimumHeight(200)
        self.plot.getPlotItem().showAxis("top")
        self.plot.setLabel("left", "KL divergence (nats per token)")
        left = self.plot.getPlotItem().getAxis("left")
        left.setLogMode(False, True)
        left.enableAutoSIPrefix(False)  # "0.02", not "2·10¹ (×0.001)"
        self.legend = self.plot.addLegend(offset=(-10, 10))
        self.curve = self.plot.plot([], [], symbol="o", symbolSize=4, name="predicted front")
        self.preset_dots = pg.ScatterPlotItem(size=9, name="llama.cpp presets (predicted)")
        self.chosen_dot = pg.ScatterPlotItem(size=12, name="this plan (predicted)")
        self.measured_dot = pg.ScatterPlotItem(size=16, symbol="x", name="measured")
        self.heldout_dot = pg.ScatterPlotItem(size=14, symbol="star", name="this plan (held-out)")
        self.heldout_preset_dots = pg.ScatterPlotItem(
            size=10, symbol="t", name="llama.cpp presets (held-out)"
        )
        for item in (
            self.preset_dots,
            self.chosen_dot,
            self.measured_dot,
            self.heldout_dot,
            self.heldout_preset_dots,
        ):
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
        self._plan_timer = QTimer(self, singleShot=True, interval=SLIDER_PLAN_MS)
        self._plan_timer.timeout.connect(self.replan)
        self._build_layout()
        self.scan_button.clicked.connect(self.start_scan)
        self.browse_button.clicked.connect(self._browse_text)
        self.budget_edit.editingFinished.connect(self._budget_edited)
        self.exclude_edit.editingFinished.connect(self._exclusions_edited)
        self.slider.valueChanged.connect(self._slid)
        self.use_button.clicked.connect(self.use_plan)
        self.measure_button.clicked.connect(self.measure_plan)
        self.cancel_button.clicked.connect(self.cancel)
        self.close_button.clicked.connect(self.close)
        self.map_type.currentIndexChanged.connect(self.redraw_sensitivity)
        self.top_n.valueChanged.connect(self.redraw_sensitivity)
        self.heat.tensorClicked.connect(self.open_tensor)
        self.bars.tensorClicked.connect(self.open_tensor)
        state.exported.connect(self._on_exported)
        state.modelOpened.connect(self.clear)
        state.modelClosed.connect(self.clear)
        follow_theme(state, self._apply_theme)
        self._default_exclusions()
        self.update_controls()

    def _default_exclusions(self) -> None:
        # a model dequantized from a GGUF (the demo) loses nothing at its own type: never choose it
        info = self.state.info
        self.exclude_edit.setText(",".join(inherited_types(info)) if info is not None else "")

    def _build_layout(self) -> None:
        """Labelled fields on top, the views in the middle, progress and the buttons at the bottom."""
        fields = QGridLayout()

        def label(text: str, buddy: QWidget, row: int, col: int) -> None:
            lab = QLabel(text, self)
            lab.setBuddy(buddy)
            fields.addWidget(lab, row, col)

        label("Calibration &text:", self.text_edit, 0, 0)
        fields.addWidget(self.text_edit, 0, 1)
        fields.addWidget(self.browse_button, 0, 2)
        label("Types &not to choose:", self.exclude_edit, 0, 3)
        fields.addWidget(self.exclude_edit, 0, 4)
        scan_row = QHBoxLayout()
        scan_row.setContentsMargins(0, 0, 0, 0)
        scan_row.addWidget(self.rotate_check)
        scan_row.addWidget(self.scan_button)
        fields.addLayout(scan_row, 0, 5)
        label("&Budget:", self.budget_edit, 1, 0)
        fields.addWidget(self.budget_edit, 1, 1)
        label("Along the &front:", self.slider, 1, 3)
        fields.addWidget(self.slider, 1, 4)
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.measure_button)
        fields.addLayout(buttons, 1, 5)
        label("&Held-out text:", self.heldout_edit, 2, 0)
        fields.addWidget(self.heldout_edit, 2, 1)
        fields.setColumnStretch(1, 3)
        fields.setColumnStretch(4, 2)
        prow = QHBoxLayout()
        prow.addWidget(self.progress, 1)
        prow.addWidget(self.cancel_button)
        prow.addWidget(self.close_button)
        lay = QVBoxLayout(self)
        lay.addLayout(fields)
        lay.addWidget(self.views, 1)
        for widget in (self.result, self.measured_label):
            lay.addWidget(widget)
        lay.addLayout(prow)
        lay.addWidget(self.status)
        lay.addWidget(self.estimate_label)

    def _apply_theme(self, dark: bool) -> None:
        c = plot_colors(dark)
        style_plot(self.plot, dark)
        self.bpw_axis.setPen(pg.mkPen(c["fg"]))
        self.bpw_axis.setTextPen(pg.mkPen(c["fg"]))
        self.curve.setPen(pg.mkPen(c["main"]))
        self.curve.setSymbolBrush(pg.mkBrush(c["main"]))
        self.preset_dots.setBrush(pg.mkBrush(c["second"]))
        self.chosen_dot.setBrush(pg.mkBrush(c["outlier"]))
        self.measured_dot.setBrush(pg.mkBrush(c["fg"]))
        self.measured_dot.setPen(pg.mkPen(c["fg"], width=2))
        self.heldout_dot.setBrush(pg.mkBrush(c["outlier"]))
        self.heldout_preset_dots.setBrush(pg.mkBrush(c["fg"]))
        self.legend.setLabelTextColor(c["fg"])
        for label in self.preset_labels:
            label.setColor(c["fg"])

    def _sensitivity_page(self) -> QWidget:
        page = QWidget(self)
        top = QHBoxLayout()
        for text, field in (("KL at", self.map_type), ("Most sensitive:", self.top_n)):
            label = QLabel(text, page)
            label.setBuddy(field)
            top.addWidget(label)
            top.addWidget(field)
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

    def _scan_text(self) -> str:
        """The text field's file, else the Calibrate page's text, else the built-in text."""
        typed = self.text_edit.text().strip()
        if typed:
            return str(Path(typed).expanduser())
        run = self.state.calibration
        return run.text if run is not None else "builtin"

    def _planned_info(self) -> Any:
        """The ``ModelInfo`` plans are made for: the one the shown scan measured (rotated with Rotate), else
        the open model's."""
        return self.scan_info if self.scan_info is not None else self.state.info

    def _reusable(self, text: str) -> Any:
        """The Calibrate page's run when it calibrated ``text`` (its imatrix serves the scan), else None."""
        run = self.state.calibration
        if run is None or run.imatrix is None:
            return None
        if run.text == text or (
            "builtin" not in (run.text, text) and Path(run.text).resolve() == Path(text).resolve()
        ):
            return run
        return None

    @Slot()
    def start_scan(self) -> None:
        """Scan the open model in the background, calibrating only when no imatrix of the text exists (with
        Rotate: the rotated model, which the Calibrate page's imatrix does not describe)."""
        info = self.state.info
        if info is None:
            self.show_error("Open a model first.")
            return
        rotate = self.rotate_check.isChecked()
        rot_notes: tuple[str, ...] = ()
        if rotate:
            try:  # a family the rotation does not cover: its one sentence, nothing runs
                view = RotatedCheckpoint(self.state.checkpoint, Rotation())
            except StudioError as err:
                self.show_error(str(err))
                return
            info, rot_notes = view.info, view.notes  # R2 alone on Gemma, Gemma 2, BERT: the status says why
        text = self._scan_text()
        run = None if rotate else self._reusable(text)
        # the default menu: no ternary or 1-2-bit types unless the model was trained for them
        settings = ScanSettings(types=default_types(info.config))
        if run is not None:  # the page's chunking (the imatrix is keyed by it); scan chunks fit inside
            n_ctx = min(settings.n_ctx, run.n_ctx)
            settings = dataclasses.replace(
                settings, n_ctx=n_ctx, calib_ctx=run.n_ctx, calib_chunks=run.n_chunks
            )
        held_file = self.heldout_edit.text().strip() or None
        key = (str(info.path), text, held_file, settings, None if run is None else id(run.imatrix), rotate)
        self.scan_text, self.scan_settings, self._next_info = text, settings, info
        if key in self._scans:  # scanned in this window already: nothing runs
            self.calibrated = False
            self._scan_note = "The scan of this text, kept in this window."
            scan, im, held, points, self.scan_text = self._scans[key]
            self.scan_info = info
            self.set_scan(scan, im, held, points)
            set_status(self.status, self._scan_note)
            return
        reused = None if run is None else run.imatrix
        cluster = self.state.cluster  # the window's device choice: a Ray cluster runs the scan's pairs

        def work(ctx: JobContext) -> tuple[Any, ...]:
            # as the CLI: the scan (and a fresh imatrix) see the text less its held-out end, or all of it
            # beside a held-out file; plans are judged on the held-out text
            fit, held = texts(info.path, text, held_file, ctx=ctx)
            # the scan's 23 types' kernels compiled here would hold the GIL for up to a second at a time
            ensure_compiled(ctx)
            executor = open_executor(cluster)
            try:  # calibrate (unless the page's or the CLI's imatrix serves), then imatrix, then scan
                done = calibrate_then_scan(info, fit, settings, imatrix=reused, ctx=ctx, executor=executor)
            finally:
                executor.close()
            ctx.report(0, 1, "llama.cpp's presets on the held-out text")
            points = preset_heldout_points(
                info.path, info, held, imatrix=done.imatrix, presets=PRESETS, ctx=ctx
            )
            return done.scan, done.imatrix, done.calibrated, fit, held, points

        self._scan_key = key
        self._phase_start, self._samples = (0.0, 0), []
        set_status(
            self.status,
            " ".join(
                (
                    "Scanning with the Calibrate page's importance matrix (no calibration) …"
                    if reused is not None
                    else "Scanning …",
                    *rot_notes,
                )
            ),
        )
        self.task.start("Sensitivity scan", work)
        self.update_controls()

    def on_progress(self, job: Any) -> None:
        """The scan's bar, with an ETA from the recent rate of the current phase (not since the job began)."""
        if job.total <= 0:
            return
        now = time.monotonic()
        if not self._samples or job.total != self._phase_start[1] or job.done < self._samples[-1][1]:
            self._phase_start, self._samples = (now, job.total), []  # a new phase: its own rate
        self._samples.append((now, job.done))
        self._samples = [p for p in self._samples if now - p[0] <= ETA_WINDOW_S] or self._samples[-1:]
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        message = job.message.split(" · ETA")[0]
        eta = ""
        if d1 > d0 and now - self._phase_start[0] >= ETA_MIN_S:
            eta = f" · about {format_eta((job.total - d1) * (t1 - t0) / (d1 - d0))} left"
        self.progress.setRange(0, job.total)
        self.progress.setValue(job.done)
        self.progress.setFormat(f"%p% · {message}{eta}")

    def on_done(self, result: Any) -> None:
        """A scan finished (show its front) or a measurement did (show it beside the prediction)."""
        if isinstance(result, Measured):
            self.show_measured(result)
        else:
            scan, im, self.calibrated, fit, held, points = result
            self.scan_text = fit  # measurements run on the chunks the scan measured
            self.scan_info = self._next_info  # plans name the tensors it measured (a rotated view's too)
            self._scans[self._scan_key] = (scan, im, held, points, fit)
            self.progress.setFormat("%p%")
            self.set_scan(scan, im, held, points)
            how = "calibrated, then scanned" if self.calibrated else "scanned without calibrating"
            if scan.rotation is not None:
                how += " rotated (the plan is exported rotated)"
            self._scan_note = f"{Path(str(scan.model)).name}: {how} in {scan.seconds:.0f} s."
            set_status(self.status, self._scan_note)
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
        self.estimate_label.setText(self._estimate_line())
        self.scan_button.setEnabled(not self.running)
        self.rotate_check.setEnabled(not self.running)
        self.cancel_button.setEnabled(self.running)
        for w in (self.budget_edit, self.slider, self.use_button):
            w.setEnabled(self.scan is not None and not self.running)
        self.use_button.setEnabled(self.use_button.isEnabled() and self.allocation is not None)
        self.measure_button.setEnabled(self.allocation is not None and not self.running)

    def _estimate_line(self) -> str:
        """What a scan of the open model runs, estimated before it starts (``budget_job``): the calibration,
        the scan and the presets on the held-out text; made once per model (tens of ms at 32 layers)."""
        info = self.state.info
        if info is None:
            return ""
        if self._estimate[0] is not info:
            st = ScanSettings(types=default_types(info.config))
            chunks = st.calib_chunks or guess_chunks(BUILTIN, st.calib_ctx)
            try:
                job = budget_job(
                    info, "imatrix", calib_ctx=st.calib_ctx, calib_chunks=chunks, settings=st, export=False
                )
                about = "" if st.calib_chunks else "about "
                line = f"Scanning: {job.describe()}; {about}{chunks} chunks of {st.calib_ctx} tokens."
            except StudioError:  # a model the scan cannot cover says so when scanned
                line = ""
            self._estimate = (info, line)
        return self._estimate[1]

    @Slot()
    def clear(self, *_: Any) -> None:
        """Forget the scan (another model was opened or the model closed)."""
        self.task.cancel(quiet=True)
        self.plan_task.cancel(quiet=True)
        self.scan = self.imatrix = self.allocation = self.measured = self._queued = None
        self.scan_info = None
        self.front = self.presets = ()
        self._scan_note = ""
        self._used.clear()
        self._scans.clear()
        self.heldout, self.heldout_presets = None, ()
        for item in (
            self.curve,
            self.preset_dots,
            self.chosen_dot,
            self.measured_dot,
            self.heldout_dot,
            self.heldout_preset_dots,
        ):
            item.setData([], [])
        self._label_presets()
        self.heat.set_grid(None)
        self.bars.set_rows((), {}, {})
        self.table.setRowCount(0)
        for label in (self.result, self.measured_label, self.status):
            label.setText("")
        self._default_exclusions()
        self.update_controls()

    def _browse_text(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Calibration text", folders.start_in(self.state), "Text (*.txt *.md *.jsonl);;All files (*)"
        )
        if path:
            folders.remember(self.state, path)
            self.text_edit.setText(path)

    # ------------------------------------------------------------------ budget (a job of its own)

    def _exclude(self) -> tuple[str, ...]:
        return tuple(t.strip().upper() for t in self.exclude_edit.text().split(",") if t.strip())

    @property
    def planning(self) -> bool:
        """Whether a planning job (front, presets, plan) is queued or running."""
        return self.plan_task.running or self._plan_timer.isActive()

    def set_scan(
        self, scan: Any, imatrix: Any = None, heldout: Any = None, heldout_presets: Any = ()
    ) -> None:
        """Take ``scan``: its size/KL front, the presets on it and the plan for the budget field (or the
        front's middle) are computed in a job and drawn when it ends (``planShown``); llama.cpp's presets
        measured on the ``heldout`` text (``PresetPoint``s) are drawn on the same axes at once."""
        self.scan, self.imatrix = scan, imatrix
        self.heldout, self.heldout_presets = heldout, tuple(heldout_presets)
        self._preset_plans = None
        self.heldout_preset_dots.setData(
            [{"pos": (p.file_bytes, _log(p.heldout_kl)), "data": p.name} for p in self.heldout_presets]
        )
        self.allocation = None
        self.measured_dot.setData([], [])
        self.heldout_dot.setData([], [])
        self.measured = None
        self.measured_label.setText("")
        self._fill_map_types(scan)
        self.update_controls()
        self._plan(with_front=True)

    def _plan(self, *, with_front: bool) -> None:
        """Start the planning job (the previous one's end is dropped)."""
        if self.scan is None:
            return
        self._plan_timer.stop()
        info, measured, imatrix, ex = self._planned_info(), self.scan, self.imatrix, self._exclude()
        known = self._preset_plans
        cands = tuple(q for q in measured.types if q not in ex)
        typed = self.budget_edit.text().strip()

        def work(ctx: JobContext) -> Planned:
            front = presets = None
            # a GGUF original's stored types are free where the export copies them (as the CLI plans)
            scan, copied = with_stored_copies(measured, info.path, "imatrix")
            if with_front:
                front = pareto_front(
                    info, scan, candidates=cands, exclude=ex, imatrix=imatrix, method="imatrix"
                )
                presets = preset_points(info, scan, PRESETS)
            budget = typed or (str(front[len(front) // 2].file_bytes) if front else "")
            pres = known if known is not None else preset_plans(info, imatrix=imatrix)
            try:
                b = parse_budget(budget)
                # as the CLI: the token embedding and output at least at the same-size preset's types
                guarded, note = guarded_scan(info, scan, b, pres, candidates=cands, exclude=ex)
                try:
                    a = allocate(
                        info, guarded, b, candidates=cands, exclude=ex, imatrix=imatrix, method="imatrix"
                    )
                except StudioError:
                    if guarded is scan:
                        raise
                    # the guard leaves no plan within the budget with these types: as the CLI, plan without it
                    a = allocate(
                        info, scan, b, candidates=cands, exclude=ex, imatrix=imatrix, method="imatrix"
                    )
                    note = UNGUARDED_NOTE
            except StudioError as err:
                return Planned(budget, front, presets, None, str(err), pres)
            notes = tuple(n for n in (note, copied) if n)
            if notes:
                a = dataclasses.replace(a, notes=(*a.notes, *notes))
            return Planned(budget, front, presets, a, "", pres)

        set_status(self.status, "Planning …")
        self.plan_task.start("Budget plan", work)

    def _show_planned(self, p: Planned) -> None:
        self._preset_plans = p.preset_plans
        if p.front is not None:
            self._show_front(p.front, p.presets or ())
        if not self.budget_edit.text().strip() and p.budget:
            self.budget_edit.setText(p.budget)
        self.allocation = p.allocation
        if p.allocation is None:
            self.chosen_dot.setData([], [])
            self.result.setText("")
            self.update_controls()
            self.show_error(p.error)
            return
        a = p.allocation
        self.chosen_dot.setData([a.file_bytes], [_log(a.predicted_kl)])
        self.result.setText(
            f"{a.file_bytes:,} B ({format_bytes(a.file_bytes)}) file, {a.bpw:.2f} bits per weight, "
            f"predicted KL {a.predicted_kl:.4f}"
            + (f", measured {a.measured_kl:.4f}" if a.measured_kl is not None else "")
        )
        set_status(self.status, " ".join((self._scan_note, *a.notes)).strip())
        self._fill_table(a)
        self.update_controls()
        if self.map_type.currentData() == PLAN_TYPES:
            self.redraw_sensitivity()
        self.planShown.emit(a)

    def _plan_failed(self, message: str) -> None:
        self.allocation = None
        self.update_controls()
        self.show_error(message)

    def _show_front(self, front: tuple[Any, ...], presets: tuple[Any, ...]) -> None:
        """Draw the front and the presets; the slider moves along the front."""
        self.front, self.presets = tuple(front), tuple(presets)
        self.curve.setData([p.file_bytes for p in self.front], [_log(p.kl) for p in self.front])
        self.preset_dots.setData([{"pos": (p.file_bytes, _log(p.kl)), "data": p.label} for p in self.presets])
        points = [*self.front, *self.presets]
        self.size_axis.set_extent(max((p.file_bytes for p in points), default=0))
        self.bpw_axis.set_map([(p.file_bytes, p.bpw) for p in points])
        self._label_presets()
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(0, len(self.front) - 1))
        self.slider.setValue(len(self.front) // 2)
        self.slider.blockSignals(False)
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
        for label in self.preset_labels:
            self.plot.removeItem(label)
        self.preset_labels = []
        fg = plot_colors(self.state.dark)["fg"]
        spots = [(p.label, p.file_bytes, p.kl) for p in self.presets]
        spots += [(p.name, p.file_bytes, p.heldout_kl) for p in self.heldout_presets]
        for name, x, kl in spots:
            label = pg.TextItem(name, color=fg, anchor=(0.5, 1.2))
            label.setPos(x, _log(kl))
            self.plot.addItem(label)
            self.preset_labels.append(label)

    @Slot(int)
    def _slid(self, i: int) -> None:
        # the field follows at once; the plan once the slider rests (a drag starts one job, not fifty)
        if 0 <= i < len(self.front):
            self.budget_edit.setText(str(self.front[i].file_bytes))
            self._plan_timer.start()

    @Slot()
    def _budget_edited(self) -> None:
        if self.scan is not None and self.budget_edit.isModified():
            self.budget_edit.setModified(False)
            self.replan()

    @Slot()
    def _exclusions_edited(self) -> None:
        # Enter here re-plans (the front changes with the types allowed); it never starts a scan
        if self.scan is not None and self.exclude_edit.isModified():
            self.exclude_edit.setModified(False)
            self._plan(with_front=True)

    @Slot()
    def replan(self) -> None:
        """Plan for the budget field from the scan (no model runs), in a job; a bad budget is one sentence."""
        self._plan(with_front=False)

    def _fill_table(self, a: Any) -> None:
        rows = [(t, a.plan.types[t.name]) for t in self.scan.tensors]
        self.table.setRowCount(len(rows))
        for r, (t, q) in enumerate(rows):
            bpw = QTYPES[q].bits_per_weight
            cost = t.by_type.get(q) or next((c for c in t.by_type.values() if c.effective == q), None)
            size = format_bytes(cost.bytes) if cost is not None else ""
            items = (QTableWidgetItem(t.name), QTableWidgetItem(q), QTableWidgetItem(f"{bpw:.2f}"))
            items += (QTableWidgetItem(size),)
            items[0].setToolTip(f"{t.name} (in the GGUF file: {t.gguf_name})")
            for c, it in enumerate(items):
                it.setBackground(bits_colour(bpw))
                self.table.setItem(r, c, it)

    @Slot()
    def use_plan(self) -> None:
        """Make the chosen plan the window's plan (the plan editor shows it) and the scan's imatrix the window's."""
        if self.allocation is None:
            return
        a = self.allocation
        self._used.add(a.plan.name)
        info = self._planned_info()
        rotated = rotation_of(info) is not None
        if self.imatrix is not None and not rotated:
            # The plan was chosen (and is measured) with the scan's imatrix: the export quantizes with it too.
            # (A rotated scan's imatrix is the rotated model's: it travels in the check, not the window's slot.)
            self.state.set_imatrix(self.imatrix)
        # as export --budget: the window's export of this plan waits for llama.cpp's verdict before the rename
        limit = a.limit_bytes if a.budget.kind.value == "file" else a.file_bytes
        check = last_word_check(
            info, a.predicted_kl, self._preset_plans or (), int(limit), self.heldout, self.imatrix
        )
        self.state.set_plan(a.plan, check=check)
        self.planChosen.emit(a)

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
        types = self.map_types() if self.scan is not None else None
        if types is None:
            self.heat.set_grid(None)
            self.bars.set_rows((), {}, {})
            return
        self.heat.set_grid(sensitivity_grid(self.scan, types))
        labels = {t.name: t.name for t in self.scan.tensors}  # Hugging Face names, as on every page
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
        # the export measured the file with llama.cpp before its rename: that word is not measured twice
        word = getattr(outcome, "last_word", None)
        self._measure(r.path.name, types, r.file_bytes, verify, int(getattr(v, "n_tokens", 0) or 0), word)

    def _measure(
        self,
        what: str,
        types: dict[str, str],
        file_bytes: int,
        verify_kl: Any = None,
        verify_tokens: int = 0,
        word: Any = None,
    ) -> None:
        info, scan, imatrix, text = self._planned_info(), self.scan, self.imatrix, self.scan_text
        settings = self.scan_settings
        held, points, a, known = self.heldout, self.heldout_presets, self.allocation, self._preset_plans
        # the same-size preset is the largest within the budget, not within the plan's bytes
        limit = max(file_bytes, a.limit_bytes if a is not None and a.budget.kind.value == "file" else 0)
        if info is None or scan is None:
            return
        try:
            predicted: float | None = scan.predicted_kl(types)
        except KeyError:
            predicted = None
        except StudioError as err:  # a candidate's KL is not finite: one sentence naming tensor and type
            self.show_error(str(err))
            return

        def work(ctx: JobContext) -> Measured:
            st = settings or ScanSettings()
            studio_ctx = ctx.span(0.0, 0.5)
            pres = known if known is not None else preset_plans(info, imatrix=imatrix)
            if held is None:
                (kl,) = measure_plans(
                    info.path, [types], text, st, imatrix=imatrix, ctx=studio_ctx, rotation=rotation_of(info)
                )
                judgement = None
            else:
                # the judge names the preset whose file is the budget (an i-quant too, as the CLI's): the
                # scan measured a few presets on the held-out text; the same-size one is measured now if not
                same = same_size_preset(pres, limit)
                pts = tuple(points)
                if same is not None and same[0] not in {p.name for p in pts}:
                    pts += preset_heldout_points(
                        info.path, info, held, imatrix=imatrix, presets=(same[0],), ctx=ctx.muted()
                    )
                kl, judgement = judge_against_points(
                    info.path, types, limit, held, pts, imatrix=imatrix, predicted_kl=predicted,
                    scan_text=text, settings=st, ctx=studio_ctx, rotation=rotation_of(info),
                )  # fmt: skip
            llama = word
            if llama is None:  # as export --budget: llama.cpp measures the file beside the same-size preset's
                pred = float("nan") if predicted is None else predicted
                c = last_word_check(info, pred, pres, limit, held, imatrix)
                llama = last_word_of_plan(
                    info, types, predicted_kl=c.predicted_kl, text=c.text, preset=c.preset,
                    imatrix=c.imatrix, ctx=ctx.span(0.5, 1.0),
                )  # fmt: skip
            return Measured(
                what, types, file_bytes, predicted, kl, verify_kl, verify_tokens, judgement, llama
            )

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
        j = m.judgement
        self.heldout_dot.setData([m.file_bytes] if j else [], [_log(j.heldout_kl)] if j else [])
        self.measured_label.setText(m.describe())
        set_status(self.status, "")
        self.update_controls()
        self.measuredShown.emit(m)
