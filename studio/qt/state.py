"""The one shared state of the window: what is open, selected and planned, announced by typed signals.

Panels read from it and call its setters; they never import each other. Each signal carries one kind
of value (named in its comment; the classes are not imported here, so the window opens fast).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

if TYPE_CHECKING:
    from studio.core.calib.collect import ActivationStats
    from studio.core.calib.imatrix import Imatrix
    from studio.core.evaluate import EvalReport
    from studio.core.export.job import ExportOutcome

DEFAULT_CONTEXT_LENGTH = 4096


@dataclass(frozen=True)
class CalibrationRun:
    """What the Calibrate page's last run used (the budget dialog reuses its imatrix for the same text)."""

    text: str  # "builtin" or the text file's path
    n_ctx: int
    n_chunks: int | None  # None: every whole chunk
    imatrix: Any  # the Imatrix that run made


class StudioState(QObject):
    """Current model, hardware, selection, plan and results of the studio window."""

    modelOpened = Signal(object)  # Checkpoint (its .info is a ModelInfo)
    modelClosed = Signal()
    tensorSelected = Signal(str)  # tensor name; "" when the selection was cleared
    planChanged = Signal(object)  # the current plan (studio.core.quant plan object)
    exported = Signal(object)  # ExportOutcome: a GGUF file was written from the open model (and verified)
    evaluated = Signal(object)  # EvalReport: variants were scored against their original
    hardwareChanged = Signal(object)  # HardwareInfo
    estimatesChanged = Signal(object)  # tuple[Estimate, ...] for the open model, hardware and context length
    contextLengthChanged = Signal(int)
    themeChanged = Signal(bool)  # True when the palette is dark
    activationsChanged = Signal(object)  # ActivationStats of the open model (a Calibrate run), or None
    imatrixChanged = Signal(object)  # Imatrix for the open model (computed or loaded), or None

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._checkpoint: Any = None
        self._model_name = ""
        self._hardware: Any = None
        self._estimates: tuple[Any, ...] = ()
        self._selected = ""
        self._plan: Any = None
        self._checked: tuple[Any, Any] | None = None  # (plan, LastWordCheck) the budget dialog handed out
        self._ctx_len = DEFAULT_CONTEXT_LENGTH
        self._dark = False
        self._activations: ActivationStats | None = None
        self._imatrix: Imatrix | None = None
        self.calibration: CalibrationRun | None = None  # set by the Calibrate page with its statistics
        self.last_folder = ""  # where the next file dialog opens (studio.qt.folders); kept in the settings
        self.cluster: str | None = None  # the Ray cluster the window's device choice names (--cluster)

    # -- model ------------------------------------------------------------------------------------

    @property
    def checkpoint(self) -> Any:
        """The open ``Checkpoint``, or None."""
        return self._checkpoint

    @property
    def info(self) -> Any:
        """The open model's ``ModelInfo``, or None."""
        return None if self._checkpoint is None else self._checkpoint.info

    @property
    def model_name(self) -> str:
        """A short name for the open model (folder, file or repo id), or "" when none is open."""
        return self._model_name

    def set_checkpoint(self, checkpoint: Any, name: str = "") -> None:
        """Make ``checkpoint`` the open model (shown as ``name``), closing the previous one."""
        old = self._checkpoint
        self._checkpoint = None
        self._model_name = ""
        self._selected = ""
        self._estimates = ()
        # calibration results belong to the model they were made for
        self.set_activation_stats(None)
        self.set_imatrix(None)
        self.calibration = None
        self._checked = None  # a budget plan's check belongs to the model it was scanned on
        if old is not None:
            _close_quietly(old)
            self.modelClosed.emit()
        if checkpoint is not None:
            self._checkpoint = checkpoint
            self._model_name = name or Path(checkpoint.info.path).name
            self.modelOpened.emit(checkpoint)

    def close_model(self) -> None:
        """Close the open model, if any."""
        self.set_checkpoint(None)

    # -- selection, plan, results ------------------------------------------------------------------

    @property
    def selected_tensor(self) -> str:
        """Name of the selected tensor, or ""."""
        return self._selected

    def select_tensor(self, name: str) -> None:
        """Select a tensor by name (announced only when it changes)."""
        if name != self._selected:
            self._selected = name
            self.tensorSelected.emit(name)

    @property
    def plan(self) -> Any:
        """The current precision plan, or None."""
        return self._plan

    def set_plan(self, plan: Any, check: Any = None) -> None:
        """Replace the current plan; ``check`` (a budget plan's ``LastWordCheck``) stays with that very plan
        object: its export waits for llama.cpp's verdict until another plan (an edit) replaces it."""
        if check is not None:
            self._checked = (plan, check)
        self._plan = plan
        self.planChanged.emit(plan)

    @property
    def plan_check(self) -> Any:
        """The ``LastWordCheck`` of the current plan when the budget dialog made it and it is unedited, else
        None (a preset or a hand-made plan: no prediction to hold the file to)."""
        c = self._checked
        return c[1] if c is not None and self._plan is not None and c[0] is self._plan else None

    def publish_export(self, outcome: ExportOutcome) -> None:
        """Announce a finished export (the chat and evaluation pages add the new file)."""
        self.exported.emit(outcome)

    def publish_evaluation(self, report: EvalReport) -> None:
        """Announce a finished evaluation."""
        self.evaluated.emit(report)

    # -- calibration -------------------------------------------------------------------------------

    @property
    def activation_stats(self) -> ActivationStats | None:
        """What the last Calibrate run of the open model saw, or None."""
        return self._activations

    def set_activation_stats(self, stats: ActivationStats | None) -> None:
        """Share a calibration run's statistics (the inspector, views and overview draw them)."""
        if stats is not self._activations:
            self._activations = stats
            if stats is None:
                self.calibration = None
            self.activationsChanged.emit(stats)

    @property
    def imatrix(self) -> Imatrix | None:
        """The importance matrix preview and export use for the open model, or None."""
        return self._imatrix

    def set_imatrix(self, imatrix: Imatrix | None) -> None:
        """Use ``imatrix`` (already checked against the open model) from now on; None: none."""
        if imatrix is not self._imatrix:
            self._imatrix = imatrix
            self.imatrixChanged.emit(imatrix)

    # -- machine and estimates ---------------------------------------------------------------------

    @property
    def hardware(self) -> Any:
        """The detected ``HardwareInfo``, or None until detection finished."""
        return self._hardware

    def set_hardware(self, hardware: Any) -> None:
        """Record the detected hardware."""
        self._hardware = hardware
        self.hardwareChanged.emit(hardware)

    @property
    def context_length(self) -> int:
        """Context length the memory estimates are made for."""
        return self._ctx_len

    def set_context_length(self, n: int) -> None:
        """Change the context length of the estimates."""
        if n != self._ctx_len:
            self._ctx_len = int(n)
            self.contextLengthChanged.emit(self._ctx_len)

    @property
    def estimates(self) -> tuple[Any, ...]:
        """Estimates for the open model on this machine, or () when not known."""
        return self._estimates

    def set_estimates(self, estimates: tuple[Any, ...]) -> None:
        """Record new estimates."""
        self._estimates = tuple(estimates)
        self.estimatesChanged.emit(self._estimates)

    # -- theme ------------------------------------------------------------------------------------

    @property
    def dark(self) -> bool:
        """Whether the window currently uses a dark palette."""
        return self._dark

    def set_dark(self, dark: bool) -> None:
        """Record the palette's darkness (plots follow it)."""
        if dark != self._dark:
            self._dark = dark
            self.themeChanged.emit(dark)


def _close_quietly(checkpoint: Any) -> None:
    close = getattr(checkpoint, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:  # closing a file must never break switching models
        logging.getLogger(__name__).exception("closing %r failed", checkpoint)
