"""Background jobs: results, errors and progress reach the GUI thread; cancel and shutdown stop workers."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QThread, QThreadPool
from PySide6.QtWidgets import QApplication

from studio.core.errors import ModelOpenError
from studio.qt.jobs import JobManager, JobState


def _wait_finished(qtbot, manager, job, timeout=5000, others_held=False):
    # ended, and (unless the test holds other jobs on purpose) every worker back in the pool: a worker emits
    # "finished" and only then returns from run(), so on a loaded machine the GUI thread can see the end
    # before the pool does (the autouse fixture's leak check then counted that worker as left running)
    pool = QThreadPool.globalInstance()
    qtbot.waitUntil(
        lambda: (
            not job.active and job.ended_at is not None and (others_held or pool.activeThreadCount() == 0)
        ),
        timeout=timeout,
    )


def test_result_and_callbacks_arrive_on_the_gui_thread(qtbot):
    manager = JobManager()
    seen = {}
    gui = QApplication.instance().thread()

    def work(ctx):
        seen["worker"] = QThread.currentThread() is not gui
        return 42

    job = manager.submit(
        "Answer", work, on_success=lambda r: seen.update(result=r, gui=QThread.currentThread() is gui)
    )
    _wait_finished(qtbot, manager, job)
    assert seen == {"worker": True, "result": 42, "gui": True}
    assert job.state is JobState.DONE and job.result == 42
    assert not manager.busy


def test_studio_error_becomes_its_sentence_and_a_bug_one_sentence(qtbot):
    manager = JobManager()
    errors = []

    def bad(ctx):
        raise ModelOpenError("/x is empty; choose a folder with a model.")

    def bug(ctx):
        raise KeyError("layers")

    j1 = manager.submit("Opening x", bad, on_error=errors.append)
    j2 = manager.submit("Opening y", bug, on_error=errors.append)
    _wait_finished(qtbot, manager, j1)
    _wait_finished(qtbot, manager, j2)
    assert (
        errors[0] == "/x is empty; choose a folder with a model."
        or errors[1] == "/x is empty; choose a folder with a model."
    )
    other = next(e for e in errors if "KeyError" in e)
    assert other.startswith("Opening y failed with an unexpected error (KeyError: 'layers')")
    assert "\n" not in other
    assert j1.state is JobState.FAILED and isinstance(j1.exception, ModelOpenError)


def test_progress_is_throttled(qtbot):
    manager = JobManager()
    updates = []
    manager.jobChanged.connect(lambda job: updates.append((job.done, job.total)))

    def busy(ctx):
        for i in range(200_000):
            ctx.report(i + 1, 200_000, "counting")
        return None

    job = manager.submit("Count", busy)
    _wait_finished(qtbot, manager, job)
    # 200k reports in well under a second: throttling lets only a handful through, and the last one always.
    assert len(updates) < 200
    assert (job.done, job.total) == (200_000, 200_000)
    assert job.message == "counting"


def test_cancel_stops_a_running_job_and_shutdown_waits_for_it(qtbot):
    manager = JobManager()
    started = threading.Event()
    cancelled = []

    def loop(ctx):
        started.set()
        while True:
            ctx.check_cancelled()
            time.sleep(0.005)

    job = manager.submit("Loop", loop, on_cancel=lambda: cancelled.append(True))
    assert started.wait(5)
    assert manager.busy
    t0 = time.monotonic()
    assert manager.shutdown(timeout_ms=5000)
    assert time.monotonic() - t0 < 2
    assert QThreadPool.globalInstance().activeThreadCount() == 0
    qtbot.waitUntil(lambda: job.state is JobState.CANCELLED and cancelled == [True], timeout=2000)


def test_a_result_that_arrives_after_cancel_is_discarded(qtbot):
    manager = JobManager()
    started, release = threading.Event(), threading.Event()
    discarded, succeeded = [], []

    def slow(ctx):
        started.set()
        release.wait(5)
        return "resource"  # ignores the cancel, as a core call between two checks would

    job = manager.submit("Slow", slow, on_success=succeeded.append, discard=discarded.append)
    assert started.wait(5)
    job.cancel()
    release.set()
    _wait_finished(qtbot, manager, job)
    assert succeeded == [] and discarded == ["resource"]
    assert job.state is JobState.CANCELLED


def test_no_job_starts_after_shutdown(qtbot):
    manager = JobManager()
    assert manager.shutdown(timeout_ms=1000)
    ran = []
    job = manager.submit("Late", lambda ctx: ran.append(True))
    assert job.state is JobState.CANCELLED and not manager.busy
    assert QThreadPool.globalInstance().activeThreadCount() == 0
    qtbot.wait(50)
    assert ran == []


def test_jobs_wait_for_the_start_up_imports_and_a_cancel_still_stops_a_waiting_one(qtbot):
    # transformers' lazy modules are not thread-safe: a chat load importing them while the start-up job
    # did failed on a fresh install with "cannot import name 'AutoModelForCausalLM'"
    manager = JobManager()
    imported = manager.hold_for_imports()
    ran: list[str] = []
    startup = manager.submit("Imports", lambda ctx: ran.append("startup"), kind="startup")
    _wait_finished(qtbot, manager, startup)
    job = manager.submit("Load", lambda ctx: ran.append("load"))
    waiting = manager.submit("Other", lambda ctx: ran.append("other"))
    time.sleep(0.4)
    assert ran == ["startup"] and job.active and waiting.active  # held until the imports are done
    waiting.cancel()
    _wait_finished(qtbot, manager, waiting, others_held=True)  # "Load" still waits at the gate
    assert waiting.state == JobState.CANCELLED
    imported.set()
    _wait_finished(qtbot, manager, job)
    assert ran == ["startup", "load"] and job.state == JobState.DONE
    later = manager.submit("Later", lambda ctx: ran.append("later"))  # the gate is open from now on
    _wait_finished(qtbot, manager, later)
    assert ran[-1] == "later"
