"""Keeps the state's per-preset estimates current as the model, the hardware or the context length change.

The estimate runs as a job: for a GGUF original it applies llama.cpp's per-tensor rules to every tensor of
the file (half a second for the 1.5B bench model), which must not stall the Summary tab. Only the newest
job's result reaches the state (``PanelJob``), so a quick run of context-length changes ends on the last.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Slot

from studio.qt.jobs import JobManager
from studio.qt.panel_job import PanelJob
from studio.qt.services import Services
from studio.qt.state import StudioState

log = logging.getLogger(__name__)


class PresetEstimates(QObject):
    """Recomputes ``state.estimates`` (size, memory and fit per preset) in a job whenever an input changes."""

    def __init__(
        self,
        state: StudioState,
        services: Services,
        jobs: JobManager,
        show_status: Callable[[str, int], None],
        parent: QObject,
    ) -> None:
        super().__init__(parent)
        self.state, self.services, self._show_status = state, services, show_status
        self.task = PanelJob(jobs, "estimate", self, on_done=self._done, on_error=self._failed)
        self._pending = False
        for sig in (state.modelClosed, state.hardwareChanged, state.contextLengthChanged):
            sig.connect(self.recompute)
        state.modelOpened.connect(self._after_open)

    @property
    def running(self) -> bool:
        """Whether an estimate is queued or running."""
        return self._pending or self.task.running

    @Slot()
    def _after_open(self, *_args: object) -> None:
        # started once every panel has shown the new model: started at once, its worker took the GIL from
        # the panels' handlers, each of whose calls into Qt waits for it again (a 32-layer model's open
        # stalled the window 127 ms)
        self._pending = True
        QTimer.singleShot(0, self._start_pending)

    @Slot()
    def _start_pending(self) -> None:
        if self._pending:
            self._pending = False
            self.recompute()

    @Slot()
    def recompute(self, *_args: object) -> None:
        """Estimate every preset for the open model on the detected hardware (nothing without both)."""
        info, hw, ctx_len = self.state.info, self.state.hardware, self.state.context_length
        if info is None or hw is None:
            self.task.cancel(quiet=True)
            if self.state.estimates:
                self.state.set_estimates(())
            return
        estimate = self.services.estimate_presets

        def work(ctx: Any) -> tuple[Any, ...]:
            ctx.report(0, 1, "Estimating the presets' sizes")
            return tuple(estimate(info, hw, ctx_len))

        self.task.start(f"Estimate the presets of {self.state.model_name or 'the model'}", work)

    def _done(self, estimates: tuple[Any, ...]) -> None:
        self.state.set_estimates(estimates)

    def _failed(self, message: str) -> None:  # the job turned the error into one sentence (and logged a bug)
        self._show_status(message, 10000)
        self.state.set_estimates(())
