"""The window's export of a budget plan waits for llama.cpp's verdict, as ``export --budget`` does (issue 37):
a file measured worse than promised is not written, the dialog says so in one sentence and offers the
same-size preset or "Keep anyway", which writes the file labelled. llama.cpp's measurement is stubbed at the
core seam (``last_word.llama_kl``), as in the command line's tests."""

from __future__ import annotations

import pytest

from studio.core.model import open_model
from studio.qt.jobs import JobState
from studio.qt.panels.export_dialog import CURRENT_PLAN
from tests.llama_verdict import stub_llama_kl
from tests.scan_data import synthetic_scan

KL = {"Q2_K": 0.08, "Q3_K": 0.04, "Q4_K": 0.012, "Q6_K": 0.002, "Q8_0": 0.0005}
TIMEOUT_MS = 120_000


@pytest.fixture
def dialogs(open_budget_export):
    return open_budget_export("llama")


def _use_budget_plan(qtbot, state, budget):
    """Scan (synthetic), plan for 4.5 bpw and hand the plan to the window as "Use plan" does."""
    budget.set_scan(synthetic_scan(state.info, KL))
    budget.budget_edit.setText("4.5bpw")
    budget.replan()
    qtbot.waitUntil(lambda: not budget.planning, timeout=TIMEOUT_MS)
    budget.use_button.click()
    assert state.plan is budget.allocation.plan
    return budget.allocation


def _export(qtbot, export, out, choice=CURRENT_PLAN):
    export.set_plan_choice(choice)
    export.set_method("rtn")
    export.verify_check.setChecked(False)
    export.set_output_path(out)
    assert export.start() is not None
    qtbot.waitUntil(lambda: not export.running, timeout=TIMEOUT_MS)


def test_a_budget_file_worse_than_promised_is_not_written_and_keep_anyway_writes_it_labelled(
    dialogs, qtbot, tmp_path, monkeypatch
):
    state, budget, export = dialogs
    seen = stub_llama_kl(monkeypatch, lambda p: 30.0 if p.endswith(".partial") else 1.0)  # the file
    _use_budget_plan(qtbot, state, budget)
    out = tmp_path / "out" / "budget.gguf"
    out.parent.mkdir()
    failed = []
    export.exportFailed.connect(failed.append)
    _export(qtbot, export, out)
    # no file, no partial; measured before the rename, beside the preset
    assert not out.exists() and list(out.parent.iterdir()) == []
    assert seen and seen[0].endswith("budget.gguf.partial") and len(seen) == 2
    preset = state.plan_check.preset
    assert preset is not None  # llama.cpp's same-size preset (its i-quants included) is compared
    assert (
        f"llama.cpp measures its file and llama.cpp's {preset} before it is written"
        in export.plan_info.text()
    )
    text = export.status.text()
    assert text.startswith("No file was written: llama.cpp measures the file at KL 30.0000")
    assert (
        f"above llama.cpp's {preset} (1.0000)" in text
        and f"export llama.cpp's {preset} with awq+gptq" in text
    )
    assert "--keep-if-worse" not in text and "\n" not in text and failed == [text]
    assert export.outcome is None and export.refused is not None and not export.refused.ok
    # the Jobs panel shows the refused export as failed with the same sentence, never as succeeded
    assert export.job.state is JobState.FAILED and export.job.error == text
    assert not export.keep_anyway_button.isHidden() and export.keep_anyway_button.isEnabled()
    assert not export.recommend_button.isHidden() and preset in export.recommend_button.text()
    # Keep anyway: exported and measured again, kept, labelled in the dialog and in the outcome
    export.keep_anyway_button.click()
    qtbot.waitUntil(lambda: not export.running, timeout=TIMEOUT_MS)
    assert out.is_file() and [p.name for p in out.parent.iterdir()] == ["budget.gguf"]
    o = export.outcome
    assert o is not None and o.kept_anyway and o.last_word.file_kl == 30.0
    assert export.status.text().startswith("KEPT ANYWAY (worse than promised): Wrote ")
    assert "it was kept anyway" in export.result_label.text() and "KEPT ANYWAY" in o.summary()
    assert export.keep_anyway_button.isHidden() and export.recommend_button.isHidden()


def test_the_recommended_preset_is_one_click_away(dialogs, qtbot, tmp_path, monkeypatch):
    state, budget, export = dialogs
    stub_llama_kl(monkeypatch, lambda p: 30.0 if p.endswith(".partial") else 1.0)
    _use_budget_plan(qtbot, state, budget)
    preset = state.plan_check.preset
    out = tmp_path / "budget.gguf"
    _export(qtbot, export, out)
    assert not out.exists()
    job = export.recommend_button.click() or export.job
    assert export.running and job is not None and preset in job.title and "awq+gptq" in job.title
    assert export.chosen_plan() == preset and export.method == "awq+gptq"
    export.cancel()
    qtbot.waitUntil(lambda: not export.running, timeout=TIMEOUT_MS)
    assert not out.exists()


def test_a_budget_file_as_good_as_promised_is_written_with_llamacpps_number_and_presets_are_not_measured(
    dialogs, qtbot, tmp_path, monkeypatch
):
    state, budget, export = dialogs
    seen = stub_llama_kl(monkeypatch, lambda p: 0.0 if p.endswith(".partial") else 1.0)
    _use_budget_plan(qtbot, state, budget)
    out = tmp_path / "budget.gguf"
    _export(qtbot, export, out)
    o = export.outcome
    assert out.is_file() and o is not None and o.last_word.ok and not o.kept_anyway
    assert export.status.text().startswith("Wrote ") and export.refused is None
    assert "llama.cpp measures the file at KL 0.0000" in export.result_label.text()
    assert export.keep_anyway_button.isHidden() and export.recommend_button.isHidden()
    n = len(seen)
    _export(qtbot, export, tmp_path / "q8.gguf", "Q8_0")  # a preset promises nothing: not measured
    assert (tmp_path / "q8.gguf").is_file() and len(seen) == n and export.outcome.last_word is None


def test_in_the_window_the_plan_editor_keeps_the_budget_plans_check_and_an_edit_drops_it(
    make_window, tiny_models, qtbot
):
    # the window's Plan page takes the budget plan too (an undo step); the check stays with that very plan,
    # and a plan edited there promises nothing: its export is not held to the budget's prediction
    from studio.core.plan.plan import plan_from_preset

    win = make_window()
    win.state.set_checkpoint(open_model(tiny_models("llama")))
    budget = win.show_budget_dialog()
    _use_budget_plan(qtbot, win.state, budget)
    assert win.state.plan is budget.allocation.plan and win.state.plan_check is not None
    export = win.show_export_dialog()
    assert (
        export.chosen_plan() is win.state.plan
        and "a budget plan: llama.cpp measures" in export.plan_info.text()
    )
    win.state.set_plan(plan_from_preset(win.state.info, "Q8_0"))  # another plan (as an edit makes one)
    assert win.state.plan_check is None and "a budget plan" not in export.plan_info.text()
    budget.clear()
