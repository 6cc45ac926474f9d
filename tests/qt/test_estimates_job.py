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
