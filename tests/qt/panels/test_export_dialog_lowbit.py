"""The Export dialog and the Plan tab offer llama-quantize's low-bit presets (issue 24); a preset that needs an
importance matrix shows the requirement before export and is refused, with nothing written, until the
method calibrates."""

from __future__ import annotations

from pathlib import Path

from studio.core.plan.presets import PRESETS

OPEN_TIMEOUT_MS = 60_000
LOW_BIT = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M"]
LOW_BIT += ["IQ4_NL", "IQ4_XS", "Q2_K_S", "TQ1_0", "TQ2_0", "Q1_0", "Q2_0", "MXFP4_MOE"]


def _open(qtbot, win, path: Path) -> None:
    assert win.open_path(path) is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)


def test_the_low_bit_presets_are_offered_and_the_imatrix_requirement_shows(
    qtbot, make_window, llama_model, tmp_path
):
    win = make_window()
    _open(qtbot, win, llama_model)
    # (the Plan tab's menu lists every PRESETS entry: test_plan_editor.py's presets-and-uniform test)
    assert set(LOW_BIT) <= set(PRESETS)
    dlg = win.show_export_dialog()
    offered = [dlg.plan_combo.itemData(i) for i in range(dlg.plan_combo.count())]
    assert set(LOW_BIT) <= set(offered) and set(offered) >= set(PRESETS)

    out = tmp_path / "out" / "iq2.gguf"
    out.parent.mkdir()
    dlg.set_output_path(out)
    dlg.set_method("rtn")
    dlg.set_plan_choice("Q4_K_M")
    assert not dlg.requirement.isVisible() and dlg.imatrix_requirement() == ""
    dlg.set_plan_choice("IQ2_XXS")
    text = dlg.imatrix_requirement()
    assert dlg.requirement.isVisibleTo(dlg) and dlg.requirement.text() == text
    assert text.startswith(
        "IQ2_XXS needs an importance matrix for 12 tensors at IQ2_XXS (blk.0.ffn_down.weight"
    )
    assert "calibrate" in text and "Calibrate page" in text
    # Export refuses at once, with the same sentence, and writes nothing
    assert dlg.start() is None
    assert dlg.status.text().startswith("IQ2_XXS needs an importance matrix")
    assert list(out.parent.iterdir()) == []
    # a calibrated method makes its own importance matrix: the requirement goes away
    dlg.set_method("imatrix")
    assert dlg.imatrix_requirement() == "" and not dlg.requirement.isVisibleTo(dlg)
    # IQ3_S and IQ4_XS need none
    dlg.set_method("rtn")
    for preset in ("IQ3_S", "IQ4_XS", "TQ2_0", "Q2_0", "MXFP4_MOE"):
        dlg.set_plan_choice(preset)
        assert dlg.imatrix_requirement() == "", preset
    dlg.close()


def test_the_requirement_is_worked_out_once_per_choice_not_on_every_ask(
    qtbot, make_window, llama_model, monkeypatch
):
    # start() and update_controls() ask for it again: each time made the preset's plan again on the GUI
    # thread (~20 ms each, three times per Export click)
    from studio.qt.panels import export_dialog

    win = make_window()
    _open(qtbot, win, llama_model)
    dlg = win.show_export_dialog()
    dlg.set_method("rtn")
    made: list[str] = []
    real = export_dialog.plan_from_preset

    def counting(info, preset, **kw):
        made.append(preset)
        return real(info, preset, **kw)

    monkeypatch.setattr(export_dialog, "plan_from_preset", counting)
    dlg.set_plan_choice("IQ2_XXS")
    text = dlg.imatrix_requirement()
    dlg.update_controls()
    assert dlg.imatrix_requirement() == text and text.startswith("IQ2_XXS needs an importance matrix")
    assert made == ["IQ2_XXS"]
    dlg.set_plan_choice("Q4_K_M")  # another choice is worked out again, and its sentence shown
    assert dlg.imatrix_requirement() == "" and not dlg.requirement.isVisibleTo(dlg)
    assert made == ["IQ2_XXS", "Q4_K_M"]
    dlg.close()
