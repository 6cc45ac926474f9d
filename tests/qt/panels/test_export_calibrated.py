"""Calibrate & Quantize in the window: a gptq export with per-layer progress and ETA, its result joining
chat and evaluation; cancel mid-layer leaves no file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.qt.jobs import JobState

OPEN_TIMEOUT_MS = 60_000
JOB_TIMEOUT_MS = 600_000


@pytest.fixture
def calib_file(tmp_path: Path) -> Path:
    from studio.core.factory import sample_text

    p = tmp_path / "calib.txt"
    p.write_text(sample_text() * 2, encoding="utf-8")
    return p


def _dialog(qtbot, win, model: Path):
    assert win.open_path(model) is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)
    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q4_K_M")
    dlg.verify_check.setChecked(False)
    return dlg


def test_calibrate_and_quantize_reports_layers_and_joins_chat_and_evaluation(
    qtbot, make_window, llama_model, tmp_path, calib_file
):
    win = make_window()
    dlg = _dialog(qtbot, win, llama_model)
    assert not dlg.calib_edit.isEnabled()  # rtn needs no calibration text
    dlg.set_method("gptq")
    assert dlg.calib_edit.isEnabled() and not dlg.backend_combo.isEnabled()
    dlg.set_calibration(calib_file, chunks=3)
    out = tmp_path / "tiny-gptq.gguf"
    dlg.set_output_path(out)
    messages: list[str] = []
    win.jobs.jobChanged.connect(lambda job: messages.append(job.message))
    with qtbot.waitSignal(dlg.exportFinished, timeout=JOB_TIMEOUT_MS) as finished:
        job = dlg.start()
        assert job is not None and job.title.startswith("Calibrate & Quantize")
    outcome = finished.args[0]
    assert outcome.calibration is not None and outcome.calibration.method == "gptq"
    assert out.is_file() and outcome.result.path == out
    # per-layer progress with an ETA, and the layer being quantized
    assert any("layer 2/2" in m and "ETA" in m for m in messages)
    assert any(m.startswith("layer 1/2: gptq") for m in messages)
    assert (
        "gptq: calibrated on 1,536 tokens (3 × 512)" in dlg.result_label.text()
    )  # chunks of 512, as labelled
    assert "gptq" in outcome.summary()
    # the result joins chat and evaluation
    assert str(out) in win.panel("evaluate").variants()
    assert any(Path(c.path) == out for c in win.panel("chat").columns)
    # the plan the file followed records the method
    from studio.core.gguf.read import read_gguf

    g = read_gguf(out)
    assert json.loads(g.metadata["quant_studio.plan"])["method"] == "gptq"


def test_cancel_mid_layer_leaves_no_file(qtbot, make_window, llama_model, tmp_path, calib_file):
    win = make_window()
    dlg = _dialog(qtbot, win, llama_model)
    dlg.set_method("awq+gptq")
    dlg.set_calibration(calib_file, chunks=3)
    folder = tmp_path / "out"
    folder.mkdir()
    dlg.set_output_path(folder / "cancelled.gguf")
    job = dlg.start()
    assert job is not None
    qtbot.waitUntil(lambda: "layer 1/2: awq+gptq" in (job.message or ""), timeout=JOB_TIMEOUT_MS)
    dlg.cancel()
    with qtbot.waitSignal(dlg.exportCancelled, timeout=JOB_TIMEOUT_MS):
        pass
    assert job.state is JobState.CANCELLED
    assert list(folder.iterdir()) == []  # no file, no partial, no spool
    assert "no file was written" in dlg.status.text()
    qtbot.waitUntil(lambda: not win.jobs.busy, timeout=OPEN_TIMEOUT_MS)


def test_best_adds_the_builtin_text_after_the_users_unless_unticked(
    qtbot, make_window, llama_model, tmp_path, calib_file
):
    win = make_window()
    dlg = _dialog(qtbot, win, llama_model)
    dlg.set_method("awq+gptq")
    assert not dlg.calib_mix_check.isEnabled()  # the built-in text alone: nothing to add it to
    dlg.set_calibration(calib_file, chunks=2)
    assert dlg.calib_mix_check.isEnabled() and dlg.calib_mix_check.isChecked()
    assert dlg.calibration_sources == [str(calib_file), "builtin"]
    dlg.set_method("gptq")  # GPTQ fits what it is shown: it mixes too
    assert dlg.calib_mix_check.isEnabled() and dlg.calibration_sources == [str(calib_file), "builtin"]
    dlg.set_method("imatrix")  # the imatrix's plan gained nothing from the mix
    assert not dlg.calib_mix_check.isEnabled() and dlg.calibration_sources == str(calib_file)
    dlg.set_method("awq+gptq")
    out = tmp_path / "tiny-best.gguf"
    dlg.set_output_path(out)
    with qtbot.waitSignal(dlg.exportFinished, timeout=JOB_TIMEOUT_MS) as finished:
        assert dlg.start() is not None
    c = finished.args[0].calibration
    assert c.method == "awq+gptq" and c.dataset == f"{calib_file} + quant-studio built-in calibration text"
    assert f"of {calib_file} + quant-studio built-in calibration text" in dlg.result_label.text()
    dlg.calib_mix_check.setChecked(False)
    assert dlg.calibration_sources == str(calib_file)
