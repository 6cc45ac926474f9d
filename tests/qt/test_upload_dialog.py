"""Upload to the Hub after an export: the Export dialog's button, the card preview, the outcome on screen."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.core.hub.fakehub import FakeHub, prepare_env

TIMEOUT_MS = 120_000


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub() as server:
        prepare_env(monkeypatch, tmp_path, server)
        monkeypatch.setattr("studio.core.hub.auth._keyring", lambda: None)
        monkeypatch.setenv("HF_TOKEN", "hf_write_token")
        monkeypatch.setattr("huggingface_hub.utils._http.time.sleep", lambda s: None)
        yield server


def _export(qtbot, win, model, out):
    assert win.open_path(model) is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=TIMEOUT_MS)
    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q8_0")
    dlg.set_output_path(out)
    dlg.verify_check.setChecked(False)
    assert not dlg.upload_button.isEnabled()  # nothing to upload yet
    with qtbot.waitSignal(dlg.exportFinished, timeout=TIMEOUT_MS):
        dlg.start()
    return dlg


def test_upload_after_export_shows_the_card_and_puts_the_file_on_the_hub(
    qtbot, make_window, llama_model, tmp_path, hub
):
    win = make_window()
    out = tmp_path / "tiny-Q8_0.gguf"
    exp = _export(qtbot, win, llama_model, out)
    assert exp.upload_button.isEnabled()
    qtbot.mouseClick(exp.upload_button, Qt.MouseButton.LeftButton)
    dlg = exp.upload_dialog
    assert dlg.isVisible() and dlg.path == out
    qtbot.waitUntil(lambda: "**Q8_0**" in dlg.card_view.toPlainText(), timeout=TIMEOUT_MS)
    assert not dlg.upload_button.isEnabled()  # no repository typed yet
    dlg.repo_edit.setText("alice/tiny-Q8_0-GGUF")
    qtbot.mouseClick(dlg.upload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dlg.result is not None, timeout=TIMEOUT_MS)
    repo = hub.repos["alice/tiny-Q8_0-GGUF"]
    assert repo.files[out.name] == out.read_bytes() and "README.md" in repo.files
    assert "Uploaded to" in dlg.status.text() and "alice/tiny-Q8_0-GGUF" in dlg.status.text()
    assert dlg.progress.value() == dlg.progress.maximum()
    # The namespace is remembered for the next upload.
    assert win.settings.upload_namespace == "alice"
    dlg.close()


def test_a_refused_upload_is_one_red_sentence_and_creates_nothing(
    qtbot, make_window, llama_model, tmp_path, hub
):
    from studio.qt.settings import AppSettings
    from studio.qt.theme import error_color
    from studio.qt.upload_dialog import UploadDialog

    win = make_window()
    out = tmp_path / "tiny-Q8_0.gguf"
    _export(qtbot, win, llama_model, out)
    dlg = UploadDialog(out, win.jobs, win, settings=AppSettings.from_file(str(tmp_path / "s.ini")))
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.repo_edit.setText("bob/not-mine")
    job = dlg.start()
    qtbot.waitUntil(lambda: not job.active, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: "failed" in dlg.status.text(), timeout=TIMEOUT_MS)
    text = dlg.status.text()
    assert "HTTP 403" in text and "nothing was created on the Hub" in text and "\n" not in text
    assert error_color(dlg.status) in dlg.status.styleSheet() and "bob/not-mine" not in hub.repos
    assert dlg.upload_button.isEnabled()  # ready to try again with another repository
    qtbot.waitUntil(lambda: not win.jobs.busy, timeout=TIMEOUT_MS)
