"""The preset estimates run as a job: the Summary tab never waits for them (a GGUF's take 0.5 s on the 1.5B)."""

from __future__ import annotations

import dataclasses
import threading

from studio.qt.fmt import human_bytes

OPEN_TIMEOUT_MS = 30_000


def test_estimates_run_off_the_gui_thread_and_the_newest_wins(qtbot, make_window, real_services, tiny_models):
    gate = threading.Event()
    calls: list[tuple[int, bool]] = []  # (context length, ran on the GUI thread)
    gui = threading.current_thread()

    def slow_estimate(info, hw, ctx_len):
        calls.append((ctx_len, threading.current_thread() is gui))
        gate.wait(10)  # stands in for a big GGUF's estimate: the GUI thread must not be the one waiting
        return real_services.estimate_presets(info, hw, ctx_len)

    win = make_window(dataclasses.replace(real_services, estimate_presets=slow_estimate))
    job = win.open_path(tiny_models("llama"))
    qtbot.waitUntil(lambda: not job.active, timeout=OPEN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: bool(calls), timeout=OPEN_TIMEOUT_MS)
    assert win.estimates.running
    assert win.summary.estimate_table.rowCount() == 0  # nothing shown yet, and nothing stale

    # The spin box answers at once although the estimate is still blocked; two quick changes: the last wins.
    win.summary.ctx_spin.setValue(4096)
    win.summary.ctx_spin.setValue(131072)
    assert win.state.context_length == 131072
    with qtbot.waitSignal(win.state.estimatesChanged, timeout=OPEN_TIMEOUT_MS):
        gate.set()
    qtbot.waitUntil(lambda: not win.estimates.running, timeout=OPEN_TIMEOUT_MS)
    assert not any(on_gui for _, on_gui in calls)
    expected = real_services.estimate_presets(win.state.info, win.state.hardware, 131072)
    table = win.summary.estimate_table
    assert [table.item(r, 3).text() for r in range(table.rowCount())] == [
        human_bytes(e.memory_bytes) for e in expected
    ]
    assert win.state.estimates == tuple(expected)


def test_a_failing_estimate_says_one_sentence_and_shows_none(qtbot, make_window, real_services, tiny_models):
    from studio.core.errors import StudioError

    def broken(info, hw, ctx_len):
        raise StudioError("The presets cannot be estimated for this model.")

    win = make_window(dataclasses.replace(real_services, estimate_presets=broken))
    shown: list[str] = []
    win.statusBar().messageChanged.connect(shown.append)
    win.open_path(tiny_models("llama"))
    qtbot.waitUntil(
        lambda: "The presets cannot be estimated for this model." in shown, timeout=OPEN_TIMEOUT_MS
    )
    assert win.state.estimates == ()
    assert win.summary.estimate_table.rowCount() == 0


def test_the_estimate_starts_after_the_panels_have_shown_the_opened_model(
    qtbot, make_window, real_services, tiny_models
):
    """Started at once on modelOpened, the estimate's worker took the GIL from the panels' own handlers of
    the same signal, each of whose calls into Qt waits for it again (a 32-layer model's open stalled the
    window 127 ms, issue 40); it now starts once they are done, and counts as running meanwhile."""
    from studio.core.model import open_model

    win = make_window(real_services)
    qtbot.waitUntil(lambda: win.state.hardware is not None, timeout=OPEN_TIMEOUT_MS)  # an estimate can start
    jobs_when_shown: list[int] = []
    ckpt = open_model(tiny_models("llama"))
    # connected last: runs after every panel's handler of the signal
    win.state.modelOpened.connect(lambda _c: jobs_when_shown.append(len(win.jobs.active_jobs("estimate"))))
    win.state.set_checkpoint(ckpt, "tiny")
    assert jobs_when_shown == [0] and win.estimates.running  # not started yet, but pending
    qtbot.waitUntil(lambda: bool(win.state.estimates), timeout=OPEN_TIMEOUT_MS)
    assert not win.estimates.running


def test_opening_lays_the_model_out_on_the_worker(tiny_models):
    """The open job makes the model's GGUF layout and keeps it with the info, so the plan editor, which lays
    the model out on the GUI thread as it opens, only reads it (building gguf's name map there stalled the
    window 40 ms at 32 layers)."""
    from studio.core.jobs import null_context
    from studio.qt.services import real_services

    ckpt = real_services().open_model(tiny_models("llama"), null_context(), False)
    try:
        assert "layout" in ckpt.info.derived
        assert {t.hf_name for t in ckpt.info.derived["layout"].tensors} <= {t.name for t in ckpt.info.tensors}
    finally:
        ckpt.close()
