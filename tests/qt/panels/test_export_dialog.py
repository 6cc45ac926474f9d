"""The Export dialog over real factory models: progress, cancel, a verified Q8_0 export, the current plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt

from studio.core.hardware import Backend, GpuInfo
from studio.qt.jobs import JobState
from studio.qt.panels.device_selector import device_choices
from studio.qt.panels.export_dialog import CURRENT_PLAN, ExportDialog
from studio.qt.settings import OUTPUT_DIR_KEY

OPEN_TIMEOUT_MS = 60_000
EXPORT_TIMEOUT_MS = 240_000  # includes verification: torch, transformers and a llama.cpp child start


def _open(qtbot, win, path: Path) -> None:
    assert win.open_path(path) is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)


def _gguf_types(path: Path) -> dict[str, str]:
    """Tensor name → type name, read with gguf-py (independently of studio.core)."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_export_is_in_the_file_menu_with_ctrl_e_and_needs_a_checkpoint(qtbot, make_window, llama_model):
    from PySide6.QtGui import QKeySequence

    win = make_window()
    assert win.act_export.shortcut() == QKeySequence("Ctrl+E")
    assert win.act_export in win.file_menu.actions()
    assert not win.act_export.isEnabled()
    assert win.show_export_dialog() is None  # nothing open: no dialog, a status message instead
    _open(qtbot, win, llama_model)
    assert win.act_export.isEnabled()
    win.act_export.trigger()
    dlg = win._export_dialog
    assert isinstance(dlg, ExportDialog) and dlg.isVisible()
    assert dlg.verify_check.isChecked()  # verification is on by default
    # the dialog offers the window's devices and starts on the one chosen there
    offered = [dlg.device_combo.itemData(i) for i in range(dlg.device_combo.count())]
    assert (
        offered == [d for d, _ in device_choices(win.state.hardware)]
        and dlg.device == win.device_selector.device
    )
    assert dlg.backend == "studio"
    # The plan edited on the Plan page is offered first and chosen.
    assert dlg.plan_combo.currentData() == CURRENT_PLAN
    assert dlg.chosen_plan() is win.state.plan
    assert dlg.output_path is not None and dlg.output_path.suffix == ".gguf"
    dlg.close()
    # with a GPU in the window's device list, choosing it there is what the dialog starts on
    qtbot.waitUntil(lambda: win.state.hardware is not None, timeout=OPEN_TIMEOUT_MS)  # detected off-thread
    hw = win.state.hardware
    gpu = GpuInfo(0, "Test GPU", Backend.CUDA, 8 << 30, 6 << 30)
    win.state.set_hardware(dataclasses.replace(hw, gpus=(gpu,)))
    assert win.device_selector.set_device("cuda:0")
    assert win.show_export_dialog().device == "cuda:0"
    win.state.set_hardware(hw)


def test_cancel_leaves_no_file_and_the_window_still_answers(qtbot, make_window, llama_model, tmp_path):
    win = make_window()
    _open(qtbot, win, llama_model)
    dlg = win.show_export_dialog()
    out = tmp_path / "out" / "cancelled.gguf"
    out.parent.mkdir()
    dlg.set_plan_choice("Q8_0")
    dlg.set_output_path(out)
    assert dlg.verify_check.isChecked()
    seen: list[int] = []
    dlg.progress.valueChanged.connect(seen.append)

    # Rapid clicks start one export only (FAULTS 50).
    for _ in range(3):
        qtbot.mouseClick(dlg.export_button, Qt.MouseButton.LeftButton)
    exports = [j for j in win.jobs.history() if j.kind == "export"]
    assert len(exports) == 1 and dlg.job is exports[0]
    assert not dlg.export_button.isEnabled() and dlg.cancel_button.isEnabled()

    # Progress moves (the export phase reports per tensor), then Cancel: whether it lands while
    # tensors are written or while the partial file is verified, no file may remain.
    qtbot.waitUntil(lambda: dlg.progress.value() > 0, timeout=OPEN_TIMEOUT_MS)
    assert dlg.job.active
    qtbot.mouseClick(dlg.cancel_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(dlg.exportCancelled, timeout=EXPORT_TIMEOUT_MS):
        pass
    assert dlg.job.state is JobState.CANCELLED
    assert seen and max(seen) > 0
    assert _leftovers(out.parent) == []  # neither the .gguf nor its .partial
    assert "cancelled" in dlg.status.text().lower()
    assert dlg.progress.value() == 0
    assert dlg.export_button.isEnabled() and not dlg.cancel_button.isEnabled()

    # The window still answers: selecting a tensor updates the tensor panel at once.
    name = "model.layers.1.mlp.down_proj.weight"
    win.state.select_tensor(name)
    assert win.tensor_panel.values["Name"].text() == name
    qtbot.waitUntil(lambda: not win.jobs.busy, timeout=OPEN_TIMEOUT_MS)


def test_a_q8_0_export_writes_the_file_and_shows_the_verification(qtbot, make_window, llama_model, tmp_path):
    win = make_window()
    # the chat and evaluation pages are built lazily: build them now, so the result must reach them
    chat, ev = win.panel("chat"), win.panel("evaluate")
    assert chat is not None and ev is not None
    _open(qtbot, win, llama_model)
    dlg = win.show_export_dialog()
    out = tmp_path / "tiny-Q8_0.gguf"
    dlg.set_plan_choice("Q8_0")
    dlg.set_output_path(out)
    values: list[int] = []
    dlg.progress.valueChanged.connect(values.append)
    with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS) as finished:
        assert dlg.start() is not None
    outcome = finished.args[0]
    assert out.is_file() and not out.with_name(out.name + ".partial").exists()
    assert outcome.result.path == out and outcome.result.file_bytes == out.stat().st_size

    # Every quantizable weight matrix is Q8_0 in the file; norms stay F32.
    types = _gguf_types(out)
    assert types["blk.0.ffn_down.weight"] == "Q8_0"
    assert types["blk.1.attn_q.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == "F32"

    # The progress bar moved through intermediate values and ended full.
    assert any(0 < v < 1000 for v in values) and dlg.progress.value() == 1000
    v = outcome.verification
    assert outcome.verify_error == "" and v is not None
    assert v.n_tokens > 10
    assert 0.8 <= v.top1_agreement <= 1.0  # Q8_0 of a tiny random model: nearly the same arg-max
    assert 0.0 <= v.mean_kl < 0.05
    text = dlg.result_label.text()
    assert f"top-1 agreement {100 * v.top1_agreement:.1f} %" in text
    assert f"mean KL divergence {v.mean_kl:.3g}" in text
    assert out.name in dlg.status.text()
    # The window's status bar repeats the outcome, and the output folder is remembered.
    assert "top-1 agreement" in win.statusBar().currentMessage()
    assert Path(win.settings.export_folder) == tmp_path
    # The new file joins the chat (next to the original) and the evaluation as a variant.
    assert [c.path for c in chat.columns] == [llama_model, out]
    assert [str(v) for v in ev.variants()] == [str(out)]


def test_the_current_plan_from_the_plan_editor_is_exported_tensor_by_tensor(
    qtbot, make_window, llama_model, tmp_path
):
    from studio.core.gguf.layout import layout

    win = make_window()
    _open(qtbot, win, llama_model)
    editor = win.panel("plan")
    editor.apply_uniform("Q4_0")
    editor.apply_regex(r"layers\.0\.", "Q8_0")
    plan = win.state.plan
    assert {"Q4_0", "Q8_0"} <= set(plan.types.values())

    dlg = win.show_export_dialog()
    assert dlg.plan_combo.currentData() == CURRENT_PLAN and dlg.chosen_plan() is plan
    dlg.verify_check.setChecked(False)
    out = tmp_path / "mixed.gguf"
    dlg.set_output_path(out)
    with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS) as finished:
        dlg.start()
    assert finished.args[0].verification is None
    assert dlg.result_label.text() == "Not verified."
    types = _gguf_types(out)
    for tm in layout(win.state.info).tensors:
        assert types[tm.gguf_name] == plan.types[tm.hf_name], tm.gguf_name
    assert types["blk.0.ffn_up.weight"] == "Q8_0" and types["blk.1.ffn_up.weight"] == "Q4_0"


def test_a_missing_folder_or_a_failing_export_is_one_sentence(qtbot, make_window, llama_model, tmp_path):
    import torch

    win = make_window()
    _open(qtbot, win, llama_model)
    dlg = win.show_export_dialog()
    dlg.set_output_path(tmp_path / "nowhere" / "x.gguf")
    assert dlg.start() is None
    assert "does not exist" in dlg.status.text() and "\n" not in dlg.status.text()
    assert not [j for j in win.jobs.history() if j.kind == "export"]

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA to make the core refuse the device")
    dlg.device_combo.addItem("CUDA 0 (not present)", "cuda:0")
    assert dlg.set_device("cuda:0")
    folder = tmp_path / "out"
    folder.mkdir()
    dlg.set_output_path(folder / "x.gguf")
    with qtbot.waitSignal(dlg.exportFailed, timeout=OPEN_TIMEOUT_MS) as failed:
        dlg.start()
    message = failed.args[0]
    assert "CUDA" in message and "\n" not in message
    assert dlg.status.text() == message
    assert _leftovers(folder) == []


def test_the_output_folder_is_remembered_for_the_next_window(
    qtbot, make_window, llama_model, tmp_path, settings_path
):
    folder = tmp_path / "exports"
    folder.mkdir()
    QSettings(str(settings_path), QSettings.Format.IniFormat).setValue(OUTPUT_DIR_KEY, str(folder))
    win = make_window()
    _open(qtbot, win, llama_model)
    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q6_K")
    assert dlg.output_path == folder / f"{llama_model.name}-Q6_K.gguf"
    dlg.set_plan_choice("Q8_0")  # the name follows the preset until the user types a path
    assert dlg.output_path == folder / f"{llama_model.name}-Q8_0.gguf"
    dlg.set_output_path(folder / "mine.gguf")
    dlg.set_plan_choice("Q6_K")
    assert dlg.output_path == folder / "mine.gguf"


def test_the_llama_cpp_back_end_writes_the_same_types(qtbot, make_window, llama_model, tmp_path):
    win = make_window()
    _open(qtbot, win, llama_model)
    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q8_0")
    dlg.set_backend("llama.cpp")
    dlg.verify_check.setChecked(False)
    out = tmp_path / "out" / "llamacpp-Q8_0.gguf"
    out.parent.mkdir()
    dlg.set_output_path(out)
    with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS) as finished:
        dlg.start()
    result = finished.args[0].result
    assert result.backend == "llama.cpp"
    types = _gguf_types(out)
    assert types == dict(result.tensor_types)
    assert types["blk.0.ffn_down.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert _leftovers(out.parent) == [out.name]  # the F32 intermediate is gone
    assert win.settings.export_backend == "llama.cpp"


def test_cancel_during_verification_stops_the_child_and_leaves_no_file(
    qtbot, make_window, llama_model, tmp_path
):
    import multiprocessing

    win = make_window()
    _open(qtbot, win, llama_model)
    dlg = win.show_export_dialog()
    out = tmp_path / "out" / "verify-cancelled.gguf"
    out.parent.mkdir()
    dlg.set_plan_choice("Q8_0")
    dlg.set_output_path(out)
    job = dlg.start()
    # The tensors are written (up to 80 %), then the partial file is checked in a child process.
    qtbot.waitUntil(lambda: dlg.progress.value() >= 800 or not job.active, timeout=EXPORT_TIMEOUT_MS)
    assert job.active, dlg.status.text()
    qtbot.waitUntil(
        lambda: any(p.name == "studio-verify" for p in multiprocessing.active_children()), timeout=10_000
    )
    assert job.active
    with qtbot.waitSignal(dlg.exportCancelled, timeout=30_000):
        dlg.cancel_button.click()
    assert _leftovers(out.parent) == []
    qtbot.waitUntil(
        lambda: not any(p.name == "studio-verify" for p in multiprocessing.active_children()), timeout=10_000
    )


def test_a_quantized_gguf_opens_for_export_with_its_warning_and_is_requantized_and_verified(
    qtbot, make_window, llama_model, tmp_path
):
    from studio.core.export.run import export_gguf

    folder = tmp_path / "models"
    folder.mkdir()
    src = export_gguf(llama_model, folder / "tiny-Q8_0.gguf", "Q8_0").path
    win = make_window()
    _open(qtbot, win, src)
    assert win.act_export.isEnabled()  # a GGUF original is requantized
    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q4_K_M")
    assert "Stored as Q8_0" in dlg.plan_info.text() and "already quantized" in dlg.plan_info.text()
    out = folder / "requantized.gguf"
    dlg.set_output_path(out)
    with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS) as finished:
        assert dlg.start() is not None
    outcome = finished.args[0]
    assert _gguf_types(out)["blk.0.attn_q.weight"] == "Q4_K"
    v = outcome.verification  # both files run in llama.cpp: the original is a GGUF
    assert outcome.verify_error == "" and v is not None and 0.5 <= v.top1_agreement <= 1.0
    assert _leftovers(folder) == ["requantized.gguf", "tiny-Q8_0.gguf"]  # no partial files left


def test_the_calibrate_pages_imatrix_is_what_the_export_quantizes_with(
    qtbot, make_window, llama_model, tmp_path
):
    from gguf import GGUFReader

    from studio.core.export.run import export_gguf
    from studio.core.factory import sample_text

    win = make_window()
    _open(qtbot, win, llama_model)
    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    cal = win.panel("calibrate")
    cal.set_text("text", text)
    cal.set_run(ctx=64, chunks=2, device="cpu")
    with qtbot.waitSignal(cal.calibrated, timeout=120_000):
        cal.run_button.click()
    im = win.state.imatrix
    assert im is not None
    dlg = win.show_export_dialog()
    assert dlg.imatrix_check.isEnabled() and dlg.imatrix is im
    files = {}
    for with_im in (True, False):
        dlg.imatrix_check.setChecked(with_im)
        dlg.verify_check.setChecked(False)
        dlg.set_plan_choice("Q4_K_M")
        files[with_im] = out = tmp_path / f"with-{with_im}.gguf"
        dlg.set_output_path(out)
        with qtbot.waitSignal(dlg.exportFinished, timeout=EXPORT_TIMEOUT_MS):
            assert dlg.start() is not None
    ref = export_gguf(llama_model, tmp_path / "core.gguf", "Q4_K_M", imatrix=im).path

    def tensors(p: Path) -> dict[str, bytes]:
        return {t.name: bytes(t.data.tobytes()) for t in GGUFReader(str(p)).tensors}

    def keys(p: Path) -> set[str]:
        return {k for k in GGUFReader(str(p)).fields if k.startswith("quantize.imatrix.")}

    assert tensors(files[True]) == tensors(ref)  # the window's export is the core's with that imatrix
    assert tensors(files[False])["blk.0.ffn_down.weight"] != tensors(ref)["blk.0.ffn_down.weight"]
    assert "quantize.imatrix.chunks_count" in keys(files[True]) and not keys(files[False])
