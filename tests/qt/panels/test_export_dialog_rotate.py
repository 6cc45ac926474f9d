"""The Export dialog's "Rotate" box (issue 41): a rotated file with its seed recorded, and on a family R1
cannot fold, R2 alone with the reason in the status line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from studio.core.gguf.read import read_gguf

EXPORT_TIMEOUT_MS = 240_000


def _export_rotated(qtbot, make_window, model: Path, out: Path) -> Any:
    """Open ``model``, tick "Rotate" (off by default) and export Q8_0 to ``out``; the dialog."""
    win = make_window()
    assert win.open_path(model) is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=60_000)
    dlg = win.show_export_dialog()
    assert not dlg.rotate_check.isChecked()  # off by default
    dlg.set_plan_choice("Q8_0")
    dlg.verify_check.setChecked(False)
    dlg.rotate_check.setChecked(True)
    dlg.set_output_path(out)
    with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS):
        dlg.start()
    return dlg


@pytest.mark.parametrize(("arch", "why"), [("qwen2", ""), ("gemma", "output head from the embedding")])
def test_the_rotate_box_writes_a_rotated_file(qtbot, make_window, tiny_models, tmp_path, arch, why):
    """Qwen2 (tied): R1 and R2, the head untied. Gemma: R2 alone, and the status line says why."""
    out = Path(tmp_path) / "rot.gguf"
    dlg = _export_rotated(qtbot, make_window, tiny_models(arch), out)
    g = read_gguf(out)
    assert g.metadata["quantize.rotation.seed"] == 0
    assert g.metadata["quantize.rotation.r1"] is not bool(why)
    assert ("output.weight" in {t.name for t in g.tensors}) is not bool(why)  # R1 unties the tied head
    assert ("Only R2" in dlg.status.text()) is bool(why) and why in dlg.status.text()
