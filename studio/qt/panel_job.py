"""A panel's background work, one job at a time, over the window's ``JobManager``.

After Orange's ``ConcurrentWidgetMixin``: ``PanelJob.start`` cancels the job still running and submits
the new one, and only the newest job's end reaches the panel, as ``on_done(result)``,
``on_error(message)`` or ``on_cancel()``. A superseded job's end is dropped, so no panel compares
keys or generations to spot a stale result. ``running`` is the one meaning of "this panel's job is
queued or running".

A panel with one kind of work mixes in ``JobPanel`` and overrides the three hooks; a panel with
several (the Hub: search, details, download) holds one ``PanelJob`` per kind with its own callbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Slot

from studio.core.jobs import JobContext
from studio.qt.jobs import Job, JobManager
from studio.qt.panels import show_job_progress
from studio.qt.state import StudioState
from studio.qt.theme import set_status

__all__ = ["JobPanel", "PanelJob"]


class PanelJob(QObject):
    """The newest job of one kind of a panel's work; see the module docstring."""

    def __init__(
        self,
        jobs: JobManager,
        kind: str,
        parent: QObject | None = None,
        *,
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
        on_progress: Callable[[Job], None] | None = None,
        keep_partial: bool = False,
    ) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.kind = kind
        self._on_done, self._on_error, self._on_cancel = on_done, on_error, on_cancel
        self._on_progress = on_progress
        self._keep_partial = keep_partial  # a cancelled job's late result still goes to on_done (chat)
        self._job: Job | None = None
        self.started = 0  # jobs submitted so far
        if on_progress is not None:
            # jobChanged is emitted on the GUI thread; the connection ends with this object.
            jobs.jobChanged.connect(self._changed)

    @property
    def job(self) -> Job | None:
        """The newest job (finished or not), or None before the first start."""
        return self._job

    @property
    def running(self) -> bool:
        """Whether the newest job is queued or running."""
        return self._job is not None and self._job.active

    def start(self, title: str, fn: Callable[[JobContext], Any], *, confirm_on_quit: bool = False) -> Job:
        """Cancel the running job (its end is dropped) and run ``fn(ctx)`` in the background."""
        self.cancel(quiet=True)
        job: Job | None = None

        def mine(callback: Callable[..., None] | None) -> Callable[..., None]:
            return lambda *args: callback(*args) if callback is not None and job is self._job else None

        job = self.jobs.submit(
            title,
            fn,
            kind=self.kind,
            on_success=mine(self._on_done),
            on_error=mine(self._on_error),
            on_cancel=mine(self._on_cancel),
            discard=mine(self._on_done) if self._keep_partial else None,
            confirm_on_quit=confirm_on_quit,
        )
        self._job = job
        self.started += 1
        return job

    def cancel(self, *, quiet: bool = False) -> None:
        """Ask the running job to stop; its end arrives as ``on_cancel``, or (``quiet``) is dropped."""
        job = self._job
        if job is None or not job.active:
            return
        if quiet:
            self._job = None
        job.cancel()

    @Slot(object)
    def _changed(self, job: Job) -> None:
        if job is self._job and job.active and self._on_progress is not None:
            self._on_progress(job)


class JobPanel:
    """Mix-in for a panel with one kind of background work: ``self.task`` runs it; override the hooks.

    The default ``on_error`` shows the sentence in the panel's ``status`` label and emits its
    ``errorShown`` signal; ``on_error`` and ``on_cancel`` then call ``update_controls``, and ``on_cancel``
    shows the panel's ``cancelled_text``. The default ``on_progress`` shows the job's progress in the
    panel's ``progress`` bar, and ``cancel`` stops the job.
    """

    state: StudioState
    jobs: JobManager
    task: PanelJob
    cancelled_text = ""  # what the status line says after a cancel ("" leaves it as it is)

    def init_task(
        self,
        state: StudioState,
        jobs: JobManager,
        kind: str,
        *,
        progress: bool = False,
        keep_partial: bool = False,
    ) -> None:
        """Keep ``state`` and ``jobs`` and create ``self.task``; with ``progress``, ``on_progress`` follows the job."""
        assert isinstance(self, QObject)
        self.state, self.jobs = state, jobs
        self.task = PanelJob(
            jobs,
            kind,
            self,
            on_done=self.on_done,
            on_error=self.on_error,
            on_cancel=self.on_cancel,
            on_progress=self.on_progress if progress else None,
            keep_partial=keep_partial,
        )

    @property
    def running(self) -> bool:
        """Whether this panel's job is queued or running."""
        return self.task.running

    def on_done(self, result: Any) -> None:
        """The newest job's result (GUI thread)."""

    def on_error(self, message: str) -> None:
        """The newest job failed; ``message`` is one sentence (GUI thread)."""
        self.update_controls()
        self.show_error(message)

    def on_cancel(self) -> None:
        """The newest job was cancelled (GUI thread): ``cancelled_text``, if any, goes to the status line."""
        self.update_controls()
        if self.cancelled_text:
            self.status.setText(self.cancelled_text)  # type: ignore[attr-defined]

    def on_progress(self, job: Job) -> None:
        """The running job reported progress (``job.done``, ``job.total``, ``job.message``): shown in ``progress``."""
        show_job_progress(self.progress, job)  # type: ignore[attr-defined]

    @Slot()
    def cancel(self) -> None:
        """Ask this panel's job to stop at its next check; its end arrives as ``on_cancel``."""
        self.task.cancel()

    def update_controls(self) -> None:
        """Enable the panel's buttons for whether its job runs."""

    def show_error(self, message: str) -> None:
        """Show ``message`` in the status line in the theme's error colour, and announce it."""
        set_status(self.status, message, error=True)  # type: ignore[attr-defined]
        self.errorShown.emit(message)  # type: ignore[attr-defined]
