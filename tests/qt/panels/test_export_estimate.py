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


def test_export_dialog_warns_when_gptq_would_fit_fewer_tokens_than_the_model_is_wide(
    qtbot, make_window, llama_model, monkeypatch
):
    """The tiny model is 256 wide, narrower than any chunk of 512: the warning's rule is seen through a
    model as wide as an 8B (4096), and the line follows the chunks as the user changes them."""
    from studio.core.plan import job_estimate
    from studio.qt.panels import export_dialog

    real = job_estimate.thin_calibration
    monkeypatch.setattr(
        export_dialog, "thin_calibration", lambda cfg, *a: real({**cfg, "hidden_size": 4096}, *a)
    )
    dlg = _dialog(qtbot, make_window(), llama_model)
    dlg.set_method("gptq")
    dlg.chunks_spin.setValue(4)
    line, warning = dlg.estimate_label.text().split("\n")
    assert line.startswith("Calibrating: about ") and line.endswith("(4 chunks of 512 tokens).")
    assert warning.startswith("⚠ GPTQ will fit each matrix to 2,048 calibration tokens")
    assert warning.endswith("calibrate on 8 chunks of 512 tokens or more.")
    label = dlg.estimate_label  # its wrapped lines are all shown, not drawn over the rows above
    qtbot.waitUntil(lambda: label.height() >= label.heightForWidth(label.width()), timeout=2000)
    dlg.chunks_spin.setValue(8)
    assert "⚠" not in dlg.estimate_label.text() and "8 chunks of 512 tokens" in dlg.estimate_label.text()
    dlg.chunks_spin.setValue(4)
    dlg.set_method("awq")  # AWQ alone fits no Hessian's inverse
    assert "⚠" not in dlg.estimate_label.text()
