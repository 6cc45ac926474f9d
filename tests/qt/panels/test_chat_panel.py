"""The chat panel: columns stream at once, Stop acts within a token, a dead child fails one column only."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QHelpEvent, QTextCursor
from PySide6.QtWidgets import QApplication, QToolTip

from studio.core.chat.session import open_backend
from studio.core.chat.types import TokenEvent
from studio.qt.jobs import JobManager
from studio.qt.panels.chat_panel import DIVERGE_COLOR, ChatPanel
from studio.qt.state import StudioState
from tests.core.chat import fixtures as _fixtures

# shared session fixtures (exports are cached in that module)
chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of


@pytest.fixture
def make_panel(qtbot):
    made = []

    def make(n_ctx: int = 256) -> ChatPanel:
        state, jobs = StudioState(), JobManager()
        panel = ChatPanel(state, jobs)
        panel.backend_factory = lambda p: open_backend(p, n_ctx=n_ctx, device="cpu")
        qtbot.addWidget(panel)
        panel.resize(1000, 600)
        panel.show()
        made.append(panel)
        return panel

    yield make
    for panel in made:
        panel.stop()
        qtbot.waitUntil(lambda p=panel: not p.running, timeout=30_000)
        panel.jobs.shutdown()
        panel.shutdown()


def _send(qtbot, panel: ChatPanel, text: str, timeout: int = 60_000):
    panel.prompt.setPlainText(text)
    with qtbot.waitSignal(panel.turnFinished, timeout=timeout) as blocker:
        assert panel.send()
    return blocker.args[0]


def test_columns_stream_at_once_and_agree_for_an_f32_export(qtbot, make_panel, chat_model, f32_gguf):
    panel = make_panel()
    panel.set_models([chat_model, f32_gguf])
    panel.max_tokens.setValue(16)
    streamed: list[int] = []
    panel.tokenShown.connect(lambda column, ev: streamed.append(column))
    outcomes = _send(qtbot, panel, "Hello, how are you?")
    assert [o.error for o in outcomes] == [None, None]
    assert set(streamed) == {0, 1}  # tokens reached both columns while the turn ran
    a, b = panel.columns
    assert a.text == b.text and len(a.tokens) > 0
    assert a.divergence is None and b.divergence is None
    for col in (a, b):
        assert "tokens/s" in col.stats.text() and "first token" in col.stats.text()
        assert "You: Hello, how are you?" in col.view.toPlainText()
    # hovering a token shows its probability
    start, _ = b.view.token_span(0)
    assert f"p = {b.tokens[0].prob:.4f}" in b.view.tooltip_for(start)
    cur = QTextCursor(b.view.document())
    cur.setPosition(start + 1 if b.tokens[0].text else start)
    rect = b.view.cursorRect(cur)
    QApplication.sendEvent(
        b.view.viewport(),
        QHelpEvent(QHelpEvent.Type.ToolTip, rect.center(), b.view.viewport().mapToGlobal(rect.center())),
    )
    assert "p = " in QToolTip.text()
    # a second turn keeps the conversation
    _send(qtbot, panel, "And then?")
    assert a.view.toPlainText().count("You: ") == 2


def test_first_divergent_token_is_highlighted(qtbot, make_panel, chat_model, f32_gguf, gguf_of):
    panel = make_panel()
    panel.set_models([f32_gguf, gguf_of(chat_model, "Q2_K")])
    panel.max_tokens.setValue(24)
    _send(qtbot, panel, "Hello, how are you?")
    ref, q2 = panel.columns
    i = q2.divergence
    assert i is not None and ref.divergence == i
    assert ref.tokens[i].text != q2.tokens[i].text or ref.tokens[i].token_id != q2.tokens[i].token_id
    assert [t.token_id for t in ref.tokens[:i]] == [t.token_id for t in q2.tokens[:i]]
    start, end = q2.view.token_span(i)
    cur = QTextCursor(q2.view.document())
    cur.setPosition(start + 1)
    assert cur.charFormat().background().color() == DIVERGE_COLOR


def test_stop_ends_every_column_and_the_next_prompt_works(
    qtbot, make_panel, chat_model, f32_gguf, gguf_of, settled_heap
):
    panel = make_panel(n_ctx=1024)
    panel.set_models([f32_gguf, gguf_of(chat_model, "Q8_0")])
    panel.max_tokens.setValue(900)
    panel.prompt.setPlainText("Talk for a long time.")
    assert panel.send()
    assert not panel.send_button.isEnabled() and panel.stop_button.isEnabled()
    qtbot.waitUntil(lambda: all(len(c.tokens) >= 5 for c in panel.columns), timeout=60_000)
    with qtbot.waitSignal(panel.stopped, timeout=5_000):
        t0 = time.monotonic()
        qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    took = time.monotonic() - t0
    assert took < 0.5, f"Stop took {took:.3f} s"
    assert all(0 < len(c.tokens) < 900 for c in panel.columns)
    assert all("stopped" in c.stats.text() for c in panel.columns)
    # every token of the stopped reply is on screen, none twice
    assert all(c.view.toPlainText().endswith(f"{c.label}: {c.text}") for c in panel.columns)
    assert panel.send_button.isEnabled() and not panel.stop_button.isEnabled()
    panel.max_tokens.setValue(4)
    outcomes = _send(qtbot, panel, "Short answer please.")
    assert all(o.error is None and o.result.stop_reason.value in ("length", "eos") for o in outcomes)


def test_tokens_made_while_the_window_is_busy_are_drawn_in_one_wake_up(qtbot, make_panel, f32_gguf):
    panel = make_panel()
    panel.set_models([f32_gguf])
    col = panel.columns[0]
    col.begin_turn("hi")
    wakes = []
    panel._queue.ready.connect(lambda: wakes.append(len(col.tokens)))
    events = [TokenEvent(i, 100 + i, f" w{i}", 0.5) for i in range(300)]
    worker = threading.Thread(target=lambda: [panel._queue.put(panel._turn, 0, ev) for ev in events])
    worker.start()  # the GUI thread is busy (here: joining) while a fast column makes 300 tokens
    worker.join()
    qtbot.waitUntil(lambda: len(col.tokens) == 300, timeout=5_000)
    assert len(wakes) == 1  # one queued wake-up, not 300
    assert col.view.toPlainText().endswith("".join(ev.text for ev in events))
    start, end = col.view.token_span(299)
    assert col.view.toPlainText()[start:end] == " w299"
    panel._queue.put(panel._turn - 1, 0, events[0])  # a token of an earlier turn is dropped
    qtbot.wait(50)
    assert len(col.tokens) == 300


def test_a_dead_child_shows_an_error_in_its_own_column(qtbot, make_panel, chat_model, f32_gguf, gguf_of):
    panel = make_panel()
    panel.set_models([f32_gguf, gguf_of(chat_model, "Q8_0")])
    panel.max_tokens.setValue(40)
    killed = []

    def kill_first(column, ev):
        if column == 0 and not killed:
            backend = panel._session.backends[0]
            os.kill(backend.worker.pid, signal.SIGKILL)
            killed.append(backend.worker.pid)

    panel.tokenShown.connect(kill_first)
    outcomes = _send(qtbot, panel, "Hello, how are you?")
    dead, alive = panel.columns
    assert killed and outcomes[0].error and "stopped unexpectedly" in outcomes[0].error
    assert dead.error and "Error:" in dead.stats.text() and "SIGKILL" in dead.stats.text()
    assert alive.error is None and len(alive.tokens) == 40 and "tokens/s" in alive.stats.text()


def test_a_huge_paste_is_tokenized_off_the_gui_thread(qtbot, make_panel, f32_gguf):
    panel = make_panel()
    panel.set_models([f32_gguf])
    text = ("The river runs past the mill and under the old stone bridge. " * 82_000)[: 5 << 20]
    ticks: list[float] = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(20)
    outcomes = _send(qtbot, panel, text, timeout=120_000)
    timer.stop()
    (col,) = panel.columns
    assert (
        outcomes[0].error
        and "prompt too long (" in outcomes[0].error
        and "> 255 tokens)" in outcomes[0].error
    )
    assert "prompt too long" in col.stats.text()
    assert len(ticks) > 5  # the event loop kept running while the prompt was tokenized
    assert f"({len(text):,} characters)" in col.view.toPlainText()  # shown shortened, sent whole


def test_models_come_from_the_state(qtbot, make_panel, chat_model, tmp_path):
    panel = make_panel()
    panel.state.modelOpened.emit(SimpleNamespace(info=SimpleNamespace(path=chat_model)))
    assert [c.path for c in panel.columns] == [chat_model]
    export = SimpleNamespace(result=SimpleNamespace(path=tmp_path / "m-Q4_K_M.gguf"))
    panel.state.publish_export(export)
    panel.state.publish_evaluation(SimpleNamespace(path=tmp_path / "report.json"))  # not a model
    assert [c.path for c in panel.columns] == [chat_model, export.result.path]
    assert panel.send_button.isEnabled() is True
    panel.remove_column(panel.columns[1])
    assert len(panel.columns) == 1
    assert panel.send() is False  # empty prompt: nothing to do


def test_truncation_keeps_the_end_of_a_long_prompt(qtbot, make_panel, f32_gguf):
    panel = make_panel()
    panel.set_models([f32_gguf])
    panel.max_tokens.setValue(4)
    panel.truncate.setChecked(True)
    outcomes = _send(qtbot, panel, "The mill wheel turns in the river. " * 200)
    (out,) = outcomes
    assert out.error is None
    assert out.result.prompt.truncated_from > 256 and len(out.result.prompt.ids) <= 256
    # the column shows the reply to the kept end of the prompt: what the model says to those ids
    from studio.core.chat import Sampling, generate

    ref = open_backend(f32_gguf, n_ctx=256, device="cpu")
    ref.load()
    try:
        want = generate(ref, [], Sampling(max_tokens=4), prompt=out.result.prompt)
    finally:
        ref.close()
    assert [t.token_id for t in panel.columns[0].tokens] == list(want.token_ids)
    assert len(want.tokens) > 0 and out.result.stop_reason is want.stop_reason


def test_the_kv_cache_choice_reloads_the_gguf_columns(make_panel, monkeypatch):
    import studio.core.chat.session as session_mod
    from studio.qt.panels import chat_panel

    panel = make_panel()
    closed = []
    for key in ("/m/a.gguf", "/m/folder"):
        panel._backends[key] = SimpleNamespace(close=lambda key=key: closed.append(key))
    assert panel.kv_type is None and panel.kv_combo.isEnabled()
    panel.kv_combo.setCurrentIndex(panel.kv_combo.findData("q4_0"))
    assert panel.kv_type == "q4_0"
    assert closed == ["/m/a.gguf"] and list(panel._backends) == ["/m/folder"]
    seen = []
    monkeypatch.setattr(session_mod, "open_backend", lambda path, **kw: seen.append(kw) or "backend")
    factory = chat_panel._default_factory(256, lambda: panel.kv_type)
    assert factory("/m/a.gguf") == "backend" and seen[-1]["kv_type"] == "q4_0"
