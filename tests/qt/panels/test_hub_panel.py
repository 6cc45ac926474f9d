"""The Hub panel over the fake Hub: search, details, download with progress, gated token prompt, pause."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QMessageBox

from studio.core.hub.paths import PARTIAL_SUFFIX
from studio.qt.jobs import JobManager
from studio.qt.panels.hub_panel import HubPanel
from studio.qt.state import StudioState
from tests.core.hub.fakehub import FakeHub, Fault, prepare_env

LLAMA = "tiny-org/tiny-llama"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub() as server:
        server.cache_dir = prepare_env(monkeypatch, tmp_path, server)
        monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (None, None))
        yield server


@pytest.fixture
def panel(qtbot, hub):
    prompts: list[str] = []
    p = HubPanel(StudioState(), JobManager())
    p.ask_token = lambda parent, msg: (prompts.append(msg), (p.next_token, False))[1]
    p.next_token = None
    p.prompts = prompts
    qtbot.addWidget(p)
    p.show()
    yield p
    p.shutdown()
    p.jobs.shutdown()


def _search(qtbot, panel, text):
    panel.search_edit.setText(text)
    qtbot.keyClick(panel.search_edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: panel.results.rowCount() > 0, timeout=10_000)


def _select(qtbot, panel, repo_id):
    for r in range(panel.results.rowCount()):
        if panel.results.item(r, 0).data(Qt.ItemDataRole.UserRole) == repo_id:
            panel.results.selectRow(r)
            break
    qtbot.waitUntil(
        lambda: panel.files.rowCount() > 0 and repo_id in panel.title_label.text(), timeout=10_000
    )
    qtbot.waitUntil(lambda: "loading" not in panel.title_label.text(), timeout=10_000)


def _cells(table, col):
    return [table.item(r, col).text() for r in range(table.rowCount())]


def test_search_shows_results_with_counts(qtbot, panel):
    _search(qtbot, panel, "tiny")
    assert _cells(panel.results, 0) == ["tiny-org/tiny-llama", "tiny-org/tiny-llama-GGUF"]
    assert _cells(panel.results, 1) == ["1,500", "800"]
    assert _cells(panel.results, 3) == ["65,792", "65,792"]
    assert "2 model(s) found" in panel.status.text()


def test_details_render_card_and_gguf_quant_types(qtbot, panel, hub):
    _search(qtbot, panel, "tiny")
    _select(qtbot, panel, LLAMA)
    assert "Tiny Llama" in panel.card.toPlainText()
    assert "license: apache-2.0" not in panel.card.toPlainText()  # YAML front matter is not shown
    assert "license: apache-2.0" in panel.title_label.text()
    assert sorted(_cells(panel.files, 0)) == sorted(hub.repos[LLAMA].files)
    assert _cells(panel.files, 1)[_cells(panel.files, 0).index("model.safetensors")] == "263 KB"
    _select(qtbot, panel, "tiny-org/tiny-llama-GGUF")
    quants = dict(zip(_cells(panel.files, 0), _cells(panel.files, 2), strict=True))
    assert quants["tiny-llama-Q4_K_M.gguf"] == "Q4_K_M" and quants["tiny-llama-IQ4_XS.gguf"] == "IQ4_XS"


def test_fit_badges_fill_in_for_known_hardware(qtbot, panel):
    from studio.core.hardware import Backend, GpuInfo, HardwareInfo

    gib = 1024**3
    panel.set_hardware(
        HardwareInfo("cpu", 8, 16 * gib, 16 * gib, (GpuInfo(0, "GPU", Backend.CUDA, 8 * gib, 8 * gib),))
    )
    _search(qtbot, panel, "tiny")
    qtbot.waitUntil(lambda: all(t.startswith("Q4_K_M:") for t in _cells(panel.results, 4)), timeout=10_000)
    assert _cells(panel.results, 4)[0] == "Q4_K_M: fits on the GPU"


def test_download_emits_path_with_progress_and_never_blocks_gui(qtbot, panel, hub):
    hub.add_fault(Fault("slow", path="*/model.safetensors", times=1, chunk=16_384, delay=0.04))  # ~0.7 s
    _search(qtbot, panel, "tiny-llama")
    _select(qtbot, panel, LLAMA)
    gaps, last = [], [time.perf_counter()]

    def tick():
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(10)
    with qtbot.waitSignal(panel.modelDownloaded, timeout=20_000) as blocker:
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    timer.stop()
    path = Path(blocker.args[0])
    for name, data in hub.repos[LLAMA].files.items():
        assert (path / name).read_bytes() == data
    assert max(gaps) < 0.1, f"GUI thread blocked for {max(gaps) * 1000:.0f} ms"
    assert len(gaps) > 20  # the download really ran while we watched
    assert panel.progress.value() == 1000
    assert "Downloaded tiny-org/tiny-llama" in panel.status.text()
    progress = dict(zip(_cells(panel.files, 0), _cells(panel.files, 3), strict=True))
    assert progress["model.safetensors"] == "100 %"


def test_gated_download_asks_for_a_token_then_succeeds(qtbot, panel, hub):
    _search(qtbot, panel, "gated")
    _select(qtbot, panel, "gated-org/gated-llama")
    panel.next_token = "hf_good_token"
    with qtbot.waitSignal(panel.modelDownloaded, timeout=20_000) as blocker:
        panel.download_button.click()
    assert len(panel.prompts) == 1 and "gated" in panel.prompts[0]
    assert (Path(blocker.args[0]) / "config.json").is_file()


def test_gated_download_without_token_shows_the_reason(qtbot, panel, hub):
    _search(qtbot, panel, "gated")
    _select(qtbot, panel, "gated-org/gated-llama")
    panel.download_button.click()
    qtbot.waitUntil(lambda: "gated" in panel.status.text() and not panel.downloading, timeout=10_000)
    assert len(panel.prompts) == 1


def _size(p) -> int:
    """A partial's size, 0 once it is gone: a small file's partial is renamed between glob and stat."""
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def test_pause_keeps_partial_and_download_resumes(qtbot, panel, hub):
    hub.add_fault(Fault("slow", path="*/model.safetensors", times=1, chunk=8192, delay=0.05))
    _search(qtbot, panel, "tiny-llama")
    _select(qtbot, panel, LLAMA)
    panel.download_button.click()
    blobs = hub.cache_dir / "models--tiny-org--tiny-llama" / "blobs"
    qtbot.waitUntil(lambda: any(_size(p) > 50_000 for p in blobs.glob(f"*{PARTIAL_SUFFIX}")), timeout=10_000)
    panel.pause_button.click()
    qtbot.waitUntil(lambda: not panel.downloading and "Paused" in panel.status.text(), timeout=5000)
    assert list(blobs.glob(f"*{PARTIAL_SUFFIX}"))
    hub.clear()
    with qtbot.waitSignal(panel.modelDownloaded, timeout=20_000):
        panel.download_button.click()
    ranges = [r.range for r in hub.file_requests("model.safetensors")]
    assert len(ranges) == 1 and ranges[0] is not None and ranges[0].startswith("bytes=")


def test_cancel_removes_partials(qtbot, panel, hub):
    hub.add_fault(Fault("slow", path="*/model.safetensors", times=1, chunk=8192, delay=0.05))
    _search(qtbot, panel, "tiny-llama")
    _select(qtbot, panel, LLAMA)
    panel.download_button.click()
    blobs = hub.cache_dir / "models--tiny-org--tiny-llama" / "blobs"

    qtbot.waitUntil(lambda: any(_size(p) > 30_000 for p in blobs.glob(f"*{PARTIAL_SUFFIX}")), timeout=10_000)
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: "cancelled" in panel.status.text(), timeout=5000)
    qtbot.waitUntil(lambda: not list(blobs.glob(f"*{PARTIAL_SUFFIX}")), timeout=5000)


def test_docked_in_main_window_a_finished_download_opens(qtbot, hub, make_window):
    """Docked with the window's state and JobManager, a finished download opens in the window."""
    win = make_window()
    panel = HubPanel(win.state, win.jobs, win)
    win.add_dock(panel, "Hub", "HubDock", Qt.DockWidgetArea.RightDockWidgetArea)
    panel.modelDownloaded.connect(win.open_path)
    _search(qtbot, panel, "tiny-llama")
    _select(qtbot, panel, LLAMA)
    panel.download_button.click()
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=20_000)
    assert (
        win.model_path
        == hub.cache_dir / "models--tiny-org--tiny-llama" / "snapshots" / hub.repos[LLAMA].commit
    )
    assert win.state.info.architecture == "LlamaForCausalLM"


def test_downloaded_tab_lists_opens_and_deletes(qtbot, panel, hub, dialogs):
    from studio.core.hub import download

    path = download(LLAMA)
    panel.tabs.setCurrentIndex(1)  # switching to the tab refreshes it
    qtbot.waitUntil(lambda: panel.cache_table.rowCount() == 1, timeout=10_000)
    assert _cells(panel.cache_table, 0) == [LLAMA]
    assert "1 model(s)" in panel.cache_label.text()
    panel.cache_table.selectRow(0)
    with qtbot.waitSignal(panel.modelDownloaded, timeout=2000) as blocker:
        panel.cache_open_button.click()
    assert Path(blocker.args[0]) == path
    dialogs.answer = QMessageBox.StandardButton.Yes
    panel.cache_delete_button.click()
    qtbot.waitUntil(lambda: panel.cache_table.rowCount() == 0, timeout=10_000)
    assert dialogs.calls and dialogs.calls[0][0] == "question"
    assert not path.exists()
