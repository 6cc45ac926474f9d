"""The window's "llama.cpp extra buffers" setting: stored in QSettings, steers every llama.cpp load of
the app, and a chat column says in one sentence when a crashed first decode was retried without them."""

from __future__ import annotations

import pytest

from studio.core.chat.session import open_backend
from studio.core.llamacpp import EXTRA_BUFFERS_ENV, ExtraBuffers, LlamaRunner, LoadOptions
from studio.core.llamacpp import runner as runner_mod
from studio.core.llamacpp.worker import TEST_CRASH_ENV
from studio.qt.jobs import JobManager
from studio.qt.panels.chat_panel import ChatPanel
from studio.qt.state import StudioState
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No preference in the environment (restored afterwards), a private remembered choice, no AMX."""
    monkeypatch.delenv(EXTRA_BUFFERS_ENV, raising=False)
    monkeypatch.delenv(TEST_CRASH_ENV, raising=False)
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(runner_mod, "cpu_has_amx", lambda: False)


def test_the_setting_is_in_the_edit_menu_saved_and_applied(
    qtbot, make_window, clean_env, gguf_of, chat_model
):
    import os

    win = make_window()
    menu = win.extra_buffers_menu
    assert menu.menuAction() in win.edit_menu.actions()
    acts = menu.actions_by_choice
    assert [a.isCheckable() for a in acts.values()] == [True, True, True]
    assert menu.choice() is ExtraBuffers.AUTO and acts[ExtraBuffers.AUTO].isChecked()
    acts[ExtraBuffers.OFF].trigger()
    assert menu.choice() is ExtraBuffers.OFF and not acts[ExtraBuffers.AUTO].isChecked()
    assert win.settings.llama_extra_buffers == "off" and os.environ[EXTRA_BUFFERS_ENV] == "off"
    # every load that asks for auto now goes without extra buffers (this machine has no AMX here)
    with LlamaRunner() as r:
        info = r.load(gguf_of(chat_model, "Q8_0"), LoadOptions(n_ctx=64))
        assert info["extra_buffers"] is False and r.decision.why == "asked"
    # a new window shows and applies the saved choice
    os.environ.pop(EXTRA_BUFFERS_ENV)
    win2 = make_window()
    assert win2.extra_buffers_menu.choice() is ExtraBuffers.OFF and os.environ[EXTRA_BUFFERS_ENV] == "off"
    win2.extra_buffers_menu.actions_by_choice[ExtraBuffers.AUTO].trigger()
    assert EXTRA_BUFFERS_ENV not in os.environ and win2.settings.llama_extra_buffers == "auto"


def test_a_chat_column_tells_the_retry_in_one_sentence(qtbot, clean_env, monkeypatch, gguf_of, chat_model):
    q8 = gguf_of(chat_model, "Q8_0")
    monkeypatch.setenv(TEST_CRASH_ENV, "decode")  # dies in its first decode with extra buffers on
    state, jobs = StudioState(), JobManager()
    panel = ChatPanel(state, jobs)
    panel.backend_factory = lambda p: open_backend(p, n_ctx=128, device="cpu")
    qtbot.addWidget(panel)
    panel.show()
    try:
        panel.set_models([q8])
        panel.max_tokens.setValue(4)
        panel.prompt.setPlainText("Hello there")
        with qtbot.waitSignal(panel.turnFinished, timeout=60_000) as blocker:
            assert panel.send()
        (out,) = blocker.args[0]
        assert out.error is None and len(out.notes) == 1
        col = panel.columns[0]
        assert col.error is None and len(col.tokens) > 0
        assert col.notes == list(out.notes)
        assert f"[{out.notes[0]}]" in col.view.toPlainText()
        assert "llama.cpp crashed (SIGSEGV) in the first decode of " + q8.name in out.notes[0]
    finally:
        panel.stop()
        qtbot.waitUntil(lambda: not panel.running, timeout=30_000)
        jobs.shutdown()
        panel.shutdown()
