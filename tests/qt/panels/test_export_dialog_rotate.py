"""The Export dialog's "Rotate" box (issue 41): a rotated file with its seed recorded."""

from __future__ import annotations

from pathlib import Path

from studio.core.gguf.read import read_gguf

EXPORT_TIMEOUT_MS = 240_000


def test_the_rotate_box_writes_a_rotated_file(qtbot, make_window, qwen2_model, tmp_path):
    win = make_window()
    assert win.open_path(qwen2_model) is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=60_000)
    dlg = win.show_export_dialog()
    assert not dlg.rotate_check.isChecked()  # off by default
    dlg.set_plan_choice("Q8_0")
    dlg.verify_check.setChecked(False)
    dlg.rotate_check.setChecked(True)
    out = Path(tmp_path) / "rot.gguf"
    dlg.set_output_path(out)
    with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS):
        dlg.start()
    g = read_gguf(out)
    assert g.metadata["quantize.rotation.seed"] == 0
    assert "output.weight" in {t.name for t in g.tensors}  # the tied head, untied
    assert "Only R2" not in dlg.status.text()


def test_a_family_r1_cannot_fold_is_written_with_r2_and_the_dialog_says_why(
    qtbot, make_window, tiny_models, tmp_path
):
    win = make_window()
    assert win.open_path(tiny_models("gemma")) is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=60_000)
    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q8_0")
    dlg.verify_check.setChecked(False)
    dlg.rotate_check.setChecked(True)
    out = Path(tmp_path) / "rot.gguf"
    dlg.set_output_path(out)
    with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS):
        dlg.start()
    assert read_gguf(out).metadata["quantize.rotation.r1"] is False
    assert "Only R2" in dlg.status.text() and "output head from the embedding" in dlg.status.text()
