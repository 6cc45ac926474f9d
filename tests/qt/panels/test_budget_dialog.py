"""The budget plan dialog: the front and presets are drawn, the slider moves the plan, a bad budget is one
sentence, and Use plan makes the allocation the window's plan."""

from __future__ import annotations

import pytest

from studio.core.model import open_model
from studio.core.quant.allocate import allocate, parse_budget
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


def test_slider_moves_the_plan_along_the_front(dialog):
    state, d = dialog
    assert not d.slider.isEnabled()  # nothing to choose before a scan
    scan = synthetic_scan(state.info, KL)
    d.set_scan(scan)
    assert d.slider.isEnabled() and len(d.curve.xData) == len(d.front) >= 10
    assert {p.label for p in d.presets} >= {"Q4_K_M", "Q8_0"} and len(d.preset_dots.data) == len(d.presets)
    d.slider.setValue(2)
    low = d.allocation
    d.slider.setValue(len(d.front) - 2)
    high = d.allocation
    assert high.file_bytes > low.file_bytes and high.predicted_kl < low.predicted_kl
    assert f"predicted KL {high.predicted_kl:.4f}" in d.result.text()
    assert list(d.chosen_dot.data["x"]) == [high.file_bytes]
    want = allocate(state.info, scan, parse_budget(d.budget_edit.text()), method="imatrix")
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
    d.budget_edit.setText("1kB")
    with qtbot.waitSignal(d.errorShown) as sig:
        d.replan()
    assert "the smallest plan needs" in sig.args[0] and d.allocation is None
    d.budget_edit.setText("4.5bpw")
    d.replan()
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
