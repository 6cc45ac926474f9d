"""Jobs panel (progress, ETA, cancel, log) and device selector (CUDA devices, MPS, CPU)."""

from __future__ import annotations

import threading

from PySide6.QtCore import QSettings, Qt

from studio.core.hardware import Backend, GpuInfo, HardwareInfo
from studio.qt.jobs import JobManager, JobState
from studio.qt.panels.device_selector import DeviceSelector
from studio.qt.panels.jobs_panel import JobsPanel, format_eta
from studio.qt.settings import AppSettings
from studio.qt.state import StudioState


def test_progress_log_and_cancel(qtbot):
    state = StudioState()
    jobs = JobManager()
    panel = JobsPanel(state, jobs)
    qtbot.addWidget(panel)
    panel.show()
    halfway = threading.Event()

    def work(ctx):
        ctx.log("loading tensors")
        ctx.report(50, 100, "half")
        halfway.set()
        while True:
            ctx.check_cancelled()
            threading.Event().wait(0.01)

    job = jobs.submit("Export test", work, kind="export")
    assert halfway.wait(5)
    bar = panel.progress_bar(job)
    qtbot.waitUntil(lambda: bar.value() == 500, timeout=3000)
    assert panel.row_of(job).text(0) == "Export test"
    panel.tree.setCurrentItem(panel.row_of(job))
    qtbot.waitUntil(lambda: "loading tensors" in panel.log_view.toPlainText(), timeout=3000)
    assert panel.row_of(job).text(3) != ""  # an ETA (or "–") is shown while running
    qtbot.mouseClick(panel.cancel_button(job), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: job.state is JobState.CANCELLED, timeout=3000)
    assert panel.row_of(job).text(1) == "cancelled"
    assert not panel.cancel_button(job).isEnabled()
    panel.clear_finished()
    assert panel.tree.topLevelItemCount() == 0


def test_failed_job_shows_its_sentence(qtbot):
    """FAULTS 49: a worker that raises shows up as failed with the message."""
    state = StudioState()
    jobs = JobManager()
    panel = JobsPanel(state, jobs)
    qtbot.addWidget(panel)

    def bad(ctx):
        raise ValueError("no space left")

    job = jobs.submit("Quantize", bad)
    qtbot.waitUntil(
        lambda: job.state is JobState.FAILED and panel.row_of(job).text(1) == "failed", timeout=3000
    )
    assert "no space left" in panel.row_of(job).toolTip(1)


def test_format_eta():
    assert format_eta(None) == "–"
    assert format_eta(65) == "1:05"
    assert format_eta(3723) == "1:02:03"


def _hw(gpus=()):
    return HardwareInfo("Test CPU", 8, 32 * 1024**3, 16 * 1024**3, gpus=tuple(gpus))


def test_device_selector_lists_cuda_mps_and_cpu_and_remembers(qtbot, tmp_path):
    state = StudioState()
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    sel = DeviceSelector(state, JobManager())
    sel.remember_in(AppSettings(settings))
    qtbot.addWidget(sel)
    assert sel.devices() == ["cpu"]
    gib = 1024**3
    gpus = [
        GpuInfo(0, "RTX A", Backend.CUDA, 24 * gib, 20 * gib),
        GpuInfo(1, "RTX B", Backend.CUDA, 12 * gib, 11 * gib),
    ]
    state.set_hardware(_hw(gpus))
    assert sel.devices() == ["cuda:0", "cuda:1", "cpu"]
    assert sel.device == "cuda:0"
    with qtbot.waitSignal(sel.deviceChanged) as sig:
        assert sel.set_device("cuda:1")
    assert sig.args == ["cuda:1"]
    assert "RTX B" in sel.combo.currentText()
    # Remembered across a re-detection and in the settings.
    state.set_hardware(_hw(gpus))
    assert sel.device == "cuda:1"
    assert settings.value("quantize/device") == "cuda:1"
    sel2 = DeviceSelector(state, JobManager())
    sel2.remember_in(AppSettings(settings))
    qtbot.addWidget(sel2)
    assert sel2.device == "cuda:1"
    state.set_hardware(_hw([GpuInfo(0, "Apple GPU", Backend.MPS, 32 * gib, 16 * gib, unified=True)]))
    assert sel.devices() == ["mps", "cpu"]
    assert not sel.set_device("cuda:0")


def test_the_panel_keeps_the_newest_ended_jobs_and_every_running_one(qtbot):
    # every budget edit and tensor click is a job: rows with widgets would pile up and slow each insert
    from studio.qt.panels.jobs_panel import MAX_ROWS

    jobs = JobManager()
    panel = JobsPanel(StudioState(), jobs)
    qtbot.addWidget(panel)
    release = threading.Event()
    running = jobs.submit("Long export", lambda ctx: release.wait(30), kind="export")
    ended = []
    for i in range(MAX_ROWS + 60):
        ended.append(jobs.submit(f"Budget plan {i}", lambda ctx: None))
        qtbot.waitUntil(lambda: not ended[-1].active, timeout=5000)
    assert panel.tree.topLevelItemCount() <= MAX_ROWS + 21
    assert panel.row_of(running).text(0) == "Long export"  # the running job keeps its row
    assert panel.row_of(ended[-1]).text(0) == f"Budget plan {MAX_ROWS + 59}"
    assert ended[0].id not in panel._items  # the oldest ended ones went
    release.set()
    qtbot.waitUntil(lambda: not running.active, timeout=5000)
    jobs.shutdown()
