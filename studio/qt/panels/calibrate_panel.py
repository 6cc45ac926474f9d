"""Calibrate: run a text through the open model layer by layer, then look at what its linears saw.

The run is ``studio.core.calib.calibrate`` in a job (progress per layer and chunk with an ETA, Cancel
stops at the next chunk); its ``ActivationStats`` and the importance matrix made from them
(``imatrix_from_stats``) are shared through ``StudioState`` (``set_activation_stats``,
``set_imatrix``), so the inspector, the overview, the preview and the export use them. Nothing is
written unless the user saves the imatrix (llama.cpp's GGUF or legacy ``.dat`` format); a loaded
imatrix is checked against the open model first.

Below the run: the model's largest outlier features, and for the selected linear weight the AWQ
saliency and SmoothQuant views (``activation_views``), drawn from the weight's columns, streamed from
the checkpoint in a second job.

A GGUF original runs in torch as its float32 Hugging Face folder, the one the CLI uses
(``hf_folder_for``): converted once into the cache as the first part of the job (the status line says
so), then reused. Its importance matrix carries the GGUF's own tensor names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core.calib.analysis import layer_outlier_counts, top_outlier_features, weight_columns
from studio.core.calib.calibrate import calibrate
from studio.core.calib.data import BUILTIN
from studio.core.calib.imatrix import check_for_model, imatrix_from_stats, read_imatrix, write_imatrix
from studio.core.cluster import open_executor
from studio.core.errors import CalibrationError, StudioError
from studio.core.model import open_model
from studio.core.model.gguf_source import hf_folder_cached, hf_folder_for
from studio.core.stats.cache import StatsCache
from studio.qt import folders, widgets
from studio.qt.jobs import Job, JobManager
from studio.qt.panel_job import JobPanel, PanelJob
from studio.qt.panels import assert_gui_thread, choose, read_only_table
from studio.qt.panels.activation_views import SaliencyView, SmoothQuantView
from studio.qt.panels.device_selector import DeviceSelector
from studio.qt.settings import AppSettings
from studio.qt.state import CalibrationRun, StudioState
from studio.qt.theme import follow_theme, set_status

__all__ = ["CalibratePanel", "SOURCES"]

SOURCES = (("builtin", "Built-in text"), ("text", "Text file"), ("chat", "Chats (JSONL)"))
# the progress bar's share of a GGUF's conversion, when it runs first (1.5B: 190 s, then 270 s calibrating)
CONVERT_SHARE = 0.4
_PROGRESS_STEPS = 1000
IMATRIX_FILTERS = "llama.cpp imatrix (*.gguf);;Legacy llama.cpp imatrix (*.dat)"


def _gguf_open(info: Any) -> bool:
    return str(getattr(info.format, "value", info.format)) == "gguf"


class CalibratePanel(JobPanel, QWidget):
    """The Calibrate page: text, context, chunks and device; progress and Cancel; outliers, imatrix, views."""

    calibrated = Signal(object)  # ActivationStats, after the results were drawn
    viewsShown = Signal(str)  # weight name, once the AWQ and SmoothQuant views hold its data
    errorShown = Signal(str)

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.init_task(state, jobs, "calibrate", progress=True)
        self.settings: AppSettings | None = None
        self.cache = StatsCache()  # calibration runs of this session (same text and settings: no rerun)
        self.columns_job = PanelJob(
            jobs, "statistics", self, on_done=self._columns_done, on_error=self._views_error
        )
        self._columns: Any = None  # WeightColumns of the weight the views show
        self._run = CalibrationRun("builtin", 512, None, None)  # what the running calibration uses
        self._build()
        state.modelOpened.connect(self._on_model)
        state.modelClosed.connect(self._on_model)
        state.activationsChanged.connect(self._on_activations)
        state.imatrixChanged.connect(self._show_imatrix)
        state.tensorSelected.connect(self._request_views)
        follow_theme(state, self._apply_theme)
        self._on_model()

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        self.source_combo = widgets.combo_box(
            self, [(label, key) for key, label in SOURCES], on_change=self.update_controls
        )
        self.path_edit = widgets.line_edit(
            self, 'A UTF-8 text file, or a .jsonl of chats ({"messages": [...]})'
        )
        self.browse_button = widgets.button("Browse…", self, self._browse_text)
        self.ctx_spin = widgets.spin_box(
            self,
            16,
            1 << 16,
            512,
            suffix=" tokens",
            tip="Tokens per chunk (llama-imatrix's --ctx-size; 512 is its default)",
        )
        self.chunks_spin = widgets.spin_box(
            self, 0, 1 << 20, special="all", tip="How many chunks of the text to run (all: every whole chunk)"
        )
        self.device = DeviceSelector(self.state, self.jobs, self)
        self.output_check = QCheckBox("Include output.weight", self)
        self.output_check.setToolTip("Also collect the output head's input (llama-imatrix --process-output)")
        self.run_button = widgets.button("Calibrate", self, self.start)
        self.cancel_button = widgets.button("Cancel", self, self.cancel)

        row1 = QHBoxLayout()
        row1.addWidget(QLabel("Text:", self))
        row1.addWidget(self.source_combo)
        row1.addWidget(self.path_edit, 1)
        row1.addWidget(self.browse_button)
        row2 = QHBoxLayout()
        row2.addWidget(QLabel("Context:", self))
        row2.addWidget(self.ctx_spin)
        row2.addWidget(QLabel("Chunks:", self))
        row2.addWidget(self.chunks_spin)
        row2.addWidget(self.device, 1)
        row2.addWidget(self.output_check)
        row2.addWidget(self.run_button)
        row2.addWidget(self.cancel_button)

        self.progress = QProgressBar(self)
        self.progress.setRange(0, _PROGRESS_STEPS)
        self.progress_label = QLabel("", self)
        self.status = QLabel("Open a Hugging Face model folder, then calibrate it.", self)
        self.status.setWordWrap(True)
        self.summary = QLabel("", self)
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.imatrix_label = QLabel("Importance matrix: none.", self)
        self.imatrix_label.setWordWrap(True)
        self.save_button = widgets.button("Save imatrix…", self, self._save_dialog)
        self.load_button = widgets.button("Load imatrix…", self, self._load_dialog)
        self.forget_button = widgets.button(
            "Forget",
            self,
            lambda: self.state.set_imatrix(None),
            tip="Preview and export without an importance matrix",
        )
        row3 = QHBoxLayout()
        row3.addWidget(self.imatrix_label, 1)
        row3.addWidget(self.save_button)
        row3.addWidget(self.load_button)
        row3.addWidget(self.forget_button)

        self.outliers = read_only_table(self, ["layer", "input of", "channel", "max |x|", "× median"])
        self.outliers.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.outliers.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.outliers.cellDoubleClicked.connect(self._outlier_clicked)
        self.outliers.setToolTip("Double-click a row to select that weight")
        self.saliency = SaliencyView(self)
        self.smooth = SmoothQuantView(self)
        self.views = QTabWidget(self)
        self.views.addTab(self.outliers, "Outlier features")
        self.views.addTab(self.saliency, "AWQ saliency")
        self.views.addTab(self.smooth, "SmoothQuant")

        lay = QVBoxLayout(self)
        lay.addLayout(row1)
        lay.addLayout(row2)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_label)
        lay.addWidget(self.status)
        lay.addWidget(self.summary)
        lay.addLayout(row3)
        lay.addWidget(self.views, 1)

    # -- settings ---------------------------------------------------------------------------------

    def remember_in(self, settings: AppSettings) -> None:
        """Take the remembered text, context and chunks from ``settings``, and keep new ones there."""
        self.settings = settings
        choose(self.source_combo, settings.calib_source)
        self.path_edit.setText(settings.calib_file)
        self.ctx_spin.setValue(settings.calib_ctx)
        self.chunks_spin.setValue(settings.calib_chunks)
        self.device.remember_in(settings)
        self.update_controls()

    def _remember(self) -> None:
        s = self.settings
        if s is None:
            return
        s.calib_source, s.calib_file = self.source, self.path_edit.text().strip()
        s.calib_ctx, s.calib_chunks = self.ctx_spin.value(), self.chunks_spin.value()
        s.sync()

    # -- public -----------------------------------------------------------------------------------

    @property
    def source(self) -> str:
        """ "builtin", "text" or "chat"."""
        return str(self.source_combo.currentData() or "builtin")

    def set_text(self, source: str, path: str | Path | None = None) -> None:
        """Calibrate on the built-in text, a text file or a JSONL of chats."""
        if not choose(self.source_combo, source):
            raise ValueError(f"unknown calibration source {source!r}")
        self.path_edit.setText("" if path is None else str(path))

    def set_run(
        self, *, ctx: int | None = None, chunks: int | None = None, device: str | None = None
    ) -> None:
        """Set the context, the number of chunks (0: all) and the device."""
        if ctx is not None:
            self.ctx_spin.setValue(ctx)
        if chunks is not None:
            self.chunks_spin.setValue(chunks)
        if device is not None and not self.device.set_device(device):
            raise ValueError(f"device {device!r} is not available")

    def _text(self) -> str | Path:
        if self.source == "builtin":
            return BUILTIN
        raw = self.path_edit.text().strip()
        if not raw:
            raise StudioError("Choose a calibration file first, or use the built-in text.")
        path = Path(raw).expanduser()
        if self.source == "chat" and path.suffix.lower() != ".jsonl":
            raise StudioError(f"Chats are read from a .jsonl file; {path.name} is not one.")
        return path

    @Slot()
    def start(self) -> Job | None:
        """Calibrate the open model (ignored while a run is going)."""
        assert_gui_thread("CalibratePanel.start")
        info = self.state.info
        if info is None or self.running:
            return None
        try:
            text = self._text()
            convert = _gguf_open(info) and not hf_folder_cached(info.path)
        except StudioError as err:
            self.show_error(str(err))
            return None
        self._remember()
        n_ctx, chunks = self.ctx_spin.value(), self.chunks_spin.value() or None
        device, process_output, cache = self.device.device, self.output_check.isChecked(), self.cache
        model = Path(info.path)
        cluster = self.state.cluster  # the window's device choice: a Ray cluster runs the chunks

        def work(ctx: Any) -> tuple[Any, Any]:
            folder, run_ctx, folder_info = model, ctx, info
            if _gguf_open(info):  # calibration runs in torch: the GGUF's float32 folder, made once
                split = CONVERT_SHARE if convert else 0.0
                folder, run_ctx = hf_folder_for(model, ctx.span(0.0, split)), ctx.span(split, 1.0)
                with open_model(folder) as ck:
                    folder_info = ck.info  # its names map the stats to the GGUF's tensor names
            executor = open_executor(cluster)
            try:
                stats = calibrate(
                    folder,
                    text,
                    n_ctx=n_ctx,
                    n_chunks=chunks,
                    device=device,
                    process_output=process_output,
                    cache=cache,
                    ctx=run_ctx,
                    executor=executor,
                )
            finally:
                executor.close()
            return stats, imatrix_from_stats(stats, folder_info, process_output=process_output)

        self._run = CalibrationRun(str(text), n_ctx, chunks, None)
        self.progress.setValue(0)
        on = Path(str(text)).name
        if convert:
            self.progress_label.setText(f"Converting {model.name} to float32…")
            msg = (
                f"{model.name} is a GGUF file and calibration runs the model in torch: converting it once to a "
                f"float32 Hugging Face folder in the cache (later runs reuse it), then calibrating on {on}…"
            )
        else:
            self.progress_label.setText("Tokenizing the calibration text…")
            via = " (its float32 folder, converted once into the cache)" if _gguf_open(info) else ""
            msg = f"Calibrating {model.name}{via} on {on}…"
        set_status(self.status, msg)
        job = self.task.start(f"Calibrate {model.name}", work)
        self.update_controls()
        return job

    def save_imatrix(self, path: str | Path, fmt: str | None = None) -> bool:
        """Write the current imatrix (format from the suffix: ``.dat`` legacy, else GGUF); False on error."""
        im = self.state.imatrix
        if im is None:
            self.show_error("There is no importance matrix to save; calibrate or load one first.")
            return False
        try:
            saved = write_imatrix(im, path, fmt)
        except CalibrationError as err:
            self.show_error(str(err))
            return False
        self.state.set_imatrix(saved)  # now it has a file, which the export records
        set_status(self.status, f"Saved the importance matrix to {saved.path}.")
        return True

    def load_imatrix(self, path: str | Path) -> bool:
        """Read an imatrix (GGUF or legacy ``.dat``) and use it if it fits the open model; False otherwise."""
        info = self.state.info
        if info is None:
            self.show_error("Open the model the importance matrix was made for first.")
            return False
        try:
            im = read_imatrix(path)
            check_for_model(im, info)
        except StudioError as err:
            self.show_error(str(err))
            return False
        self.state.set_imatrix(im)
        set_status(self.status, f"Loaded {Path(path).name}: {len(im)} entries, {im.chunk_count} chunks.")
        return True

    # -- job hooks --------------------------------------------------------------------------------

    def on_progress(self, job: Job) -> None:
        if job.total > 0:
            self.progress.setValue(round(_PROGRESS_STEPS * job.done / job.total))
        self.progress_label.setText(job.message)

    def on_done(self, result: tuple[Any, Any]) -> None:
        stats, im = result
        self.progress.setValue(_PROGRESS_STEPS)
        self.progress_label.setText("")
        set_status(self.status, "")
        self.state.set_activation_stats(stats)  # draws the summary and the outliers (_on_activations)
        self.state.calibration = dataclasses.replace(self._run, imatrix=im)  # the budget dialog reuses it
        self.state.set_imatrix(im)
        self.update_controls()
        self.calibrated.emit(stats)

    def on_error(self, message: str) -> None:
        self.progress.setValue(0)
        self.progress_label.setText("")
        super().on_error(message)

    def on_cancel(self) -> None:
        self.progress.setValue(0)
        self.progress_label.setText("")
        set_status(self.status, "Calibration cancelled; nothing was kept.")
        self.update_controls()

    def update_controls(self, *_: Any) -> None:
        ok = self.state.info is not None
        running = self.running
        self.run_button.setEnabled(ok and not running)
        self.cancel_button.setEnabled(running)
        file = self.source != "builtin"
        self.path_edit.setEnabled(file and not running)
        self.browse_button.setEnabled(file and not running)
        for w in (self.source_combo, self.ctx_spin, self.chunks_spin, self.device, self.output_check):
            w.setEnabled(not running)
        self.save_button.setEnabled(self.state.imatrix is not None)
        self.load_button.setEnabled(ok)
        self.forget_button.setEnabled(self.state.imatrix is not None)

    # -- results ----------------------------------------------------------------------------------

    @Slot()
    def _on_model(self, *_: Any) -> None:
        self.task.cancel(quiet=True)  # another model: this run is not wanted
        self.columns_job.cancel(quiet=True)
        self.progress.setValue(0)
        self.progress_label.setText("")
        info = self.state.info
        if info is None:
            text = "Open a Hugging Face model folder, then calibrate it."
        elif _gguf_open(info):
            text = (
                f"{self.state.model_name} is a GGUF file: calibration runs it in torch as a float32 Hugging "
                "Face folder, converted from it once into the cache when you first calibrate."
            )
        else:
            text = f"Run a calibration text through {self.state.model_name} to see its activations."
        set_status(self.status, text)
        self._on_activations(self.state.activation_stats)
        self._show_imatrix(self.state.imatrix)

    @Slot(object)
    def _on_activations(self, stats: Any) -> None:
        self._columns = None
        if stats is None:
            self.summary.setText("")
            self.outliers.setRowCount(0)
            self.saliency.set_data(None, None)
            self.smooth.set_data(None, None)
            self.update_controls()
            return

        info = stats.info
        secs = (
            f" in {info.seconds:.1f} s ({stats.n_tokens / info.seconds:,.0f} tokens/s, {info.mode.value}, {info.device})"
            if info and info.seconds > 0
            else ""
        )
        layers = layer_outlier_counts(stats)
        with_out = [lo for lo in layers if lo.n_features]
        self.summary.setText(
            f"Calibrated on {stats.n_tokens:,} tokens ({stats.n_chunks} × {stats.n_ctx}) of {stats.dataset}{secs}. "
            f"{len(with_out)} of {len(layers)} layers have outlier features (|x| ≥ 6)."
            + ("".join(f" {w}" for w in stats.warnings))
        )
        rows = top_outlier_features(stats, limit=50)
        self.outliers.setRowCount(len(rows))
        for i, f in enumerate(rows):
            cells = (
                "–" if f.layer is None else str(f.layer),
                f.site,
                str(f.channel),
                f"{f.absmax:.4g}",
                f"{f.ratio:.1f}",
            )
            for j, v in enumerate(cells):
                item = QTableWidgetItem(v)
                if j in (0, 2, 3, 4):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.outliers.setItem(i, j, item)
        self.update_controls()
        self._request_views(self.state.selected_tensor)

    @Slot(object)
    def _show_imatrix(self, im: Any) -> None:
        if im is None:
            self.imatrix_label.setText("Importance matrix: none. Preview and export quantize without one.")
        else:
            where = Path(im.path).name if im.path else "not saved"
            data = im.datasets[0] if im.datasets else "unknown text"
            self.imatrix_label.setText(
                f"Importance matrix: {len(im)} entries, {im.chunk_count} chunks of {data} ({where}); "
                "preview and export use it."
            )
        self.update_controls()

    def _outlier_clicked(self, row: int, _col: int) -> None:
        item = self.outliers.item(row, 1)
        if item is not None:
            self.state.select_tensor(item.text())

    # -- views ------------------------------------------------------------------------------------

    @Slot(str)
    def _request_views(self, name: str) -> None:
        stats, ckpt = self.state.activation_stats, self.state.checkpoint
        st = stats.inputs.get(name) if stats is not None and name else None
        if st is None or ckpt is None or name not in ckpt or len(ckpt.info.tensor(name).shape) != 2:
            self.columns_job.cancel(quiet=True)
            self._columns = None
            self.saliency.set_data(None, None)
            self.smooth.set_data(None, None)
            return

        def work(ctx: Any) -> Any:
            ctx.report(0, 1, f"Columns of {name}")
            return weight_columns(ckpt, name)

        self.columns_job.start(f"Weight columns of {name}", work)

    def _columns_done(self, cols: Any) -> None:
        stats = self.state.activation_stats
        st = stats.inputs.get(cols.name) if stats is not None else None
        if st is None or cols.name != self.state.selected_tensor:
            return
        try:
            self._columns = cols
            self.saliency.set_data(st, cols, cols.name)
            self.smooth.set_data(st, cols, cols.name)
        except StudioError as err:
            self._views_error(str(err))
            return
        self.viewsShown.emit(cols.name)

    def _views_error(self, message: str) -> None:
        self.saliency.set_data(None, None)
        self.smooth.set_data(None, None)
        self.show_error(message)

    # -- dialogs ----------------------------------------------------------------------------------

    def _browse_text(self) -> None:
        chat = self.source == "chat"
        filt = "Chats (*.jsonl);;All files (*)" if chat else "Text (*.txt *.md);;All files (*)"
        start = folders.start_in(
            self.state, Path(self.path_edit.text()).parent if self.path_edit.text() else ""
        )
        path, _ = QFileDialog.getOpenFileName(self, "Calibration text", start, filt)
        if path:
            folders.remember(self.state, path)
            self.path_edit.setText(path)

    def _save_dialog(self) -> None:
        name = f"{self.state.model_name or 'model'}.imatrix.gguf"
        start = str(Path(folders.start_in(self.state)) / name)
        path, chosen = QFileDialog.getSaveFileName(self, "Save the importance matrix", start, IMATRIX_FILTERS)
        if path:
            folders.remember(self.state, path)
            legacy = chosen.startswith("Legacy") or path.lower().endswith(".dat")
            self.save_imatrix(path, "dat" if legacy else "gguf")

    def _load_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Load an importance matrix",
            folders.start_in(self.state),
            "llama.cpp imatrix (*.gguf *.dat);;All files (*)",
        )
        if path:
            folders.remember(self.state, path)
            self.load_imatrix(path)

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        self.saliency.recolor(dark)
        self.smooth.recolor(dark)

    def shutdown(self) -> None:
        """Stop the run (the window is closing)."""
        self.task.cancel(quiet=True)
        self.columns_job.cancel(quiet=True)
