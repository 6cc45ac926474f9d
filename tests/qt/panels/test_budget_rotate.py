"""The budget dialog's "Rotate" box (issue 41): the scan and the imatrix measure the rotated model, the plan
pays for the head the rotation unties within the budget, and the Export dialog writes that plan rotated with
the rotated model's imatrix (the window's own imatrix slot is left alone)."""

from __future__ import annotations

import pytest

from studio.core.gguf.read import read_gguf
from studio.core.model import open_model
from studio.qt.jobs import JobManager
from studio.qt.panels import budget_dialog
from studio.qt.panels.budget_dialog import BudgetDialog
from studio.qt.panels.export_dialog import CURRENT_PLAN
from studio.qt.state import StudioState
from tests.llama_verdict import stub_llama_kl

TIMEOUT_MS = 120_000


@pytest.fixture
def dialogs(open_budget_export, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    # two candidate types keep the real scan short
    monkeypatch.setattr(budget_dialog, "default_types", lambda config: ("Q4_0", "Q8_0"))
    return open_budget_export("qwen2")  # tied: the rotation unties its head


def test_a_rotated_budget_plan_is_scanned_planned_and_written_rotated(dialogs, qtbot, tmp_path, monkeypatch):
    state, budget, export = dialogs
    stub_llama_kl(monkeypatch, lambda p: 0.0 if p.endswith(".partial") else 1.0)
    assert not budget.rotate_check.isChecked()  # off by default
    budget.rotate_check.setChecked(True)
    budget.start_scan()
    qtbot.waitUntil(lambda: budget.scan is not None and not budget.running, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: not budget.planning, timeout=TIMEOUT_MS)
    scan = budget.scan
    assert scan.rotation == 0 and "lm_head.weight" in {t.name for t in scan.tensors}
    assert "rotated" in budget.status.text()
    # a file budget halfway between all-Q4_0 and all-Q8_0 of the rotated model (its untied head included)
    sizes = {q: sum(t.by_type[q].bytes for t in scan.tensors) for q in ("Q4_0", "Q8_0")}
    limit = 100_000 + (sizes["Q4_0"] + sizes["Q8_0"]) // 2
    budget.budget_edit.setText(str(limit))
    budget.replan()
    qtbot.waitUntil(lambda: not budget.planning and budget.allocation is not None, timeout=TIMEOUT_MS)
    a = budget.allocation
    assert "lm_head.weight" in a.plan.types and a.file_bytes <= a.limit_bytes == limit

    budget.use_button.click()
    assert state.plan is a.plan and state.imatrix is None  # the rotated imatrix is not the window's
    export.set_plan_choice(CURRENT_PLAN)
    export.set_method("rtn")
    assert export.rotate_check.isChecked() and not export.rotate_check.isEnabled()
    assert "planned for the rotated model" in export.plan_info.text()
    assert export.imatrix is budget.imatrix
    export.verify_check.setChecked(False)
    out = tmp_path / "rot.gguf"
    export.set_output_path(out)
    assert export.start() is not None
    qtbot.waitUntil(lambda: not export.running, timeout=TIMEOUT_MS)
    g = read_gguf(out)
    assert g.metadata["quantize.rotation.seed"] == 0
    assert "output.weight" in {t.name for t in g.tensors}
    assert any(k.startswith("quantize.imatrix") for k in g.metadata)
    assert out.stat().st_size == a.file_bytes <= limit


def test_a_family_the_rotation_does_not_cover_is_one_sentence(qtbot, tiny_models, tmp_path):
    import json
    import shutil

    model = tmp_path / "m"  # a Llama folder that calls itself StarCoder 2, which the rotation does not know
    shutil.copytree(tiny_models("llama"), model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"model_type": "starcoder2"}))
    state, jobs = StudioState(), JobManager()
    ckpt = open_model(model)
    state.set_checkpoint(ckpt)
    d = BudgetDialog(state, jobs)
    qtbot.addWidget(d)
    d.rotate_check.setChecked(True)
    with qtbot.waitSignal(d.errorShown) as sig:
        d.start_scan()
    assert "does not cover model type 'starcoder2'" in sig.args[0] and not d.running and d.scan is None
    jobs.shutdown(5000)
    ckpt.close()


def test_the_export_dialogs_job_rotates_a_gguf_original_through_its_folder(
    tiny_models, tmp_path, monkeypatch
):
    from studio.core.export.run import export_gguf
    from studio.core.jobs import JobContext
    from studio.core.model.rotate import Rotation
    from studio.core.paths import user_cache_dir
    from studio.qt.panels.export_dialog import run_export

    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "lone" / "qwen-q8.gguf"
    src.parent.mkdir()
    export_gguf(tiny_models("qwen2"), src, "Q8_0")
    out = tmp_path / "rot.gguf"
    done = []
    ctx = JobContext(on_progress=lambda d, t, m: done.append(m))
    outcome = run_export(ctx, src, out, "Q8_0", verify=False, rotation=Rotation(seed=2))
    assert outcome.result.path == out
    g = read_gguf(out)
    assert g.metadata["quantize.rotation.seed"] == 2 and "output.weight" in {t.name for t in g.tensors}
    assert len(list((user_cache_dir() / "gguf-hf").glob("qwen-q8-*"))) == 1  # converted once, cached


def test_a_family_r1_cannot_fold_scans_with_r2_alone_and_says_why(qtbot, tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(budget_dialog, "default_types", lambda config: ("Q4_0", "Q8_0"))
    state, jobs = StudioState(), JobManager()
    ckpt = open_model(tiny_models("gemma2"))
    state.set_checkpoint(ckpt)
    d = BudgetDialog(state, jobs)
    qtbot.addWidget(d)
    d.rotate_check.setChecked(True)
    d.start_scan()
    try:
        assert d.running and "Only R2" in d.status.text() and "post-norms" in d.status.text()
        assert d._next_info.config["_quant_studio_rotation"]["quantize.rotation.r1"] is False
    finally:
        d.reject()
        qtbot.waitUntil(lambda: not d.running, timeout=TIMEOUT_MS)
        jobs.shutdown(5000)
        ckpt.close()
