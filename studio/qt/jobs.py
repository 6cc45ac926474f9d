"""Background jobs for the GUI: a Qt ``JobContext``, ``QRunnable`` workers and a manager that owns them.

Work runs on a ``QThreadPool``; results, progress and errors come back to the GUI thread through
queued signals whose receiver is the ``JobManager`` (a ``QObject`` living on the GUI thread), so no
callback ever runs on a worker thread and no worker touches a widget.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

from studio.core.errors import StudioError, unexpected_error_sentence
from studio.core.jobs import JobCancelled, JobContext

log = logging.getLogger(__name__)

_HISTORY_LIMIT = 200


class JobState(str, Enum):
    """Where a job is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobSignals(QObject):
    """Signals a worker emits; they carry the job so one GUI-thread slot can serve every job."""

    started = Signal(object)
    progress = Signal(object, object, object, str)  # job, done, total, message (objects: may exceed 2**31)
    log = Signal(object, str)
    succeeded = Signal(object, object)  # job, result
    failed = Signal(object, str)  # job, one-sentence message
    cancelled = Signal(object)
    finished = Signal(object)  # always the last signal of a job


class QtJobContext(JobContext):
    """A ``JobContext`` whose progress and log lines become (throttled) Qt signals."""

    def __init__(self, job: Job, signals: JobSignals, min_interval: float = 0.05) -> None:
        super().__init__(
            on_progress=lambda done, total, msg: signals.progress.emit(job, done, total, msg),
            on_log=lambda msg: signals.log.emit(job, msg),
            min_interval=min_interval,
        )


class Job(QRunnable):
    """One piece of background work: ``fn(ctx)`` runs on a pool thread and its result comes back by signal.

    ``discard`` is called (on the GUI thread) with a result that arrives after the job was cancelled,
    so resources such as an opened checkpoint are released rather than leaked.
    """

    _ids = itertools.count(1)

    def __init__(
        self,
        title: str,
        fn: Callable[[JobContext], Any],
        *,
        kind: str = "job",
        confirm_on_quit: bool = False,
        discard: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__()
        # The manager keeps the Python object alive until the job has finished; Qt must not delete it.
        self.setAutoDelete(False)
        self.id = next(Job._ids)
        self.title = title
        self.kind = kind
        self.confirm_on_quit = confirm_on_quit
        self.discard = discard
        self.signals = JobSignals()
        self.context = QtJobContext(self, self.signals)
        self.state = JobState.QUEUED
        self.done = 0
        self.total = 0
        self.message = ""
        self.error: str | None = None
        self.exception: BaseException | None = None  # what the worker raised, for callers that need the type
        self.result: Any = None
        self.log_lines: list[str] = []
        self.created_at = time.monotonic()
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._fn = fn
        self.on_success: Callable[[Any], None] | None = None
        self.on_error: Callable[[str], None] | None = None
        self.on_cancel: Callable[[], None] | None = None
        self.gate: threading.Event | None = None  # set by the manager: wait for it before running

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.title!r} {self.state.value}>"

    @property
    def active(self) -> bool:
        """Whether the job is queued or running."""
        return self.state in (JobState.QUEUED, JobState.RUNNING)

    @property
    def fraction(self) -> float | None:
        """Share of the work done, or None while the total is unknown."""
        return self.done / self.total if self.total > 0 else None

    def eta_seconds(self) -> float | None:
        """Seconds left at the average speed so far, or None when it cannot be told yet."""
        frac = self.fraction
        if not frac or self.started_at is None or not self.active:
            return None
        elapsed = time.monotonic() - self.started_at
        return elapsed * (1.0 - frac) / frac

    def cancel(self) -> None:
        """Ask the job to stop at its next ``check_cancelled``."""
        self.context.cancel()

    def run(self) -> None:  # worker thread
        sig = self.signals
        sig.started.emit(self)
        try:
            # the start-up job's imports of torch and transformers run first: their lazy modules are not
            # thread-safe, and a job importing them at the same moment got "cannot import name"
            while self.gate is not None and not self.gate.wait(0.1):
                self.context.check_cancelled()
            self.context.check_cancelled()
            result = self._fn(self.context)
        except JobCancelled:
            sig.cancelled.emit(self)
        except StudioError as err:
            self.exception = err
            log.info("%s failed: %s", self.title, err)
            sig.failed.emit(self, str(err))
        except Exception as err:  # a bug or an environment problem: log it whole, show one sentence
            self.exception = err
            log.exception("%s failed with an unexpected error", self.title)
            sig.failed.emit(self, unexpected_error_sentence(self.title, err))
        else:
            sig.succeeded.emit(self, result)
        finally:
            sig.finished.emit(self)


class JobManager(QObject):
    """Starts jobs on a thread pool, tracks them, and cancels and waits for them on quit."""

    jobAdded = Signal(object)
    jobChanged = Signal(object)
    jobFinished = Signal(object)
    busyChanged = Signal(bool)

    def __init__(self, pool: QThreadPool | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = pool or QThreadPool.globalInstance()
        self._active: dict[int, Job] = {}
        self._history: list[Job] = []
        self._closed = False
        self._imports_done = threading.Event()
        self._imports_done.set()

    # -- starting ---------------------------------------------------------------------------------

    def submit(
        self,
        title: str,
        fn: Callable[[JobContext], Any],
        *,
        kind: str = "job",
        on_success: Callable[[Any], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
        confirm_on_quit: bool = False,
        discard: Callable[[Any], None] | None = None,
    ) -> Job:
        """Run ``fn(ctx)`` in the background; the callbacks run later on the GUI thread."""
        job = Job(title, fn, kind=kind, confirm_on_quit=confirm_on_quit, discard=discard)
        job.on_success, job.on_error, job.on_cancel = on_success, on_error, on_cancel
        return self.start(job)

    def hold_for_imports(self) -> threading.Event:
        """Jobs started from now on wait until the returned event is set (by the start-up job, once its
        heavy imports are done); the start-up job itself (kind "startup") does not wait."""
        self._imports_done.clear()
        return self._imports_done

    def start(self, job: Job) -> Job:
        """Start a prepared job; after ``shutdown`` it is cancelled at once instead of run."""
        if self._closed:
            # A late timer or click after quitting must not start a thread nobody will wait for.
            job.context.cancel()
            job.state = JobState.CANCELLED
            return job
        if job.kind != "startup" and not self._imports_done.is_set():
            job.gate = self._imports_done
        sig = job.signals
        sig.started.connect(self._on_started)
        sig.progress.connect(self._on_progress)
        sig.log.connect(self._on_log)
        sig.succeeded.connect(self._on_succeeded)
        sig.failed.connect(self._on_failed)
        sig.cancelled.connect(self._on_cancelled)
        sig.finished.connect(self._on_finished)
        was_busy = self.busy
        self._active[job.id] = job
        self._history.append(job)
        del self._history[:-_HISTORY_LIMIT]
        self.jobAdded.emit(job)
        if not was_busy:
            self.busyChanged.emit(True)
        self._pool.start(job)
        return job

    # -- queries ----------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether any job is queued or running."""
        return bool(self._active)

    def active_jobs(self, kind: str | None = None) -> list[Job]:
        """Jobs not finished yet, oldest first, optionally only of one kind."""
        return [j for j in self._active.values() if kind is None or j.kind == kind]

    def history(self) -> list[Job]:
        """Recent jobs, finished or not, oldest first."""
        return list(self._history)

    # -- stopping ---------------------------------------------------------------------------------

    def cancel_all(self) -> None:
        """Ask every active job to stop."""
        for job in list(self._active.values()):
            job.cancel()

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """Cancel everything, refuse new jobs, and wait up to ``timeout_ms`` for the workers; True when all stopped."""
        self._closed = True
        self.cancel_all()
        # Queued jobs that never started are taken off the pool so waitForDone does not run them.
        for job in list(self._active.values()):
            if job.state is JobState.QUEUED and self._pool.tryTake(job):
                self._active.pop(job.id, None)
                job.state = JobState.CANCELLED
        ok = self._pool.waitForDone(timeout_ms)
        if not ok:
            log.warning("jobs still running after %d ms: %s", timeout_ms, list(self._active.values()))
        return ok

    # -- slots (GUI thread) -------------------------------------------------------------------------

    @Slot(object)
    def _on_started(self, job: Job) -> None:
        if job.state is JobState.QUEUED:
            job.state = JobState.RUNNING
            job.started_at = time.monotonic()
            self.jobChanged.emit(job)

    @Slot(object, object, object, str)
    def _on_progress(self, job: Job, done: int, total: int, msg: str) -> None:
        job.done, job.total = int(done), int(total)
        if msg:
            job.message = msg
        self.jobChanged.emit(job)

    @Slot(object, str)
    def _on_log(self, job: Job, line: str) -> None:
        job.log_lines.append(line)
        self.jobChanged.emit(job)

    @Slot(object, object)
    def _on_succeeded(self, job: Job, result: Any) -> None:
        if job.context.cancelled:
            # Finished anyway after a cancel: nobody wants the result any more.
            self._settle(job, JobState.CANCELLED)
            self._discard(job, result)
            self._call(job, job.on_cancel)
            return
        job.result = result
        self._settle(job, JobState.DONE)
        self._call(job, job.on_success, result)

    @Slot(object, str)
    def _on_failed(self, job: Job, message: str) -> None:
        job.error = message
        job.log_lines.append(message)
        self._settle(job, JobState.FAILED)
        if job.context.cancelled:
            self._call(job, job.on_cancel)
        else:
            self._call(job, job.on_error, message)

    @Slot(object)
    def _on_cancelled(self, job: Job) -> None:
        self._settle(job, JobState.CANCELLED)
        self._call(job, job.on_cancel)

    @Slot(object)
    def _on_finished(self, job: Job) -> None:
        job.ended_at = time.monotonic()
        self._active.pop(job.id, None)
        self.jobChanged.emit(job)
        self.jobFinished.emit(job)
        if not self._active:
            self.busyChanged.emit(False)

    def _settle(self, job: Job, state: JobState) -> None:
        # The job no longer counts as active before its callback runs, so the callback may start another
        # job of the same kind (retry, open the next model).
        job.state = state
        self._active.pop(job.id, None)

    def _discard(self, job: Job, result: Any) -> None:
        if job.discard is not None:
            try:
                job.discard(result)
            except Exception:
                log.exception("discarding the result of %s failed", job.title)

    def _call(self, job: Job, callback: Callable[..., None] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            # A failing GUI callback must not take the event loop down; it is a bug, so log it whole.
            log.exception("handling the end of %s failed", job.title)
