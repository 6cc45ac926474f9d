"""The Export dialog shows a calibrated job's estimated peak memory and time before it starts."""

from __future__ import annotations

from studio.core.calib.data import BUILTIN, guess_chunks
from studio.core.plan import job_estimate
from studio.core.plan.job_estimate import calibration_estimate_line, lattice_weights
from studio.core.plan.plan import plan_from_preset
from studio.core.quant.gptq_lattice import LATTICE_TYPES
from tests.qt.panels.test_export_calibrated import _dialog


def test_export_dialog_shows_the_calibration_estimate(qtbot, make_window, llama_model):
    win = make_window()
    dlg = _dialog(qtbot, win, llama_model)
    assert dlg.estimate_label.text() == ""  # rtn: nothing is calibrated
    dlg.set_method("gptq")
    first = dlg.estimate_label.text()
    # "all" chunks: as many as the built-in text holds, guessed from its size (as the command line says)
    builtin = guess_chunks(BUILTIN, 512)
    assert 15 < builtin < 40, builtin  # 49 KB of text at 4 bytes a token
    assert first == calibration_estimate_line(
        dict(dlg.state.info.config), "gptq", 512, builtin, "cpu", guessed=True
    )
    assert first.startswith("Calibrating: about ") and f"(about {builtin} chunks of 512 tokens)." in first
    dlg.chunks_spin.setValue(4)
    assert dlg.estimate_label.text().endswith("(4 chunks of 512 tokens).")
    dlg.set_method("rtn")
    assert dlg.estimate_label.text() == ""


def test_the_guessed_chunks_follow_the_users_text_and_the_mix(qtbot, make_window, llama_model, tmp_path):
    """A user's text of 40,960 bytes is about 20 chunks of 512 tokens; gptq adds the built-in text after it
    unless the mix box is cleared, and the estimate follows both."""
    dlg = _dialog(qtbot, make_window(), llama_model)
    text = tmp_path / "mine.txt"
    text.write_text("word " * 8192)
    dlg.set_method("gptq")
    dlg.set_calibration(text)
    builtin = guess_chunks(BUILTIN, 512)
    assert f"(about {20 + builtin} chunks of 512 tokens)." in dlg.estimate_label.text()
    dlg.calib_mix_check.setChecked(False)
    assert dlg.estimate_label.text().endswith("(about 20 chunks of 512 tokens).")
    dlg.set_method("awq")  # never mixed
    dlg.calib_mix_check.setChecked(True)
    assert dlg.estimate_label.text().endswith("(about 20 chunks of 512 tokens).")


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


def test_the_estimate_counts_gptqs_lattice_sweeps_of_the_chosen_preset(
    qtbot, make_window, llama_model, monkeypatch
):
    """GPTQ onto an i-quant lattice costs per weight (the 1.5B's IQ3_XXS took 47 min where the line said 15):
    choosing IQ2_M adds its sweeps to the line; the tiny model's take milliseconds, so a cost of 1 ms a
    weight shows them."""
    for q in LATTICE_TYPES:
        monkeypatch.setitem(job_estimate.LATTICE_SECONDS, q, 1e-3)
    dlg = _dialog(qtbot, make_window(), llama_model)
    dlg.set_method("gptq")
    dlg.chunks_spin.setValue(4)
    k_quants = dlg.estimate_label.text()
    dlg.set_plan_choice("IQ2_M")
    info = dlg.state.info
    lattice = lattice_weights(info, plan_from_preset(info, "IQ2_M", imatrix=True).types, lambda _name: True)
    line = calibration_estimate_line(dict(info.config), "gptq", 512, 4, "cpu", lattice=lattice)
    assert dlg.estimate_label.text() == line != k_quants
    dlg.set_method("imatrix")  # the imatrix search: no sweep
    assert dlg.estimate_label.text() == calibration_estimate_line(dict(info.config), "imatrix", 512, 4, "cpu")
