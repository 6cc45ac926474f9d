"""call_in_child: result, progress and events come back; errors keep their sentence; cancel and a dead child end cleanly."""

from __future__ import annotations

import os
import time

import pytest

from studio.core.childjob import call_in_child
from studio.core.errors import ChildProcessError_, StudioError
from studio.core.jobs import JobCancelled, JobContext


def _work(ctx, emit, n, fail=""):
    for i in range(n):
        ctx.report(i + 1, n, f"step {i + 1}")
        emit(("step", i + 1))
    if fail == "studio":
        raise StudioError("The text is too short.")
    if fail == "exit":
        os._exit(3)
    return {"pid": os.getpid(), "n": n}


def _forever(ctx, emit):
    emit("started")
    while True:
        ctx.check_cancelled()
        time.sleep(0.01)


def test_result_progress_and_events_cross_the_process():
    progress, events = [], []
    ctx = JobContext(on_progress=lambda d, t, m: progress.append((d, t, m)))
    out = call_in_child(_work, {"n": 3}, what="Test", ctx=ctx, on_event=events.append)
    assert out["n"] == 3 and out["pid"] != os.getpid()
    assert events == [("step", 1), ("step", 2), ("step", 3)]
    assert progress and progress[-1][:2] == (3, 3)


def test_a_studio_error_keeps_its_sentence_and_a_dead_child_becomes_one():
    with pytest.raises(StudioError, match="The text is too short."):
        call_in_child(_work, {"n": 1, "fail": "studio"}, what="Test")
    with pytest.raises(ChildProcessError_, match="The Test process stopped unexpectedly"):
        call_in_child(_work, {"n": 1, "fail": "exit"}, what="Test")


def test_cancel_reaches_the_child():
    ctx = JobContext()
    with pytest.raises(JobCancelled):
        call_in_child(_forever, {}, what="Test", ctx=ctx, on_event=lambda _e: ctx.cancel())
