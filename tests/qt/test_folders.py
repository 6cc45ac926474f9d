"""Files where people find them: exports go to a visible folder, file dialogs start where the user last
was (also after a restart), and the export dialog offers "Show in folder"."""

from __future__ import annotations

from pathlib import Path

from studio.qt import folders
from studio.qt.settings import AppSettings
from studio.qt.state import StudioState


def test_an_export_of_a_model_in_a_hidden_cache_goes_to_the_documents_folder(tmp_path, monkeypatch):
    docs = tmp_path / "Documents" / "Quant Studio"
    monkeypatch.setenv("QUANT_STUDIO_DOCUMENTS", str(docs))
    hidden = tmp_path / ".cache" / "quant-studio" / "demo-2" / "SmolLM2"
    hidden.mkdir(parents=True)
    assert folders.visible_export_folder("", hidden) == docs and docs.is_dir()
    visible = tmp_path / "models" / "llama"
    visible.mkdir(parents=True)
    assert folders.visible_export_folder("", visible) == visible.parent  # beside a visible model
    last = tmp_path / "exports"
    last.mkdir()
    assert folders.visible_export_folder(str(last), hidden) == last  # the last one used wins
    assert folders.visible_export_folder(str(tmp_path / "gone"), hidden) == docs


def test_file_dialogs_start_where_the_user_last_was_also_after_a_restart(
    qtbot, tmp_path, settings_path, real_services, monkeypatch
):
    from PySide6.QtWidgets import QFileDialog

    from studio.qt.main_window import MainWindow

    state = StudioState()
    assert folders.start_in(state) == str(Path.home())
    gguf = tmp_path / "models" / "q2.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    folders.remember(state, gguf)
    assert folders.start_in(state) == str(gguf.parent)
    # the window keeps the folder in its settings; Chat's "Add GGUF…" of the next session starts there
    win = MainWindow(real_services, settings=AppSettings.from_file(str(settings_path)), state=state)
    qtbot.addWidget(win)
    win.close()
    assert AppSettings.from_file(str(settings_path)).last_folder == str(gguf.parent)
    win2 = MainWindow(real_services, settings=AppSettings.from_file(str(settings_path)))
    qtbot.addWidget(win2)
    win2.show()
    win2.ensure_panels()
    asked = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (asked.append(a[2]), ("", ""))[1])
    win2.panel("chat")._choose_gguf()
    assert asked == [str(gguf.parent)]
    win2.close()
