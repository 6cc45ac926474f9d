"""Issue 12's acceptance through the window: ``--demo`` opens SmolLM2 on a real outlier channel, and a
Q2_K export from the Export dialog diverges from the original in the side-by-side chat."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PySide6.QtCore import Qt

from studio.core.demo import DEMO_OUTLIER_CHANNEL, DEMO_QUESTION, DEMO_TENSOR

pytestmark = pytest.mark.real

TIMEOUT_MS = 240_000  # a loaded 2-core machine: the export, then two models answering


def test_demo_opens_on_an_outlier_and_a_q2k_export_diverges_in_chat(
    qtbot, make_window, real_services, demo_dir, tmp_path, monkeypatch
):
    from studio.core.llamacpp.options import EXTRA_BUFFERS_ENV
    from studio.qt.demo_screen import FIRST_SCREEN_MESSAGE
    from studio.qt.opener import DEMO_NAME

    # llama.cpp's generic CPU kernels on every CPU (as tests/real/test_smollm2.py says why): where it
    # repacks weights, the Q2_K answer's very first token flips
    monkeypatch.setenv(EXTRA_BUFFERS_ENV, "off")

    # the session's prepared demo stands in for the user's cache (prepared once per test session)
    win = make_window(dataclasses.replace(real_services, demo_model_path=lambda ctx: demo_dir))
    win.ensure_panels()
    with qtbot.waitSignal(
        win.panel("inspector").statsShown, timeout=TIMEOUT_MS, check_params_cb=lambda n: n == DEMO_TENSOR
    ):
        win.open_demo()
    assert win.windowTitle().startswith(DEMO_NAME) and "SmolLM2" in DEMO_NAME
    assert win.tabs.currentIndex() == win.page_index("inspector")
    assert win.banner.isVisible() and win.banner.text() == FIRST_SCREEN_MESSAGE  # a banner, not a status
    qtbot.mouseClick(win.banner.close_button, Qt.MouseButton.LeftButton)
    assert not win.banner.isVisible()
    marked = np.flatnonzero(win.panel("inspector").in_channels.mask)
    assert DEMO_OUTLIER_CHANNEL in marked
    assert win.panel("inspector").table_value("outlier input channels") == f"{len(marked)} of 576"
    chat = win.panel("chat")
    assert chat.prompt.toPlainText() == DEMO_QUESTION and [c.path for c in chat.columns] == [demo_dir]

    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q2_K")
    dlg.set_output_path(tmp_path / "SmolLM2-Q2_K.gguf")
    dlg.verify_check.setChecked(False)
    with qtbot.waitSignal(dlg.exportFinished, timeout=TIMEOUT_MS):
        assert dlg.start() is not None
    dlg.hide()
    qtbot.waitUntil(lambda: len(chat.columns) == 2, timeout=5_000)  # the export became a column

    win.show_page("chat")
    chat.max_tokens.setValue(24)
    with qtbot.waitSignal(chat.turnFinished, timeout=TIMEOUT_MS) as done:
        assert chat.send()
    outcomes = done.args[0]
    assert [o.error for o in outcomes] == [None, None]
    original, q2 = chat.columns
    assert "The capital of France is Paris." in original.view.toPlainText()
    i = q2.divergence
    assert i is not None and i >= 1 and original.divergence == i
    assert outcomes[1].result.text != outcomes[0].result.text
    qtbot.waitUntil(lambda: not win.jobs.busy, timeout=TIMEOUT_MS)
