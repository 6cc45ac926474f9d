"""Chat (issue 26): a model loads when its column is added, the load time is shown apart from the
first-token time, and the columns share the cores (each header says how)."""

from __future__ import annotations

import time

import pytest

from studio.core.chat.session import open_backend
from studio.qt.jobs import JobManager
from studio.qt.panels.chat_panel import ChatPanel
from studio.qt.state import StudioState
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of


@pytest.fixture
def panel(qtbot):
    p = ChatPanel(StudioState(), JobManager())
    p.backend_factory = lambda path: open_backend(path, n_ctx=256, device="cpu")
    qtbot.addWidget(p)
    p.resize(1000, 600)
    p.show()
    yield p
    p.stop()
    qtbot.waitUntil(lambda: not p.running, timeout=30_000)
    p.jobs.shutdown(timeout_ms=60_000)
    p.shutdown()


def test_models_load_when_added_and_the_load_is_shown_apart_from_the_first_token(
    qtbot, panel, chat_model, f32_gguf
):
    panel.set_models([chat_model, f32_gguf])
    hf, gg = panel.columns
    # loading started at once, before any Send
    assert all(c.load_info.text().startswith("loading…") for c in panel.columns)
    share = panel.thread_share
    assert share.columns == 2 and 1 <= share.threads <= max(1, share.cores // 2)
    assert all(share.describe() in c.load_info.text() for c in panel.columns)
    qtbot.waitUntil(lambda: all("loaded in" in c.load_info.text() for c in panel.columns), timeout=120_000)
    backends = [panel._backends[str(c.path)] for c in panel.columns]
    assert all(b.loaded for b in backends)
    loads = [b.load_seconds for b in backends]
    assert all(s > 0 for s in loads)
    for col, s in zip(panel.columns, loads, strict=True):
        assert f"loaded in {s:.1f} s" in col.load_info.text()
    # both back ends run on the column's share, each in its own child (torch's and llama.cpp's threads)
    assert backends[0].n_threads == share.threads and backends[1].options.n_threads == share.threads

    panel.max_tokens.setValue(8)
    panel.prompt.setPlainText("Hello, how are you?")
    t_send = time.monotonic()
    with qtbot.waitSignal(panel.turnFinished, timeout=120_000) as blocker:
        assert panel.send()
    outcomes = blocker.args[0]
    assert [o.error for o in outcomes] == [None, None]
    for col, out in zip(panel.columns, outcomes, strict=True):
        r = out.result
        # the first-token time counts from Send and is shown on its own line, the load on another
        assert r.ttft_s <= time.monotonic() - t_send
        assert f"first token {r.ttft_s * 1000:.0f} ms after Send" in col.stats.text()
        assert "loaded in" not in col.stats.text() and "first token" not in col.load_info.text()
        assert col.load_info.text().startswith("loaded in")
    # the transformers column generated with torch at the page's share, on its own thread
    assert backends[0].threads_used == panel._session.share.threads
    # no second load happened during Send
    assert [b.load_seconds for b in backends] == loads
    # the share the turn ran with is in the headers, and the llama.cpp child really runs on it
    share = panel.thread_share
    assert all(share.describe() in c.load_info.text() for c in panel.columns)
    assert backends[1]._threads_in_child == share.threads
    assert backends[1]._call("chat_threads", n=share.threads) == share.threads


def test_removing_a_column_gives_its_cores_to_the_others(qtbot, panel, f32_gguf, gguf_of, chat_model):
    panel.set_models([f32_gguf, gguf_of(chat_model, "Q8_0")])
    qtbot.waitUntil(lambda: all("loaded in" in c.load_info.text() for c in panel.columns), timeout=120_000)
    panel.remove_column(panel.columns[1])
    (col,) = panel.columns
    share = panel.thread_share
    assert share.columns == 1 and share.describe() in col.load_info.text()
    assert panel._backends[str(col.path)].n_threads == share.threads


def test_a_column_whose_model_cannot_load_says_so_before_send(qtbot, panel, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(12))
    panel.set_models([bad])
    (col,) = panel.columns
    qtbot.waitUntil(lambda: col.error is not None, timeout=30_000)
    assert col.load_info.text().startswith("not loaded") and "Error:" in col.stats.text()
