"""Quality of the variants of a model: a results table and a plot of KL divergence against file size.

The numbers come from ``studio.core.evaluate.evaluate`` run in a job (original first, then each GGUF
alone); this widget collects the inputs and shows the ``EvalReport``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core import evaluate as core_evaluate
from studio.core.cluster import open_executor
from studio.core.evaluate.record import save_records
from studio.core.evaluate.verdict import judge
from studio.core.lab.hierarchy import hierarchy
from studio.qt import folders, widgets
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread, labelled_row, read_only_table, run_controls
from studio.qt.state import StudioState
from studio.qt.theme import follow_theme, plot_colors, quality_colour, set_status, style_plot

if TYPE_CHECKING:
    from studio.core.export.job import ExportOutcome

__all__ = ["COLUMNS", "EvalPanel"]

COLUMNS = ("Model", "PPL", "ΔPPL", "KL mean", "KL p99", "Same top", "Size", "BPW", "KV cache", "Verdict")
VERDICT_COLUMN = COLUMNS.index("Verdict")
# The KV-cache choices: llama.cpp's types to score every variant with (empty: the exact F32 cache).
KV_CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("F32 (exact)", ()),
    ("F16", ("f16",)),
    ("Q8_0", ("q8_0",)),
    ("Q4_0", ("q4_0",)),
    ("Compare F16, Q8_0 and Q4_0", ("f16", "q8_0", "q4_0")),
)
KL_FLOOR = 1e-12  # the plot's y axis is logarithmic; a lossless F32 export sits on the floor


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "—" if x is None or not math.isfinite(x) else f"{format(x, spec)}{suffix}"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


class _ScoreFeed(QObject):
    """Carries each score from the evaluation's worker thread to the panel (a queued signal)."""

    scored = Signal(object)


class EvalPanel(JobPanel, QWidget):
    """Pick an original, its GGUF variants and a text; evaluate in the background; show table and plot."""

    reportShown = Signal(object)  # the EvalReport just drawn
    rowStreamed = Signal(int)  # a variant's row, shown as soon as it was measured (before the report)
    errorShown = Signal(str)
    cancelled_text = "Evaluation cancelled."

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.init_task(state, jobs, "eval", progress=True)
        self.report: Any = None
        self._text_file: str | None = None
        self._streamed: Any = None  # the original's score while the variants' rows arrive one by one
        self._feed = _ScoreFeed(self)
        self._feed.scored.connect(self._on_score)
        self._build()
        state.modelOpened.connect(self._on_model_opened)
        state.exported.connect(self._on_exported)
        follow_theme(state, self._apply_theme)
        self.update_controls()

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        self.original_edit = widgets.line_edit(
            self, "the original model folder (or a GGUF)", self.update_controls
        )
        browse = widgets.button("…", self, self._choose_original, tip="Choose the original model folder")
        orig_row = widgets.path_row(self.original_edit, browse)

        self.variant_list = QListWidget(self)
        self.variant_list.setMaximumHeight(72)  # three rows; the table and plot need the height
        self.add_button = widgets.button("Add GGUF…", self, self._choose_variants)
        self.remove_button = widgets.button("Remove", self, self._remove_selected)
        vbtn = QVBoxLayout()
        vbtn.addWidget(self.add_button)
        vbtn.addWidget(self.remove_button)
        vbtn.addStretch(1)
        var_row = QHBoxLayout()
        var_row.addWidget(self.variant_list, 1)
        var_row.addLayout(vbtn)

        self.text_combo = widgets.combo_box(
            self,
            [
                ("Built-in English sample", "sample"),
                ("WikiText-2 test (needs datasets, offline copy)", "wikitext-2"),
                ("Text file…", "file"),
            ],
        )
        self.text_combo.activated.connect(self._on_text_choice)
        self.ctx_spin = widgets.spin_box(
            self, 16, 32768, 512, tip="Tokens per chunk; the second half of each chunk is scored"
        )
        self.chunks_spin = widgets.spin_box(
            self, 0, 100000, 16, special="all", tip="Evaluate at most this many chunks (0: the whole text)"
        )
        self.kv_combo = widgets.combo_box(
            self,
            KV_CHOICES,
            tip="llama.cpp's K/V cache type for the GGUF variants (flash attention when quantized); "
            "comparing scores each variant once per type",
        )
        self.run_button, self.cancel_button, self.progress, self.status = run_controls(self, "Evaluate")
        self.hierarchy_label = QLabel("", self)
        self.hierarchy_label.setWordWrap(True)
        self.hierarchy_label.setToolTip(
            "The seed's hierarchy: weights < activations < KV cache < attention in sensitivity. Evaluate "
            "a ~4-bit GGUF and an 8-bit one, comparing KV caches, to measure it on this model."
        )

        form = QFormLayout()
        form.addRow("Original:", orig_row)
        form.addRow("Variants:", var_row)
        form.addRow("Text:", self.text_combo)
        opts = labelled_row(
            self, [("Context:", self.ctx_spin), ("Chunks:", self.chunks_spin), ("KV cache:", self.kv_combo)]
        )
        opts.addWidget(self.run_button)
        opts.addWidget(self.cancel_button)
        form.addRow(opts)

        self.table = read_only_table(self, COLUMNS)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)  # numbers keep their width
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)  # the name takes the rest
        self.plot = pg.PlotWidget(self)
        self.plot.setLabel("bottom", "file size", units="MB")
        self.plot.setLabel("left", "mean KL divergence (nats)")
        self.plot.setLogMode(x=False, y=True)
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.plot.getViewBox().setDefaultPadding(0.08)
        # one item with symbols: PlotDataItem follows the plot's log mode by itself
        self.line = pg.PlotDataItem(symbol="o", symbolSize=9)
        self.plot.addItem(self.line)
        self._labels: list[pg.TextItem] = []

        split = QSplitter(Qt.Orientation.Vertical, self)
        split.addWidget(self.table)
        split.addWidget(self.plot)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.hierarchy_label)
        lay.addWidget(split, 1)

    # -- inputs -----------------------------------------------------------------------------------

    def set_original(self, path: str | Path) -> None:
        """Use ``path`` as the original model."""
        self.original_edit.setText(str(path))

    def add_variant(self, path: str | Path) -> None:
        """Add a GGUF variant (ignored when listed already)."""
        p = str(path)
        if p not in self.variants():
            self.variant_list.addItem(p)
        self.update_controls()

    def variants(self) -> list[str]:
        """The listed variant paths."""
        return [self.variant_list.item(i).text() for i in range(self.variant_list.count())]

    def set_text_file(self, path: str | Path) -> None:
        """Evaluate on a user's text file."""
        self._text_file = str(path)
        self.text_combo.setCurrentIndex(self.text_combo.findData("file"))
        self.text_combo.setItemText(self.text_combo.currentIndex(), f"Text file: {Path(path).name}")

    def text_source(self) -> str:
        """``sample``, ``wikitext-2`` or a file path."""
        data = self.text_combo.currentData()
        if data == "file":
            return self._text_file or "sample"
        return str(data)

    def _choose_original(self) -> None:
        path = QFileDialog.getExistingDirectory(
            self, "Choose the original model folder", folders.start_in(self.state)
        )
        if path:
            folders.remember(self.state, path)
            self.set_original(path)

    def _choose_variants(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Add GGUF variants", folders.start_in(self.state), "GGUF models (*.gguf)"
        )
        if paths:
            folders.remember(self.state, paths[0])
        for p in paths:
            self.add_variant(p)

    def _remove_selected(self) -> None:
        for item in self.variant_list.selectedItems():
            self.variant_list.takeItem(self.variant_list.row(item))
        self.update_controls()

    def _on_text_choice(self, index: int) -> None:
        if self.text_combo.itemData(index) == "file":
            path, _ = QFileDialog.getOpenFileName(
                self, "Choose a text file", folders.start_in(self.state), "Text (*.txt);;All files (*)"
            )
            if path:
                folders.remember(self.state, path)
                self.set_text_file(path)
            else:
                self.text_combo.setCurrentIndex(0)

    @Slot(object)
    def _on_model_opened(self, checkpoint: Any) -> None:
        path = getattr(getattr(checkpoint, "info", None), "path", None)
        if path is not None and not self.original_edit.text():
            self.set_original(path)

    @Slot(object)
    def _on_exported(self, outcome: ExportOutcome) -> None:
        self.add_variant(outcome.result.path)

    # -- running ----------------------------------------------------------------------------------

    @Slot()
    def start(self) -> bool:
        """Start the evaluation job; False when inputs are missing or one is running."""
        assert_gui_thread("EvalPanel.start")
        original = self.original_edit.text().strip()
        variants = self.variants()
        if self.running or not original or not variants:
            return False

        text = self.text_source()
        n_ctx = self.ctx_spin.value()
        chunks = self.chunks_spin.value() or None
        kv_types = tuple(self.kv_combo.currentData() or ())

        feed = self._feed  # emitted on the worker thread, delivered on the GUI thread (queued)
        cluster = self.state.cluster  # the window's device choice: a Ray cluster scores the chunks

        def work(ctx: Any) -> Any:
            executor = open_executor(cluster)
            try:
                report = core_evaluate.evaluate(  # on the package: tests replace it
                    original,
                    variants,
                    text=text,
                    n_ctx=n_ctx,
                    max_chunks=chunks,
                    ctx=ctx,
                    kv_types=kv_types,
                    on_score=feed.scored.emit,
                    executor=executor,
                )
            finally:
                executor.close()
            for note in save_records(report):  # beside each variant, for the model card of an upload
                ctx.log(note)
            return report

        self.status.setText("")
        self.table.setRowCount(0)
        self._streamed = None
        self.progress.setRange(0, 0)
        self.progress.show()
        self.task.start("Evaluate variants", work)
        self.update_controls()
        return True

    def on_done(self, result: Any) -> None:
        self.update_controls()
        self.show_report(result)
        self.state.publish_evaluation(result)

    # -- results ----------------------------------------------------------------------------------

    def show_report(self, report: Any) -> None:
        """Fill the table (with each variant's verdict badge), the hierarchy line and the plot from an ``EvalReport``."""
        assert_gui_thread("EvalPanel.show_report")
        self.report = report
        o = report.original
        rows: list[Any] = [None, *report.variants]
        self.table.setRowCount(len(rows))
        for r, v in enumerate(rows):
            self._set_row(r, o, v)
        errors = [v for v in report.variants if v.error]
        set_status(
            self.status,
            " ".join(v.error for v in errors)
            or f"{report.text_name}: {report.n_chunks} chunks of {report.n_ctx} tokens, {report.seconds:.1f} s.",
            error=bool(errors),
        )
        h = hierarchy(report.variants)
        self.hierarchy_label.setText(h.text if h is not None else "")
        self._draw(report)
        self.reportShown.emit(report)

    @Slot(object)
    def _on_score(self, score: Any) -> None:
        """A row as soon as its model is measured: the original first, then each variant."""
        if not self.running:
            return  # a late signal of a cancelled run
        if self._streamed is None:
            self._streamed = score
            self.table.setRowCount(1)
            self._set_row(0, score, None)
            return
        r = self.table.rowCount()
        self.table.setRowCount(r + 1)
        self._set_row(r, self._streamed, score)
        self.rowStreamed.emit(r)

    def _set_row(self, r: int, o: Any, v: Any) -> None:
        """Row ``r``: the original ``o`` (``v`` None) or the variant ``v`` measured against it."""
        if v is None:
            cells = [
                f"{o.label} (original)",
                _fmt(o.ppl, ".4f"),
                "",
                "",
                "",
                "",
                _mb(o.file_bytes),
                _fmt(o.bpw, ".2f"),
                "",
                "",
            ]
        elif v.error:
            cells = [
                v.label,
                "error",
                "",
                "",
                "",
                "",
                _mb(v.file_bytes) if v.file_bytes else "—",
                "",
                "",
                "",
            ]
        else:
            cells = [
                v.label,
                _fmt(v.ppl, ".4f"),
                _fmt(v.delta_ppl_pct(o.ppl), "+.2f", " %"),
                _fmt(v.kld_mean, ".6f"),
                _fmt(v.kld_p99, ".6f"),
                _fmt(v.same_top_pct, ".2f", " %"),
                _mb(v.file_bytes),
                _fmt(v.bpw, ".2f"),
                f"{v.kv_type.upper()} · {_mb(v.kv_cache_bytes)}" if v.kv_cache_bytes else v.kv_type.upper(),
                judge(o.ppl, v.ppl).verdict.value,
            ]
        for c, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if c:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if v is not None and v.error:
                item.setToolTip(v.error)
            elif v is not None and c == VERDICT_COLUMN:  # the badge: the rule of thumb's colour
                j = judge(o.ppl, v.ppl)
                item.setBackground(quality_colour(j.verdict))
                item.setToolTip(j.text)
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
            self.table.setItem(r, c, item)

    def _draw(self, report: Any) -> None:
        pts = report.quality_vs_size()
        xs = [p.file_bytes / 1e6 for p in pts]
        ys = [max(p.kld_mean, KL_FLOOR) for p in pts]
        self.line.setData(xs, ys)
        for item in self._labels:
            self.plot.removeItem(item)
        self._labels = []
        c = plot_colors(bool(getattr(self.state, "dark", False)))
        right = max(xs) if xs else 0.0
        for x, y, p in zip(xs, ys, pts, strict=True):
            # the rightmost label grows leftwards so it stays inside the plot
            t = pg.TextItem(p.label, color=c["fg"], anchor=(1, 1) if x == right and len(xs) > 1 else (0, 1))
            t.setPos(x, math.log10(y))
            self.plot.addItem(t)
            self._labels.append(t)

    def plotted_points(self) -> list[tuple[float, float]]:
        """(size in MB, mean KL) of the plotted points, as drawn."""
        xs, ys = self.line.xData, self.line.yData
        if xs is None or ys is None:
            return []
        return [(float(x), float(y)) for x, y in zip(xs, ys, strict=True)]

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        style_plot(self.plot, dark)
        c = plot_colors(dark)
        self.line.setPen(pg.mkPen(c["main"], width=1))
        self.line.setSymbolBrush(pg.mkBrush(c["main"]))

    def update_controls(self) -> None:
        busy = self.running
        self.progress.setVisible(busy)
        self.run_button.setEnabled(
            not busy and bool(self.original_edit.text().strip()) and self.variant_list.count() > 0
        )
        self.cancel_button.setEnabled(busy)
        self.add_button.setEnabled(not busy)
        self.remove_button.setEnabled(not busy)
