"""PanelJob: a panel's newest job only; a superseded job's end is dropped, cancel reaches on_cancel."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtWidgets import QWidget

from studio.qt.jobs import JobManager, JobState
from studio.qt.panel_job import JobPanel, PanelJob
from studio.qt.state import StudioState


class Recorder:
    """Collects what a PanelJob delivers."""

    def __init__(self) -> None:
        self.done: list[object] = []
        self.errors: list[str] = []
        self.cancelled = 0
        self.progress: list[tuple[int, int, str]] = []
        self.running_in_callback: list[bool] = []

    def task(self, jobs: JobManager, **kw) -> PanelJob:
        t = PanelJob(
            jobs,
            "test",
            on_done=self._done,
            on_error=self.errors.append,
            on_cancel=self._cancel,
            on_progress=lambda job: self.progress.append((job.done, job.total, job.message)),
            **kw,
        )
        self._t = t
        return t

    def _done(self, result: object) -> None:
        self.running_in_callback.append(self._t.running)
        self.done.append(result)

    def _cancel(self) -> None:
        self.cancelled += 1


def _waiting(gate: threading.Event, result: object, started: threading.Event | None = None):
    def work(ctx):
        if started is not None:
            started.set()
        while not gate.wait(0.01):
            ctx.check_cancelled()
        ctx.report(1, 2, "half")
        return result

    return work


@pytest.fixture
def jobs():
    manager = JobManager()
    yield manager
    manager.shutdown(5000)


def test_start_cancels_the_previous_job_and_drops_its_end(qtbot, jobs):
    rec = Recorder()
    task = rec.task(jobs)
    gate = threading.Event()
    started = threading.Event()
    first = task.start("first", _waiting(gate, "old", started))
    assert started.wait(5)
    second = task.start("second", _waiting(gate, "new"))
    assert task.job is second and task.running and task.started == 2
    gate.set()
    qtbot.waitUntil(lambda: not first.active and not second.active, timeout=5000)
    assert first.state is JobState.CANCELLED and second.state is JobState.DONE
    # Only the newest job's end reached the panel; the superseded one's cancel did not.
    assert rec.done == ["new"] and rec.cancelled == 0 and rec.errors == []
    assert rec.running_in_callback == [False]  # "running" is already over when on_done runs


def test_cancel_reaches_on_cancel_and_quiet_cancel_does_not(qtbot, jobs):
    rec = Recorder()
    task = rec.task(jobs)
    gate = threading.Event()
    job = task.start("stopped", _waiting(gate, "never"))
    task.cancel()
    qtbot.waitUntil(lambda: not job.active, timeout=5000)
    assert rec.cancelled == 1 and rec.done == []
    job = task.start("forgotten", _waiting(gate, "never"))
    task.cancel(quiet=True)
    assert not task.running and task.job is None
    qtbot.waitUntil(lambda: not job.active, timeout=5000)
    assert rec.cancelled == 1 and rec.done == []


def test_errors_and_progress_of_the_newest_job(qtbot, jobs):
    rec = Recorder()
    task = rec.task(jobs)

    def bad(ctx):
        ctx.report(3, 4, "almost")
        raise ValueError("no room")

    job = task.start("bad", bad)
    qtbot.waitUntil(lambda: not job.active, timeout=5000)
    assert len(rec.errors) == 1 and "no room" in rec.errors[0]
    assert (3, 4, "almost") in rec.progress


def test_keep_partial_delivers_a_stopped_jobs_result_before_on_cancel(qtbot, jobs):
    order: list[str] = []
    task = PanelJob(
        jobs,
        "chat",
        on_done=lambda r: order.append(f"done {r}"),
        on_cancel=lambda: order.append("cancel"),
        keep_partial=True,
    )
    started = threading.Event()

    def work(ctx):
        started.set()
        while not ctx.cancelled:
            threading.Event().wait(0.01)
        return "partial"  # a stopped turn still returns what it has

    job = task.start("turn", work)
    assert started.wait(5)
    task.cancel()
    qtbot.waitUntil(lambda: not job.active, timeout=5000)
    assert order == ["done partial", "cancel"]


class _Panel(JobPanel, QWidget):
    def __init__(self, jobs: JobManager) -> None:
        super().__init__()
        self.results: list[object] = []
        self.init_task(StudioState(), jobs, "statistics")

    def on_done(self, result: object) -> None:
        self.results.append(result)


def test_a_panel_overrides_the_hooks_and_counts_its_jobs(qtbot, jobs):
    panel = _Panel(jobs)
    qtbot.addWidget(panel)
    job = panel.task.start("stats", lambda ctx: 42)
    assert panel.running or not job.active
    qtbot.waitUntil(lambda: panel.results == [42], timeout=5000)
    assert not panel.running and panel.task.started == 1 and job.kind == "statistics"
