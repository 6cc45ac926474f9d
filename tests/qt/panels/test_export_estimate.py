"""The Export dialog shows a calibrated job's estimated peak memory and time before it starts."""

from __future__ import annotations

from tests.qt.panels.test_export_calibrated import _dialog


def test_export_dialog_shows_the_calibration_estimate(qtbot, make_window, llama_model):
    win = make_window()
    dlg = _dialog(qtbot, win, llama_model)
    assert dlg.estimate_label.text() == ""  # rtn: nothing is calibrated
    dlg.set_method("gptq")
    first = dlg.estimate_label.text()
    assert (
        first.startswith("Calibrating: about ")
        and "at its peak" in first
        and "128 chunks of 512 tokens" in first
    )
    dlg.chunks_spin.setValue(4)
    assert "4 chunks of 512 tokens" in dlg.estimate_label.text()
    dlg.set_method("rtn")
    assert dlg.estimate_label.text() == ""
