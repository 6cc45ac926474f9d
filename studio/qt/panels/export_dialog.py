"""The Export dialog: the open model → a GGUF file, with a preset or the current plan, then verified.

The export runs as one background job (``studio.core.export.run.export_gguf``); with "Verify" on, the
finished file is checked by ``studio.core.export.verify.verify_gguf`` (in a child process) *before* it gets
its final name, so Cancel at any point leaves no output file. With a calibrated method (imatrix,
gptq, awq, awq+gptq) the job is Calibrate & Quantize (``studio.core.calib.quantize.export_calibrated``):
the calibration text runs through the model layer by layer, the progress line names the layer, the
chunk and the ETA, and Cancel stops it at the next column batch. A verification that cannot run (e.g.
transformers does not know the architecture) is reported next to the result but does not throw the
export away.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from studio.core.calib.data import BUILTIN, MIXED_METHODS, calibration_sources, guess_chunks
from studio.core.calib.quantize import export_calibrated, plan_sources
from studio.core.cluster import open_executor
from studio.core.errors import ExportError, StudioError
from studio.core.evaluate.last_word import LastWord, LastWordCheck, LastWordGate, WorseThanPromisedError
from studio.core.evaluate.verification import verification_line
from studio.core.export.job import ExportOutcome, export_and_verify, verify_in_child
from studio.core.export.run import export_gguf
from studio.core.jobs import JobContext
from studio.core.model.gguf_source import hf_folder_cached, hf_folder_for, source_summary
from studio.core.model.rotate import Rotation, rotation_of
from studio.core.plan.imatrix_need import ImatrixRequiredError, check_imatrix
from studio.core.plan.job_estimate import calibration_estimate_line, lattice_weights, thin_calibration
from studio.core.plan.plan import Plan, plan_from_preset, with_method
from studio.core.plan.presets import PRESETS
from studio.core.quant.methods import ALIASES, METHODS
from studio.core.quant.warm import ensure_compiled
from studio.qt import folders, widgets
from studio.qt.fmt import human_bytes, model_display_name
from studio.qt.jobs import Job, JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import ask_yes_no, choose
from studio.qt.panels.device_selector import device_choices
from studio.qt.settings import AppSettings
from studio.qt.state import StudioState
from studio.qt.theme import set_status
from studio.qt.upload_dialog import open_upload_dialog

__all__ = ["ExportDialog", "ExportOutcome", "CURRENT_PLAN", "run_export"]

CURRENT_PLAN = "__current_plan__"
DEFAULT_PRESET = "Q4_K_M"
BACKENDS = (("studio", "Quant Studio (streamed)"), ("llama.cpp", "llama.cpp llama_model_quantize"))
PROGRESS_STEPS = 1000
CONVERT_SHARE = 0.4  # of a rotated export's bar: converting a GGUF original into its float32 folder
BEST_METHOD = ALIASES["best"]  # the calibrated rounding recommended with a preset (as export --budget says)


def _exportable(info: Any) -> bool:
    """Whether ``info`` (a ModelInfo) can be exported (a GGUF original is requantized)."""
    return bool(getattr(info, "tensors", ()))


def _requantize_warning(checkpoint: Any) -> str:
    """The warning for an already quantized GGUF original ("" for any other model)."""
    g = getattr(checkpoint, "gguf", None)
    if g is None:
        return ""

    s = source_summary(g)
    return f"Stored as {s.describe()}." + (f"\n⚠ {s.warning}" if s.warning else "")


def run_export(
    ctx: JobContext,
    source: Path,
    out: Path,
    plan: Plan | str,
    *,
    device: str = "cpu",
    backend: str = "studio",
    verify: bool = True,
    allow_pickle: bool = False,
    calib_text: Any = None,
    calib_chunks: int | None = None,
    imatrix: Any = None,
    cluster: str | None = None,
    rotation: Rotation | None = None,
    last_word: LastWordCheck | None = None,
) -> ExportOutcome:
    """Export ``source`` to ``out`` and (optionally) verify it in a child process before it is renamed
    into place (``studio.core.export.job.export_and_verify``, the job ``export --verify`` runs too).

    A ``plan`` with calibrated methods is calibrated on ``calib_text`` (a file, a list of them to mix, None:
    the built-in text; the first ``calib_chunks`` chunks of 512 tokens, None: all) and quantized by its methods first, each
    layer's tensors on the Ray ``cluster`` when one is named (the window's device choice). ``rotation``
    folds a randomised Hadamard rotation into the weights (``studio.core.model.rotate``; a GGUF ``source`` is
    converted to its cached Hugging Face folder first). With ``last_word``
    (a budget plan's check), llama.cpp measures the partial file first, as ``export --budget`` does: a file
    worse than promised raises ``WorseThanPromisedError`` and nothing is written, unless the check keeps it.
    """
    gates: list[LastWordGate] = []
    if rotation is not None and source.suffix.lower() == ".gguf":
        # the rotation is folded into float weights: a GGUF original's float32 Hugging Face folder, the one
        # calibration and export --rotate use (converted once into the cache as the job's first part)
        split = 0.0 if hf_folder_cached(source) else CONVERT_SHARE
        source, ctx = hf_folder_for(source, ctx.span(0.0, split)), ctx.span(split, 1.0)

    def write(c: JobContext, validate: Any) -> Any:
        if last_word is not None:  # llama.cpp's verdict before verification and the rename
            gates.append(LastWordGate(last_word, ctx=c, validate=validate))
            validate = gates[-1]
        calibrated = isinstance(plan, Plan) and plan.calibrated
        if calibrated or backend == "studio":  # kernels compiled here would hold the GIL (quant/warm.py)
            ensure_compiled(c)
        if calibrated:
            executor = open_executor(cluster)
            try:
                return export_calibrated(
                    source,
                    out,
                    plan,
                    text=calib_text or BUILTIN,
                    n_chunks=calib_chunks,
                    device=device,
                    ctx=c,
                    validate=validate,
                    allow_pickle=allow_pickle,
                    executor=executor,
                    rotation=rotation,
                )
            finally:
                executor.close()
        return export_gguf(
            source,
            out,
            plan,
            device=device,
            backend=backend,
            ctx=c,
            validate=validate,
            allow_pickle=allow_pickle,
            imatrix=imatrix,
            rotation=rotation,
        )

    outcome = export_and_verify(ctx, source, write, verify=verify_in_child(device) if verify else None)
    return dataclasses.replace(outcome, last_word=gates[-1].word) if gates else outcome


def _word_text(word: LastWord, *, kept: bool = False) -> str:
    """llama.cpp's verdict on a budget plan's file in the window's words (its buttons, not the CLI's options)."""
    if word.ok:
        return word.sentence
    instead = (
        f"export llama.cpp's {word.preset} with {BEST_METHOD} instead"
        if word.preset
        else "choose a larger budget"
    )
    return word.verdict(instead=instead, keep="it was kept anyway" if kept else "Keep anyway to write it")


def _same_plan(a: Any, b: Any) -> bool:
    """A preset name equal, or the very same plan object."""
    return a == b if isinstance(a, str) and isinstance(b, str) else a is b


class ExportDialog(JobPanel, QDialog):
    """Preset or current plan, output file, device, back end and verification; progress and result."""

    exportStarted = Signal(object)  # the Job
    exportFinished = Signal(object)  # ExportOutcome
    exportFailed = Signal(str)  # one sentence
    exportCancelled = Signal()

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._requirement_memo: tuple[Any, Any, Any, str] | None = None
        self.setObjectName("ExportDialog")
        self.setWindowTitle("Export GGUF")
        self.init_task(state, jobs, "export", progress=True)
        self.settings = AppSettings()  # the user's; the window hands in its own with remember_in
        self.outcome: ExportOutcome | None = None
        self.refused: LastWord | None = None  # llama.cpp's verdict on the budget file not written
        self._refused_box: list[LastWord] = []  # the running job's verdict, filled on its worker thread
        self._keep_anyway = False  # the next start keeps a budget file worse than promised (labelled)
        self._path_edited = False
        self._build()
        state.planChanged.connect(self._fill_plans)
        state.modelOpened.connect(lambda _c: self.reset())
        state.modelClosed.connect(self.reset)
        state.hardwareChanged.connect(lambda _hw: self._fill_devices(self.device))
        state.imatrixChanged.connect(lambda _im: self.update_controls())
        self.reset(device="cpu")

    def remember_in(self, settings: AppSettings) -> None:
        """Take the remembered folder, preset and back end from ``settings``, and keep new ones there."""
        self.settings = settings
        self.reset()

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        self.model_label = QLabel("–", self)
        self.model_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plan_combo = QComboBox(self)
        self.plan_combo.setToolTip("A llama.cpp preset, or the plan edited on the Plan page")
        self.plan_combo.currentIndexChanged.connect(self._on_plan_changed)
        self.plan_info = QLabel("", self)
        self.plan_info.setWordWrap(True)
        # the importance-matrix requirement of the chosen plan (IQ2_XXS, Q2_K_S, ...), shown before export
        self.requirement = QLabel("", self)
        self.requirement.setWordWrap(True)
        self.requirement.setVisible(False)
        # the calibrated job's estimated peak memory and time (studio.core.plan.job_estimate), before it starts
        self.estimate_label = QLabel("", self)
        self.estimate_label.setWordWrap(True)
        self.path_edit = QLineEdit(self)
        self.path_edit.setPlaceholderText("Where to write the .gguf file")
        self.path_edit.textEdited.connect(self._on_path_edited)
        self.browse_button = widgets.button("Browse…", self, self.browse)
        output_row = widgets.path_row(self.path_edit, self.browse_button)
        self.device_combo = QComboBox(self)
        self.device_combo.setToolTip("Where quantization and verification run")
        self.backend_combo = widgets.combo_box(
            self,
            [(label, key) for key, label in BACKENDS],
            tip="Quant Studio streams the checkpoint through its own quantizers; llama.cpp quantizes our F32 "
            "export with llama_model_quantize (same tensor types, same bytes without an imatrix)",
        )
        self.verify_check = QCheckBox(
            "Verify the file against the original model (llama.cpp vs transformers)", self
        )
        self.verify_check.setChecked(True)
        self.method_combo = widgets.combo_box(
            self,
            [(f"{name} — {m.description}", name) for name, m in METHODS.items()],
            tip="How codes and scales are chosen; the file keeps the plan's types (and size) whatever the method",
        )
        self.calib_edit = widgets.line_edit(self, "Built-in calibration text (prose, chats, code, languages)")
        self.calib_browse = widgets.button("Browse…", self, self.browse_calibration)
        calib_row = widgets.path_row(self.calib_edit, self.calib_browse)
        self.calib_mix_check = QCheckBox("Add the built-in text after mine (gptq, awq+gptq)", self)
        self.calib_mix_check.setChecked(True)
        self.calib_mix_check.setToolTip(
            "GPTQ fits the text it is shown: your text followed by the built-in mix of prose, chats, code and "
            "languages held better on other kinds of text (on the demo, 0.39× llama.cpp's KL on Python code "
            "against 0.53× on licence prose alone; on the 1.5B bench model GPTQ 1.30× against 1.66×)"
        )
        self.chunks_spin = widgets.spin_box(
            self,
            0,
            100_000,
            special="all",
            suffix=" × 512 tokens",
            tip="How much of the calibration text to use (all: every whole chunk)",
        )
        self.imatrix_check = QCheckBox("Quantize with the importance matrix", self)
        self.imatrix_check.setChecked(True)
        self.imatrix_check.setToolTip(
            "The imatrix computed or loaded on the Calibrate page, used as llama-quantize --imatrix uses it"
        )

        self.rotate_check = QCheckBox("Rotate: fold a randomised Hadamard rotation into the weights", self)
        self.rotate_check.setToolTip(
            "QuaRot's R1 and R2, written into the weights: the file computes the same function and any "
            "llama.cpp runs it; outlier channels are spread out before quantization (a tied head is untied). "
            "Gemma 1-3, OLMo 2 and BERT get R2 (within each head) alone, since their norms cannot be folded"
        )

        form = QFormLayout()
        form.addRow("Model:", self.model_label)
        form.addRow("Plan:", self.plan_combo)
        form.addRow("", self.plan_info)
        form.addRow("", self.requirement)
        form.addRow("", self.estimate_label)
        form.addRow("Output file:", output_row)
        form.addRow("Method:", self.method_combo)
        form.addRow("Calibration:", calib_row)
        form.addRow("", self.calib_mix_check)
        form.addRow("Chunks:", self.chunks_spin)
        form.addRow("Device:", self.device_combo)
        form.addRow("Back end:", self.backend_combo)
        form.addRow("", self.verify_check)
        form.addRow("", self.imatrix_check)
        form.addRow("", self.rotate_check)

        self.progress = QProgressBar(self)
        self.progress.setRange(0, PROGRESS_STEPS)
        self.progress.setValue(0)
        self.progress.setTextVisible(True)
        self.status = QLabel("", self)
        self.status.setObjectName("ExportStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result_label = QLabel("", self)
        self.result_label.setObjectName("ExportResult")
        self.result_label.setWordWrap(True)
        self.result_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.export_button = widgets.button("Export", self, self.start, default=True)
        self.cancel_button = widgets.button("Cancel export", self, self.cancel)
        self.close_button = widgets.button("Close", self, self.hide)
        self.upload_button = widgets.button(
            "Upload to the Hub…", self, self._upload
        )  # the next step, once a file exists
        self.show_folder_button = widgets.button(
            "Show in folder",
            self,
            self.show_in_folder,
            tip="Open the exported file's folder in the file manager",
        )
        # llama.cpp measured a budget plan's file worse than promised: nothing was written; the two ways on
        self.recommend_button = widgets.button(
            "Export the preset instead",
            self,
            self.export_recommended,
            tip="Export llama.cpp's preset of the same size with calibrated rounding, as the message says",
        )
        self.keep_anyway_button = widgets.button(
            "Keep anyway (worse than promised)",
            self,
            self.keep_anyway,
            tip="Export the budget plan again and keep its file although llama.cpp measures it worse than "
            "promised (labelled KEPT ANYWAY, as export --keep-if-worse)",
        )
        refused = QHBoxLayout()
        refused.addWidget(self.recommend_button)
        refused.addWidget(self.keep_anyway_button)
        refused.addStretch(1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.upload_button)
        buttons.addWidget(self.show_folder_button)
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.close_button)

        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addSpacing(6)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.result_label)
        lay.addLayout(refused)
        lay.addStretch(1)
        lay.addLayout(buttons)
        self.setMinimumWidth(620)
        self.method_combo.currentIndexChanged.connect(self._on_method_changed)
        self.chunks_spin.valueChanged.connect(lambda *_: self._show_estimate())
        self.calib_mix_check.toggled.connect(lambda *_: self._show_estimate())
        self.imatrix_check.toggled.connect(self._show_requirement)
        self.calib_edit.textChanged.connect(self._on_calib_edited)

    # -- public -----------------------------------------------------------------------------------

    @property
    def job(self) -> Job | None:
        """The newest export started here (running or not), or None."""
        return self.task.job

    @property
    def device(self) -> str:
        """The chosen device id ("cpu", "cuda:0", "mps")."""
        return str(self.device_combo.currentData() or "cpu")

    @property
    def backend(self) -> str:
        """The chosen back end ("studio" or "llama.cpp")."""
        return str(self.backend_combo.currentData() or "studio")

    @property
    def output_path(self) -> Path | None:
        """The output file typed or chosen, or None when the field is empty."""
        text = self.path_edit.text().strip()
        return Path(text).expanduser() if text else None

    @property
    def imatrix(self) -> Any:
        """The state's importance matrix when "Quantize with the importance matrix" is on, else None (for a
        plan the budget dialog made for the rotated model: the rotated model's, from its scan)."""
        if not self.imatrix_check.isChecked():
            return None
        rotated = self.rotated_check()
        return rotated.imatrix if rotated is not None else self.state.imatrix

    def rotated_check(self) -> Any:
        """The budget dialog's ``LastWordCheck`` of the chosen plan when it was planned for the rotated model
        (its ``info`` is the rotated view's: the plan names its tensors, an untied head included), else None."""
        check = self.state.plan_check if self.chosen_plan() is self.state.plan else None
        return check if check is not None and rotation_of(check.info) is not None else None

    def planned_info(self) -> Any:
        """The ``ModelInfo`` the chosen plan is made for: the rotated model's for a rotated budget plan, else
        the open model's (None without one)."""
        rotated = self.rotated_check()
        return rotated.info if rotated is not None else self.state.info

    def chosen_plan(self) -> Plan | str | None:
        """The current ``Plan`` or a preset name, as chosen in the combo."""
        key = self.plan_combo.currentData()
        if key == CURRENT_PLAN:
            return self.state.plan if isinstance(self.state.plan, Plan) else None
        return str(key) if key else None

    @property
    def method(self) -> str:
        """The chosen method ("rtn", "imatrix", "gptq", "awq", "awq+gptq")."""
        return str(self.method_combo.currentData() or "rtn")

    def set_method(self, method: str) -> None:
        """Choose a method by name (ValueError if unknown)."""
        if not choose(self.method_combo, method):
            raise ValueError(f"unknown method {method!r}")

    @property
    def calibration_text(self) -> Path | None:
        """The calibration file typed or chosen, or None for the built-in text."""
        text = self.calib_edit.text().strip()
        return Path(text).expanduser() if text else None

    def set_calibration(self, path: str | Path | None, chunks: int = 0, *, own_only: bool = False) -> None:
        """Calibrate on ``path`` (None: the built-in text), its first ``chunks`` chunks (0: all); awq+gptq adds
        the built-in text after ``path`` unless ``own_only``."""
        self.calib_edit.setText("" if path is None else str(path))
        self.chunks_spin.setValue(chunks)
        self.calib_mix_check.setChecked(not own_only)

    @property
    def calibration_sources(self) -> Any:
        """What the export calibrates on: the final plan's ``plan_sources`` (the chosen method's
        ``calibration_sources`` while no calibrated plan is chosen)."""
        own = self.calibration_text
        own_text, own_only = None if own is None else str(own), not self.calib_mix_check.isChecked()
        try:
            plan = self.final_plan()
        except StudioError:
            plan = None
        if isinstance(plan, Plan):
            return plan_sources(plan, own_text, own_only=own_only)
        return calibration_sources(own_text, self.method, own_only=own_only)

    def final_plan(self) -> Plan | str | None:
        """The plan the export follows: the chosen one with the chosen method as its plan-wide default."""
        plan, info, method = self.chosen_plan(), self.planned_info(), self.method
        if plan is None or info is None:
            return plan
        if isinstance(plan, str):
            if method == "rtn":
                return plan
            plan = plan_from_preset(info, plan, imatrix=True)
        return plan if plan.method == method else with_method(plan, info, method)

    @Slot()
    def browse_calibration(self) -> None:
        """Ask for a calibration text (UTF-8 .txt, or .jsonl of chats)."""
        start = str(self.calibration_text or folders.start_in(self.state))
        path, _ = QFileDialog.getOpenFileName(
            self, "Calibration text", start, "Text or chats (*.txt *.jsonl);;All files (*)"
        )
        if path:
            folders.remember(self.state, path)
            self.calib_edit.setText(path)

    def set_plan_choice(self, key: str) -> None:
        """Choose a preset by name, or the current plan with ``CURRENT_PLAN`` (ValueError if not offered)."""
        if not choose(self.plan_combo, key):
            raise ValueError(f"{key!r} is not offered")

    def set_output_path(self, path: str | Path) -> None:
        """Write to ``path`` (as if typed)."""
        self.path_edit.setText(str(path))
        self._path_edited = True

    def set_device(self, device: str) -> bool:
        """Choose ``device`` if offered; returns whether it was."""
        return choose(self.device_combo, device)

    def set_backend(self, backend: str) -> None:
        """Choose the back end ("studio" or "llama.cpp")."""
        if not choose(self.backend_combo, backend):
            raise ValueError(f"unknown back end {backend!r}")

    @Slot()
    def reset(self, device: str | None = None) -> None:
        """Fill the fields for the open model (keeps them while an export runs)."""
        if self.running:
            return
        info = self.state.info
        self.model_label.setText(self.state.model_name or "no model open")
        if info is not None:
            self.model_label.setToolTip(str(info.path))
        self._fill_devices(device or self.device)
        i = self.backend_combo.findData(self.settings.export_backend)
        self.backend_combo.setCurrentIndex(max(i, 0))
        self._path_edited = False
        self.refused = None
        self._fill_plans()
        self.progress.setValue(0)
        set_status(self.status, "")
        self.result_label.setText("")
        self.update_controls()

    @Slot()
    def browse(self) -> None:
        """Ask for the output file with a save dialog."""
        start = str(self.output_path or self._default_path() or Path.home())
        path, _ = QFileDialog.getSaveFileName(self, "Export GGUF to", start, "GGUF files (*.gguf)")
        if path:
            folders.remember(self.state, path)
            if not path.lower().endswith(".gguf"):
                path += ".gguf"
            self.set_output_path(path)

    @Slot()
    def start(self) -> Job | None:
        """Start the export job; None (with a sentence in the dialog) when something is missing."""
        if self.running:
            # A second click while it runs changes nothing
            # (test_export_dialog.py::test_cancel_leaves_no_file_and_the_window_still_answers).
            return None
        info = self.state.info
        if info is None:
            return self._refuse("Open a model before exporting.")
        if not _exportable(info):
            return self._refuse(f"{Path(info.path).name} has no tensors to export.")
        try:
            plan = self.final_plan()
        except StudioError as err:
            return self._refuse(str(err))
        if plan is None:
            return self._refuse("Choose a preset, or make a plan on the Plan page first.")
        calibrated = isinstance(plan, Plan) and plan.calibrated
        if not calibrated and (need := self.imatrix_requirement()):
            return self._refuse(need)  # before any work: nothing is written
        calib = self.calibration_text
        if calibrated and calib is not None and not calib.is_file():
            return self._refuse(f"The calibration text {calib} does not exist; choose another file.")
        out = self.output_path
        if out is None:
            return self._refuse("Choose where to write the GGUF file.")
        if out.suffix.lower() != ".gguf":
            return self._refuse(f"The output name {out.name} should end in .gguf.")
        if not out.parent.is_dir():
            return self._refuse(f"The folder {out.parent} does not exist; choose another output folder.")
        if out.exists():
            if not ask_yes_no(
                self,
                "Replace the file?",
                f"{out.name} already exists in {out.parent}. Replace it once the new file is complete?",
            ):
                return None
        self.settings.export_folder = str(out.parent)
        self.settings.export_backend = self.backend
        if isinstance(plan, str):
            self.settings.export_preset = plan
        self.settings.sync()

        source = Path(info.path)
        device, backend, verify = self.device, self.backend, self.verify_check.isChecked()
        if calibrated:
            backend = "studio"  # calibrated codes are written by the studio's exporter
        chunks = self.chunks_spin.value() or None
        sources = self.calibration_sources
        imatrix = self.imatrix
        rotated = self.rotated_check()  # a budget plan for the rotated model is exported rotated, as planned
        rotation = rotation_of(rotated.info) if rotated is not None else None
        if rotation is None and self.rotate_check.isChecked():
            rotation = Rotation()
        if rotation is not None and imatrix is not None and rotated is None:
            return self._refuse(
                "The importance matrix was measured on the unrotated model; untick it or the rotation "
                "(a calibrated method measures the rotated model itself)."
            )
        cluster = self.state.cluster if calibrated else None  # the window's device choice
        # A pickle checkpoint is open only because the user opted in; the export reads it the same way.
        allow_pickle = str(getattr(info.format, "value", info.format)) == "pytorch"
        # a budget plan, unedited: llama.cpp measures its file before the rename, as export --budget does
        check = self.state.plan_check if self.chosen_plan() is self.state.plan else None
        if check is not None and self._keep_anyway:
            check = dataclasses.replace(check, keep_if_worse=True)
        self.outcome, self.refused = None, None
        self.progress.setValue(0)
        self.result_label.setText("")
        self._set_status(f"{'Calibrating and quantizing' if calibrated else 'Exporting'} to {out.name}…")

        refused: list[LastWord] = []  # llama.cpp's verdict on a file not written, for on_error

        def task(ctx: JobContext) -> ExportOutcome:
            try:
                return run_export(
                    ctx,
                    source,
                    out,
                    plan,
                    device=device,
                    backend=backend,
                    verify=verify,
                    allow_pickle=allow_pickle,
                    calib_text=sources,
                    calib_chunks=chunks,
                    imatrix=imatrix,
                    cluster=cluster,
                    rotation=rotation,
                    last_word=check,
                )
            except WorseThanPromisedError as err:
                # nothing was written: the job fails (the Jobs panel says so) and the dialog offers two ways on
                refused.append(err.word)
                raise ExportError(
                    f"No file was written: {_word_text(err.word)}"
                ) from err  # the window's words

        plan_name = plan if isinstance(plan, str) else plan.name
        if calibrated:
            title = f"Calibrate & Quantize {model_display_name(source)} ({plan_name}, {self.method})"
        else:
            title = f"Exporting {model_display_name(source)} ({plan_name})"
        self._refused_box = refused
        job = self.task.start(title, task, confirm_on_quit=True)
        self.update_controls()
        self.exportStarted.emit(job)
        return job

    @Slot()
    def cancel(self) -> None:
        """Ask the running export to stop; its partial file is removed."""
        if self.running:
            self.task.cancel()
            self._set_status("Cancelling…")
            self.cancel_button.setEnabled(False)

    # -- job feedback (GUI thread) ---------------------------------------------------------------------

    def on_progress(self, job: Job) -> None:
        if job.total > 0:
            self.progress.setValue(int(PROGRESS_STEPS * min(1.0, job.done / job.total)))
        if job.message and not job.context.cancelled:
            self.status.setText(job.message)

    @Slot()
    def show_in_folder(self) -> bool:
        """Open the folder of the last exported file in the desktop's file manager."""
        if self.outcome is None:
            return False
        return folders.show_in_folder(self.outcome.result.path)

    def on_done(self, outcome: ExportOutcome) -> None:
        self.outcome = outcome
        self.update_controls()
        self.progress.setValue(PROGRESS_STEPS)
        r = outcome.result
        self._set_status(
            ("KEPT ANYWAY (worse than promised): " if outcome.kept_anyway else "")
            + f"Wrote {r.path} ({human_bytes(r.file_bytes)}, {r.n_tensors} tensors, {r.bpw:.2f} bits per "
            f"weight) in {r.seconds:.1f} s."
            + "".join(f" {n}" for n in r.rotation_notes)  # R2 alone on a family R1 cannot fold: why
        )
        text = self._verification_text(outcome)
        if outcome.last_word is not None:  # llama.cpp's own verdict on a budget plan's file first
            text = f"{_word_text(outcome.last_word, kept=True)} {text}"
        c = outcome.calibration
        if c is not None:
            text = (
                f"{c.method}: calibrated on {c.tokens:,} tokens ({c.n_chunks} × {c.n_ctx}) of {c.dataset} "
                f"in {c.seconds:.0f} s. " + " ".join(c.warnings) + ("\n" if c.warnings else " ") + text
            )
        set_status(self.result_label, text, error=bool(outcome.verify_error))
        self.exportFinished.emit(outcome)

    def on_error(self, message: str) -> None:
        if self._refused_box:  # llama.cpp's verdict: the budget file was not written
            self._show_refused(self._refused_box[-1])
            return
        self.update_controls()
        self._set_status(message, error=True)
        self.exportFailed.emit(message)

    def _show_refused(self, word: LastWord) -> None:
        """llama.cpp measured the budget file worse than promised and it was not written: one sentence, and
        the buttons for the same-size preset and for keeping the file anyway."""
        self.refused = word
        self.update_controls()
        self.progress.setValue(0)
        text = f"No file was written: {_word_text(word)}"
        self._set_status(text, error=True)
        self.exportFailed.emit(text)

    @Slot()
    def export_recommended(self) -> Job | None:
        """Export the same-size preset llama.cpp's verdict recommends, with calibrated rounding."""
        word = self.refused
        if word is None or word.preset is None or self.running:
            return None
        self.set_plan_choice(word.preset)
        self.set_method(BEST_METHOD)
        return self.start()

    @Slot()
    def keep_anyway(self) -> Job | None:
        """Export the refused budget plan again and keep its file although it is worse than promised
        (labelled KEPT ANYWAY; the command line's ``--keep-if-worse``)."""
        if self.refused is None or self.running:
            return None
        self._keep_anyway = True
        try:
            return self.start()
        finally:
            self._keep_anyway = False

    def on_cancel(self) -> None:
        self.update_controls()
        self.progress.setValue(0)
        self._set_status("Export cancelled; no file was written.")
        self.exportCancelled.emit()

    @staticmethod
    def _verification_text(outcome: ExportOutcome) -> str:
        v = outcome.verification
        if outcome.verify_error:
            return f"The file was written but could not be verified: {outcome.verify_error}"
        if v is None:
            return "Not verified."
        notes = "".join(f" {n}" for n in getattr(v, "notes", ()))  # e.g. a llama.cpp restart
        # Evaluate's definitions and verdict rule, and what the quick check was measured on
        return f"Verified: {verification_line(v)} (max logit difference {v.max_abs_diff:.3g}).{notes}"

    # -- helpers ----------------------------------------------------------------------------------

    def _refuse(self, message: str) -> None:
        self._set_status(message, error=True)
        return None

    def _set_status(self, text: str, *, error: bool = False) -> None:
        set_status(self.status, text, error=error)

    def update_controls(self) -> None:
        running = self.running
        has_model = self.state.info is not None and _exportable(self.state.info)
        self.export_button.setEnabled(has_model and not running)
        self.cancel_button.setEnabled(running)
        for w in (self.plan_combo, self.path_edit, self.browse_button, self.device_combo, self.method_combo):
            w.setEnabled(not running)
        self.verify_check.setEnabled(not running)
        calibrated = self.method != "rtn"
        for w in (self.calib_edit, self.calib_browse, self.chunks_spin):
            w.setEnabled(calibrated and not running)
        # only gptq and awq+gptq mix, and only a text of the user's has anything to add the built-in text to
        self.calib_mix_check.setEnabled(
            self.method in MIXED_METHODS and bool(self.calib_edit.text().strip()) and not running
        )
        # calibrated codes are the studio's own: llama.cpp's quantizer cannot write them
        self.backend_combo.setEnabled(not calibrated and not running)
        rotated = self.rotated_check()  # a rotated budget plan brings the rotated model's imatrix
        has_im = (rotated.imatrix if rotated is not None else self.state.imatrix) is not None
        # a calibrated method computes its own statistics; the Calibrate page's imatrix serves rtn
        self.imatrix_check.setEnabled(has_im and not calibrated and not running)
        note = (
            " (none: Calibrate page)"
            if not has_im
            else " (the method calibrates itself)"
            if calibrated
            else ""
        )
        self.imatrix_check.setText("Quantize with the importance matrix" + note)
        self.upload_button.setEnabled(self.outcome is not None and not running)
        word = self.refused
        self.recommend_button.setVisible(word is not None and word.preset is not None)
        if word is not None and word.preset is not None:
            self.recommend_button.setText(f"Export {word.preset} ({BEST_METHOD}) instead")
        self.keep_anyway_button.setVisible(word is not None)
        for b in (self.recommend_button, self.keep_anyway_button):
            b.setEnabled(not running)
        self.show_folder_button.setEnabled(self.outcome is not None)
        self._show_requirement()
        self._show_estimate()

    def _show_estimate(self) -> None:
        """The estimate line (with GPTQ's thin-calibration warning, several wrapped lines), the dialog grown
        to hold it: a word-wrapped label's height is not in the form's minimum, so it was drawn over the
        rows above it."""
        self.estimate_label.setText(self.job_estimate())
        QTimer.singleShot(0, self._fit_height)  # once the layout has taken the new text

    def _fit_height(self) -> None:
        layout = self.layout()
        if layout is not None and layout.hasHeightForWidth():
            need = layout.totalHeightForWidth(self.width())
            if need > self.height():
                self.resize(self.width(), need)

    def job_estimate(self) -> str:
        """The calibrated export's estimated peak memory and time ("" without a model or for rtn)."""
        info = self.state.info
        if info is None or self.method == "rtn":
            return ""
        chunks = self.chunks_spin.value()
        if not chunks:  # "all": as many as the text holds, guessed from its size until it is tokenized
            own = self.calibration_text
            src = calibration_sources(
                None if own is None else str(own), self.method, own_only=not self.calib_mix_check.isChecked()
            )
            chunks = guess_chunks(src, 512)
        device = str(self.device_combo.currentData() or "cpu")
        guessed = not self.chunks_spin.value()
        plan, planned = self.final_plan(), self.planned_info() or info
        lattice = (
            lattice_weights(planned, plan.types, lambda name: "gptq" in plan.method_of(name))
            if isinstance(plan, Plan)
            else None
        )  # GPTQ onto i-quant lattices costs per weight: a 1.5B's IQ3_XXS takes three times its Q3_K_M
        line = calibration_estimate_line(
            info.config, self.method, 512, chunks, device, guessed=guessed, lattice=lattice
        )
        thin = thin_calibration(info.config, self.method, 512, chunks)
        return f"{line}\n⚠ {thin}" if line and thin else line

    def _show_requirement(self, *_args: Any) -> None:
        text = self.imatrix_requirement()
        set_status(self.requirement, text, error=True)
        self.requirement.setVisible(bool(text))

    def imatrix_requirement(self) -> str:
        """The sentence naming the tensors of the chosen plan that need an importance matrix it will not
        have ("" when none do, or when the chosen method calibrates)."""
        info = self.planned_info()
        if info is None or self.method != "rtn":
            return ""
        chosen, imatrix = self.chosen_plan(), self.imatrix
        memo = self._requirement_memo
        # the same inputs as last time (start() and update_controls() ask again): the same sentence, not
        # a preset's plan made again on the GUI thread (~20 ms each)
        if memo is not None and memo[0] is info and memo[2] is imatrix and _same_plan(memo[1], chosen):
            return memo[3]
        text = self._requirement(info, chosen)
        self._requirement_memo = (info, chosen, imatrix, text)
        return text

    def _requirement(self, info: Any, plan: Any) -> str:
        try:
            if isinstance(plan, str):
                plan = plan_from_preset(info, plan, imatrix=self.imatrix is not None)
            if not isinstance(plan, Plan):
                return ""
            check_imatrix(plan, info, self.imatrix)
        except ImatrixRequiredError as err:
            return (
                f"{err.message} Choose the imatrix method (it calibrates on the text below), or compute "
                "an importance matrix on the Calibrate page."
            )
        except StudioError:
            return ""
        return ""

    def _upload(self) -> None:
        self.upload_dialog = open_upload_dialog(self, self.outcome, self.jobs)

    def _fill_devices(self, wanted: str) -> None:
        self.device_combo.blockSignals(True)
        self.device_combo.clear()
        for dev, label in device_choices(self.state.hardware):
            self.device_combo.addItem(label, dev)
        i = self.device_combo.findData(wanted)
        self.device_combo.setCurrentIndex(i if i >= 0 else self.device_combo.count() - 1)  # else the CPU
        self.device_combo.blockSignals(False)

    @Slot()
    def _fill_plans(self, *_args: Any) -> None:
        if self.running:
            return
        previous = self.plan_combo.currentData()
        self.plan_combo.blockSignals(True)
        self.plan_combo.clear()
        plan = self.state.plan
        if isinstance(plan, Plan) and self.state.info is not None:
            self.plan_combo.addItem(f"Current plan from the Plan page ({plan.name})", CURRENT_PLAN)
            self.plan_combo.insertSeparator(1)
        for name, preset in PRESETS.items():
            self.plan_combo.addItem(f"{name} — {preset.description}", name)
        if previous is None:
            previous = (
                CURRENT_PLAN if isinstance(plan, Plan) else (self.settings.export_preset or DEFAULT_PRESET)
            )
        i = self.plan_combo.findData(previous)
        if i < 0:
            i = self.plan_combo.findData(DEFAULT_PRESET)
        self.plan_combo.setCurrentIndex(max(i, 0))
        self.plan_combo.blockSignals(False)
        self._on_plan_changed()

    @Slot()
    def _on_plan_changed(self, *_args: Any) -> None:
        plan, info = self.chosen_plan(), self.planned_info()
        rotated = self.rotated_check() is not None
        if rotated:  # planned for the rotated model: written rotated (the box says so and stays ticked)
            self.rotate_check.setChecked(True)
        self.rotate_check.setEnabled(not rotated and not self.running)
        text = ""
        if isinstance(plan, Plan) and info is not None:
            try:
                s = plan.summary(info)
                text = f"{human_bytes(s.total_bytes)} of tensors, {s.bpw:.2f} bits per weight"
                if plan.fallbacks:
                    text += f"; {len(plan.fallbacks)} tensor(s) use a fallback type"
            except StudioError as err:
                text = str(err)
            check = self.state.plan_check if plan is self.state.plan else None
            if check is not None:  # said before the export starts, not only when it refuses
                beside = f" and llama.cpp's {check.preset}" if check.preset else ""
                text += (
                    f"; a budget plan: llama.cpp measures its file{beside} before it is written, and a file "
                    "worse than promised is not written"
                )
                if rotated:
                    text += "; planned for the rotated model, so it is written rotated"
        warning = _requantize_warning(self.state.checkpoint)
        text = f"{text}\n{warning}".strip() if warning else text
        self.plan_info.setText(text)
        self.plan_info.setVisible(bool(text))
        if isinstance(plan, Plan) and not self.running:
            choose(self.method_combo, plan.method)  # the plan's own method until another is chosen
        if not self._path_edited:
            default = self._default_path()
            self.path_edit.setText(str(default) if default else "")
        self._show_requirement()
        self._show_estimate()  # GPTQ's lattice sweeps follow the plan's types

    @Slot()
    def _on_method_changed(self, *_args: Any) -> None:
        if self.method != "rtn":
            choose(self.backend_combo, "studio")
        self.update_controls()

    def _on_calib_edited(self, *_args: Any) -> None:
        self.update_controls()  # the mix check box needs a text of the user's

    def _on_path_edited(self, _text: str) -> None:
        self._path_edited = True

    def _default_path(self) -> Path | None:
        info = self.state.info
        if info is None:
            return None
        # the last export's folder, else beside the model unless that is hidden (the demo's cache), else
        # ~/Documents/Quant Studio: a file the user can find
        folder = folders.visible_export_folder(self.settings.export_folder, Path(info.path))
        plan = self.chosen_plan()
        suffix = plan if isinstance(plan, str) else (getattr(plan, "name", "") or "custom")
        suffix = re.sub(r"[^A-Za-z0-9_.+-]+", "_", suffix).strip("_") or "custom"
        stem = re.sub(r"[^\w.+-]+", "-", model_display_name(info.path)).strip("-") or "model"
        return folder / f"{stem}-{suffix}.gguf"

    def closeEvent(self, event: Any) -> None:
        # Closing only hides: a running export goes on (it is listed in the Jobs panel).
        event.ignore()
        self.hide()

    def keyPressEvent(self, event: Any) -> None:
        if event.key() == Qt.Key.Key_Escape:
            self.hide()
            return
        super().keyPressEvent(event)
