"""FAULTS 48 and 52 for the panels: jobs stop on shutdown; arrays crossing threads are snapshots."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from PySide6.QtCore import QThread

from studio.core.model import open_model
from studio.qt.jobs import JobManager, JobState
from studio.qt.panels import make_array_feed
from studio.qt.panels.inspector import InspectorPanel
from studio.qt.panels.jobs_panel import JobsPanel
from studio.qt.state import StudioState


@pytest.mark.qt_log_level_fail("WARNING")
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_emitted_arrays_are_snapshots_under_1khz_mutation(qtbot):
    """FAULTS 52: a worker mutating its buffer while emitting at ~1 kHz never tears what is plotted."""
    state = StudioState()
    panel = InspectorPanel(state, JobManager())
    qtbot.addWidget(panel)
    feed = make_array_feed()
    edges = np.linspace(-1.0, 1.0, 4097)
    drawn: list[np.ndarray] = []

    def draw(arr: np.ndarray) -> None:
        panel.hist_item.setData(edges, arr, stepMode="center")
        drawn.append(panel.hist_item.yData)

    feed.arrays.connect(draw)
    stop = threading.Event()

    class Producer(QThread):
        def run(self) -> None:
            buf = np.zeros(4096)
            k = 0
            while not stop.is_set():
                k += 1
                for i in range(0, buf.size, 512):  # written piecewise, like a real worker filling a buffer
                    buf[i : i + 512] = k
                feed.publish(buf)
                time.sleep(0.001)

    producer = Producer()
    producer.start()
    qtbot.waitUntil(lambda: len(drawn) >= 300, timeout=20_000)
    stop.set()
    assert producer.wait(5000)
    qtbot.wait(50)
    for arr in drawn:
        assert arr.min() == arr.max(), "a torn frame reached the plot"
        assert not arr.flags.writeable
    assert len({float(a[0]) for a in drawn}) > 1


@pytest.mark.qt_log_level_fail("WARNING")  # FAULTS 51: no "Cannot create children" / timer warnings
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_shutdown_cancels_a_running_panel_job(qtbot, tiny_models, monkeypatch):
    """FAULTS 48: closing while statistics run cancels cooperatively and leaves no worker behind."""
    state = StudioState()
    jobs = JobManager()
    started = threading.Event()

    def slow_stats(ckpt, name, *, cache=None, bins=256, ctx=None):
        started.set()
        while True:
            ctx.check_cancelled()
            time.sleep(0.01)

    monkeypatch.setattr("studio.qt.panels.inspector.tensor_stats", slow_stats)
    panel = InspectorPanel(state, jobs)
    jobs_panel = JobsPanel(state, jobs)
    qtbot.addWidget(panel)
    qtbot.addWidget(jobs_panel)
    ckpt = open_model(tiny_models("llama"))
    try:
        state.set_checkpoint(ckpt)
        state.select_tensor("model.embed_tokens.weight")
        assert started.wait(5)
        job = jobs.active_jobs()[0]
        qtbot.waitUntil(lambda: jobs_panel.row_of(job).text(1) == "running", timeout=2000)
        t0 = time.monotonic()
        assert jobs.shutdown(5000)
        assert time.monotonic() - t0 < 2.0
        qtbot.waitUntil(lambda: job.state is JobState.CANCELLED, timeout=2000)
        assert jobs_panel.row_of(job).text(1) == "cancelled"
        assert not jobs_panel.cancel_button(job).isEnabled()
    finally:
        ckpt.close()
