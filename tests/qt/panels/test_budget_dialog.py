"""The budget plan dialog: the front and presets are drawn, the slider moves the plan, a bad budget is one
sentence, and Use plan makes the allocation the window's plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PySide6.QtCore import Qt

from studio.core.calib.heldout import guarded_scan, preset_plans
from studio.core.model import open_model
from studio.core.plan.allocate import allocate, parse_budget
from studio.qt.jobs import JobManager
from studio.qt.panels.budget_dialog import BudgetDialog
from studio.qt.state import StudioState
from tests.scan_data import synthetic_scan

KL = {"Q2_K": 0.08, "Q3_K": 0.04, "Q4_K": 0.012, "Q6_K": 0.002, "Q8_0": 0.0005}


@pytest.fixture
def dialog(qtbot, tiny_models):
    state, jobs = StudioState(), JobManager()
    ckpt = open_model(tiny_models("llama"))
    state.set_checkpoint(ckpt)
    d = BudgetDialog(state, jobs)
    qtbot.addWidget(d)
    yield state, d
    jobs.shutdown(5000)


def _settled(qtbot, d):
    """Wait for the planning job (front, presets, plan) to end and be drawn."""
    qtbot.waitUntil(lambda: not d.planning, timeout=60_000)


def test_slider_moves_the_plan_along_the_front(dialog, qtbot):
    state, d = dialog
    assert not d.slider.isEnabled()  # nothing to choose before a scan
    scan = synthetic_scan(state.info, KL)
    d.set_scan(scan)
    _settled(qtbot, d)
    assert d.slider.isEnabled() and len(d.curve.xData) == len(d.front) >= 10
    assert {p.label for p in d.presets} >= {"Q4_K_M", "Q8_0"} and len(d.preset_dots.data) == len(d.presets)
    d.slider.setValue(2)
    _settled(qtbot, d)
    low = d.allocation
    d.slider.setValue(len(d.front) - 2)
    _settled(qtbot, d)
    high = d.allocation
    assert high.file_bytes > low.file_bytes and high.predicted_kl < low.predicted_kl
    assert f"predicted KL {high.predicted_kl:.4f}" in d.result.text()
    assert list(d.chosen_dot.data["x"]) == [high.file_bytes]
    # the core's plan for the budget, the token embedding/output kept at the same-size preset's types
    budget = parse_budget(d.budget_edit.text())
    guarded, _ = guarded_scan(state.info, scan, budget, preset_plans(state.info))
    want = allocate(state.info, guarded, budget, method="imatrix")
    assert high.plan.types == want.plan.types
    # the table lists every scanned tensor with its type, coloured by bits (more bits, another colour)
    types = {d.table.item(r, 0).text(): d.table.item(r, 1).text() for r in range(d.table.rowCount())}
    assert types == {t.name: high.plan.types[t.name] for t in scan.tensors}
    colours = {
        d.table.item(r, 1).text(): d.table.item(r, 1).background().color().name()
        for r in range(d.table.rowCount())
    }
    assert len(set(colours.values())) == len(colours) > 1


def test_bad_budget_is_one_sentence_and_use_plan_sets_the_window_plan(dialog, qtbot):
    state, d = dialog
    d.set_scan(synthetic_scan(state.info, KL))
    _settled(qtbot, d)
    d.budget_edit.setText("1kB")
    with qtbot.waitSignal(d.errorShown) as sig:
        d.replan()
    assert "the smallest plan needs" in sig.args[0] and d.allocation is None
    d.budget_edit.setText("4.5bpw")
    d.replan()
    _settled(qtbot, d)
    got = []
    state.planChanged.connect(got.append)
    d.use_button.click()
    assert got and got[-1].types == d.allocation.plan.types


def test_the_window_opens_the_dialog_for_the_open_model(make_window, tiny_models):
    win = make_window()
    assert not win.act_budget.isEnabled() and win.show_budget_dialog() is None
    win.state.set_checkpoint(open_model(tiny_models("llama")))
    assert win.act_budget.isEnabled()
    d = win.show_budget_dialog()
    assert isinstance(d, BudgetDialog) and d.isVisible() and win.show_budget_dialog() is d


# ------------------------------------------------------------------ where the KL comes from


def _show_sensitivity(qtbot, d):
    d.show()
    d.views.setCurrentIndex(1)  # the Sensitivity tab: the map and the bars get their real sizes
    qtbot.waitExposed(d)
    qtbot.wait(50)


def test_the_heat_map_has_a_cell_per_layer_and_role_with_the_scans_kl(dialog, qtbot):
    state, d = dialog
    scan = synthetic_scan(state.info, KL)
    d.set_scan(scan)
    _settled(qtbot, d)
    _show_sensitivity(qtbot, d)
    assert d.map_type.currentData() == "Q4_K"  # the default view: every tensor at Q4_K
    blocks = sorted({t.layer for t in scan.tensors if t.layer is not None})
    image = d.heat.image.image
    assert image.shape == (1 + len(blocks), len(d.heat.grid.roles))
    ticks = [label for _, label in d.heat.plot.getPlotItem().getAxis("left")._tickLevels[0]]
    assert ticks == ["other", *map(str, blocks)]
    for t in scan.tensors:
        r, c = d.heat.grid.cell_of(t.name)
        assert d.heat.grid.layers[r] == t.layer and d.heat.grid.roles[c] == t.role
        assert image[r, c] == pytest.approx(np.log10(t.by_type["Q4_K"].kl))
    assert np.isnan(image).sum() == image.size - len(scan.tensors)  # the other cells are empty
    # the bars: the N most sensitive at that type, most sensitive first
    d.top_n.setValue(5)
    top = sorted(scan.tensors, key=lambda t: -t.by_type["Q4_K"].kl)[:5]
    assert [n for n, _, _ in d.bars.rows] == [t.name for t in top]
    assert list(d.bars.bars.opts["width"]) == [t.by_type["Q4_K"].kl for t in top]
    # another type redraws both; "the plan's type" reads each tensor at the allocation's type
    d.map_type.setCurrentIndex(d.map_type.findData("Q2_K"))
    t0 = scan.tensors[0]
    assert d.heat.image.image[d.heat.grid.cell_of(t0.name)] == pytest.approx(np.log10(t0.by_type["Q2_K"].kl))
    d.map_type.setCurrentIndex(d.map_type.findData("plan"))
    want = d.allocation.plan.types
    assert [q for _, q, _ in d.bars.rows] == [want[n] for n, _, _ in d.bars.rows]
    assert d.bars.rows[0][2] == max(t.by_type[want[t.name]].kl for t in scan.tensors)


def test_a_click_on_a_cell_or_a_bar_opens_that_tensor_in_the_inspector(make_window, tiny_models, qtbot):
    win = make_window()
    win.state.set_checkpoint(open_model(tiny_models("llama")))
    assert win.panel("inspector") is not None  # built now (the rest of the pages are not needed)
    d = win.show_budget_dialog()
    scan = synthetic_scan(win.state.info, KL)
    d.set_scan(scan)
    _settled(qtbot, d)
    _show_sensitivity(qtbot, d)
    win.show_page("plan")  # not the summary: a choice there goes to the inspector by itself
    cell = d.heat.grid.cell_of("model.layers.1.self_attn.v_proj.weight")
    with qtbot.waitSignal(
        win.panel("inspector").statsShown,
        timeout=30_000,
        check_params_cb=lambda n: n.endswith("v_proj.weight"),
    ):
        qtbot.mouseClick(d.heat.plot.viewport(), Qt.MouseButton.LeftButton, pos=d.heat.cell_centre(*cell))
    assert win.state.selected_tensor == "model.layers.1.self_attn.v_proj.weight"
    assert win.tabs.currentIndex() == win.page_index("inspector")
    assert "model.layers.1.self_attn.v_proj.weight" in win.panel("inspector").title.text()
    # a click on an empty cell selects nothing
    empty = next((r, c) for r, row in enumerate(d.heat.grid.names) for c, n in enumerate(row) if n is None)
    qtbot.mouseClick(d.heat.plot.viewport(), Qt.MouseButton.LeftButton, pos=d.heat.cell_centre(*empty))
    assert win.state.selected_tensor == "model.layers.1.self_attn.v_proj.weight"
    # the third bar
    third = d.bars.rows[2][0]
    assert third != win.state.selected_tensor
    qtbot.mouseClick(d.bars.plot.viewport(), Qt.MouseButton.LeftButton, pos=d.bars.bar_centre(2))
    assert win.state.selected_tensor == third


# ------------------------------------------------------------------ predicted against measured


def test_an_exported_budget_plan_is_measured_in_a_job_and_shown_beside_the_prediction(
    dialog, qtbot, tmp_path
):
    from studio.core.calib.sensitivity import ScanSettings, measure_plans
    from studio.core.export.job import ExportOutcome
    from studio.core.export.run import export_gguf

    state, d = dialog
    d.set_scan(synthetic_scan(state.info, KL))
    d.budget_edit.setText("4.5bpw")
    d.replan()
    _settled(qtbot, d)
    a = d.allocation
    # a preset's export is not measured (it costs a job nobody asked for)
    preset = export_gguf(state.info.path, tmp_path / "q8.gguf", "Q8_0")
    state.publish_export(ExportOutcome(preset))
    assert d.task.started == 0 and d.measured_label.text() == ""
    d.use_button.click()
    res = export_gguf(state.info.path, tmp_path / "budget.gguf", state.plan)
    with qtbot.waitSignal(d.measuredShown, timeout=120_000) as sig:
        state.publish_export(ExportOutcome(res))
        assert d.running and not d.measure_button.isEnabled() and d.cancel_button.isEnabled()
    m = sig.args[0]
    (want,) = measure_plans(state.info.path, [dict(a.plan.types)], "builtin", ScanSettings())
    assert m.measured_kl == pytest.approx(want, rel=1e-4) and m.measured_kl > 0
    assert m.predicted_kl == pytest.approx(a.predicted_kl) and m.file_bytes == res.file_bytes
    text = d.measured_label.text()
    assert text.startswith("budget.gguf:")
    assert f"predicted KL {a.predicted_kl:.4f}, measured {m.measured_kl:.4f}" in text
    assert list(d.measured_dot.data["x"]) == [res.file_bytes]
    assert list(d.measured_dot.data["y"]) == pytest.approx([np.log10(m.measured_kl)])  # a log axis
    assert not d.running and d.measure_button.isEnabled()


def test_a_measurement_can_be_cancelled_and_shows_nothing(dialog, qtbot):
    state, d = dialog
    d.set_scan(synthetic_scan(state.info, KL))
    _settled(qtbot, d)
    d.measure_plan()
    assert d.running and d.cancel_button.isEnabled()
    d.cancel_button.click()
    qtbot.waitUntil(lambda: not d.running, timeout=60_000)
    assert d.measured is None and d.measured_label.text() == "" and d.status.text() == "Cancelled."
    assert list(d.measured_dot.data["x"]) == [] and d.measure_button.isEnabled()


# ------------------------------------------------------------------ the scan reuses what is there


@pytest.fixture
def counted_calibrations(monkeypatch, tmp_path):
    """Every call of the core's ``calibrate`` (the page's, the scan's, the dialog's), over an empty cache."""
    import importlib

    cal = importlib.import_module(
        "studio.core.calib.calibrate"
    )  # the module (the package exports the function)

    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    calls: list[object] = []
    real = cal.calibrate

    def counting(*args, **kwargs):
        calls.append(args[1] if len(args) > 1 else kwargs.get("text"))
        return real(*args, **kwargs)

    # the module, and each module that imports the function at its top: the page, the scan pipeline
    for name in (
        "studio.core.calib.calibrate",
        "studio.qt.panels.calibrate_panel",
        "studio.core.calib.pipeline",
    ):
        module = importlib.import_module(name)
        assert module.calibrate is real
        monkeypatch.setattr(module, "calibrate", counting)
    return calls


def _scanned(qtbot, d):
    d.start_scan()
    qtbot.waitUntil(lambda: not d.running and not d.planning, timeout=300_000)
    assert d.scan is not None, d.status.text()
    assert d.allocation is not None and len(d.front) > 1


def test_opened_after_calibrate_with_the_same_text_the_scan_calibrates_nothing(
    qtbot, tiny_models, counted_calibrations
):
    from studio.qt.panels.calibrate_panel import CalibratePanel

    state, jobs = StudioState(), JobManager()
    state.set_checkpoint(open_model(tiny_models("llama")))
    page = CalibratePanel(state, jobs)
    qtbot.addWidget(page)
    page.set_run(ctx=64, chunks=2)
    with qtbot.waitSignal(page.calibrated, timeout=120_000):
        assert page.start() is not None
    assert len(counted_calibrations) == 1
    d = BudgetDialog(state, jobs)
    qtbot.addWidget(d)
    d.show()
    _scanned(qtbot, d)
    assert len(counted_calibrations) == 1  # the scan ran on the page's importance matrix
    assert not d.calibrated and d.imatrix is state.calibration.imatrix
    assert (d.scan_settings.calib_ctx, d.scan_settings.calib_chunks) == (64, 2)  # the page's chunks
    assert "without calibrating" in d.status.text()
    # again in this window: the kept scan, no job at all
    started = d.task.started
    d.start_scan()
    assert d.task.started == started and d.scan is not None
    jobs.shutdown(10_000)


def test_without_calibrate_the_first_scan_calibrates_and_the_next_dialog_uses_the_clis_cache(
    qtbot, tiny_models, counted_calibrations, tmp_path
):
    model = tiny_models("llama")
    for round_ in range(2):  # two sessions of the window: nothing in memory is shared
        state, jobs = StudioState(), JobManager()
        state.set_checkpoint(open_model(model))
        d = BudgetDialog(state, jobs)
        qtbot.addWidget(d)
        _scanned(qtbot, d)
        assert d.calibrated == (round_ == 0)
        assert len(counted_calibrations) == 1
        assert len(list((tmp_path / "cache" / "sensitivity").glob("imatrix-*.gguf"))) == 1  # the CLI's file
        jobs.shutdown(10_000)


# ------------------------------------------------------------------ fields, axes, names, buttons


def test_enter_in_the_exclusion_field_replans_without_scanning(dialog, qtbot):
    state, d = dialog
    d.show()
    d.set_scan(synthetic_scan(state.info, KL))
    _settled(qtbot, d)
    d.budget_edit.setText("7bpw")
    d.replan()
    _settled(qtbot, d)
    assert "Q8_0" in set(d.allocation.plan.types.values())
    started, front = d.task.started, d.front
    d.exclude_edit.setFocus()
    d.exclude_edit.setText("Q8_0")
    d.exclude_edit.setModified(True)  # as typed
    qtbot.keyClick(d.exclude_edit, Qt.Key.Key_Return)
    assert d.planning  # the plan is made in a job; the GUI thread went on at once
    _settled(qtbot, d)
    assert d.task.started == started and not d.running  # no scan started
    assert d.front != front and "Q8_0" not in set(d.allocation.plan.types.values())


def test_replanning_leaves_the_gui_thread_at_once(dialog, qtbot):
    import time

    state, d = dialog
    d.set_scan(synthetic_scan(state.info, KL))
    _settled(qtbot, d)
    for text in ("3.5bpw", "4.5bpw", "6bpw"):
        d.budget_edit.setText(text)
        t0 = time.perf_counter()
        d.replan()
        assert time.perf_counter() - t0 < 0.1 and d.planning
        _settled(qtbot, d)
        assert d.allocation.budget.text == text


def test_every_field_is_labelled_axes_have_units_names_are_full_and_close_closes(dialog, qtbot):
    from PySide6.QtWidgets import QLabel

    state, d = dialog
    d.show()
    buddies = {lab.buddy(): lab.text() for lab in d.findChildren(QLabel) if lab.buddy() is not None}
    for w in (d.text_edit, d.exclude_edit, d.budget_edit, d.slider, d.map_type, d.top_n):
        assert buddies.get(w), f"{w.placeholderText() if hasattr(w, 'placeholderText') else w} has no label"
    assert buddies[d.exclude_edit].replace("&", "") == "Types not to choose:"
    scan = synthetic_scan(state.info, KL)
    d.set_scan(scan)
    _settled(qtbot, d)
    item = d.plot.getPlotItem()
    assert item.getAxis("left").labelText == "KL divergence (nats per token)"
    assert (
        item.getAxis("bottom").labelText == "file size (MB)"
        and item.getAxis("top").labelText == "bits per weight"
    )
    lo, hi = d.front[0], d.front[-1]
    assert d.bpw_axis.bpw(lo.file_bytes) == pytest.approx(lo.bpw, abs=0.05)
    assert d.bpw_axis.bpw(hi.file_bytes) == pytest.approx(hi.bpw, abs=0.05)
    ticks = d.size_axis.tickStrings([2e6, 4e6], 1.0, 2e6)
    assert ticks == ["2", "4"]  # bytes shown in MB
    names = [d.table.item(r, 0).text() for r in range(d.table.rowCount())]
    assert names == [t.name for t in scan.tensors]  # Hugging Face names, whole
    assert "model.layers.1.self_attn.v_proj.weight" in names
    d.views.setCurrentIndex(2)
    qtbot.wait(20)
    fm = d.table.fontMetrics()
    longest = max(names, key=len)
    assert d.table.columnWidth(0) >= fm.horizontalAdvance(longest)  # never cut to "model.layers…"
    d.top_n.setValue(3)
    d.redraw_sensitivity()
    labels = [t for _, t in d.bars.plot.getPlotItem().getAxis("left")._tickLevels[0]]
    assert labels == [f"{n} @ {q}" for n, q, _ in d.bars.rows]  # Hugging Face names, as elsewhere
    d.close_button.click()
    assert not d.isVisible()


# ------------------------------------------------------------------ held-out judgement


def test_presets_sit_on_the_heldout_axis_and_a_losing_plan_says_so(dialog, qtbot):
    from studio.core.calib.data import CalibrationText
    from studio.core.calib.heldout import measure_heldout, preset_heldout_points
    from studio.core.factory import sample_text

    state, d = dialog
    held = CalibrationText("held-out sample", "\n".join(reversed(sample_text().splitlines())))
    points = preset_heldout_points(
        state.info.path, state.info, held, imatrix=None, presets=("Q4_K_M", "Q8_0")
    )
    # a scan that calls Q4_0 nearly free and Q8_0 costly: where the Q8_0 file fits, the plan is all Q4_0
    d.set_scan(synthetic_scan(state.info, {"Q4_0": 1e-5, "Q8_0": 1e-2}), None, held, points)
    assert [p.name for p in points] == ["Q4_K_M", "Q8_0"] and all(p.heldout_kl > 0 for p in points)
    # llama.cpp's presets on the held-out axis, labelled, before any plan is measured
    assert list(d.heldout_preset_dots.data["x"]) == [p.file_bytes for p in points]
    assert list(d.heldout_preset_dots.data["y"]) == pytest.approx([np.log10(p.heldout_kl) for p in points])
    _settled(qtbot, d)
    assert {lbl.toPlainText() for lbl in d.preset_labels} >= {"Q4_K_M", "Q8_0"}
    q8 = next(p for p in points if p.name == "Q8_0")
    d.budget_edit.setText(str(q8.file_bytes + 4096))
    d.replan()
    _settled(qtbot, d)
    a = d.allocation
    with qtbot.waitSignal(d.measuredShown, timeout=120_000) as sig:
        d.measure_button.click()
    m = sig.args[0]
    j = m.judgement
    (want,), _ = measure_heldout(state.info.path, [dict(a.plan.types)], held, imatrix=None)
    assert j.heldout_kl == pytest.approx(want, rel=1e-4) and j.preset.name == "Q8_0"
    assert j.beats_preset is False and j.heldout_kl > q8.heldout_kl
    # held-out KL beside the predicted one, and the one sentence recommending the preset with calibrated rounding
    text = d.measured_label.text()
    assert f"predicted KL {a.predicted_kl:.4f}" in text and f"Held-out KL {j.heldout_kl:.4f}." in text
    assert "No budget plan beats llama.cpp's Q8_0" in text and "--preset Q8_0 --method awq+gptq" in text
    # llama.cpp has the last word (issue 37): its own KL of the plan's file beside the same-size preset's
    w = m.llama
    assert w is not None and w.preset == "Q8_0" and w.tokens > 0 and w.preset_kl is not None
    assert math.isfinite(w.file_kl) and w.sentence in text and "llama.cpp measures the file at KL" in text
    assert list(d.heldout_dot.data["x"]) == [m.file_bytes]
    assert list(d.heldout_dot.data["y"]) == pytest.approx([np.log10(j.heldout_kl)])


def test_the_dialog_shows_the_whole_scans_estimate(dialog):
    """Before a scan: its whole run's peak and time, step by step (issue 40), not the calibration's alone."""
    _state, d = dialog
    d.update_controls()
    text = d.estimate_label.text()
    assert text.startswith("Scanning: about ") and "at its peak (" in text and "chunks of 512 tokens" in text
    for step in ("the calibration ", "the scan ", "the held-out judgement "):
        assert step in text, text


def test_a_scan_with_a_nan_is_refused_in_one_sentence_naming_tensor_and_type(dialog, qtbot):
    # issue 37: a NaN taken as a cost made a candidate look free; the dialog plans nothing from it
    import dataclasses

    state, d = dialog
    scan = synthetic_scan(state.info, {"Q4_0": 0.02, "Q8_0": 0.0005})
    t = scan.tensors[1]
    bad = dataclasses.replace(
        t, by_type={**t.by_type, "Q4_0": dataclasses.replace(t.by_type["Q4_0"], kl=math.nan)}
    )
    with qtbot.waitSignal(d.errorShown, timeout=60_000) as sig:
        d.set_scan(dataclasses.replace(scan, tensors=(scan.tensors[0], bad, *scan.tensors[2:])))
    _settled(qtbot, d)
    message = sig.args[0]
    assert f"{t.name} at Q4_0" in message and "\n" not in message and "Traceback" not in message
    assert d.allocation is None and not d.use_button.isEnabled() and not d.measure_button.isEnabled()
    # a plan handed to the window from it would carry the NaN: nothing is measured either
    d.measure_plan()
    assert not d.running and d.measured is None


def test_the_judge_names_the_preset_whose_file_is_the_budget_an_i_quant_too(dialog, qtbot, monkeypatch):
    # issue 37 Build 6 in the window: the scan measured a few K-quant presets on the held-out text; a budget
    # of llama.cpp's IQ4_XS file is judged against IQ4_XS (measured then), not the next K-quant below it
    from studio.core.calib.data import CalibrationText
    from studio.core.calib.heldout import preset_heldout_points, same_size_preset
    from studio.core.evaluate import last_word as lw
    from studio.core.factory import sample_text

    state, d = dialog
    monkeypatch.setattr(lw, "llama_kl", lambda path, *a, **k: (0.01, k["max_tokens"]))  # llama.cpp stubbed
    held = CalibrationText("held-out sample", "\n".join(reversed(sample_text().splitlines())))
    points = preset_heldout_points(state.info.path, state.info, held, imatrix=None, presets=("Q8_0",))
    pres = preset_plans(state.info)
    name, nbytes = next(
        (n, b) for n, b, _ in pres if n in ("IQ4_XS", "Q4_K_S") and same_size_preset(pres, b)[0] == n
    )
    d.set_scan(synthetic_scan(state.info, KL), None, held, points)
    d.budget_edit.setText(str(nbytes))
    d.replan()
    _settled(qtbot, d)
    with qtbot.waitSignal(d.measuredShown, timeout=120_000) as sig:
        d.measure_button.click()
    m = sig.args[0]
    assert m.judgement.preset is not None and m.judgement.preset.name == name and m.llama.preset == name
    assert f"llama.cpp's {name}" in d.measured_label.text()
