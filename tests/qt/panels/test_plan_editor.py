"""Plan editor over real factory models: cell edits, sizes, fallbacks, rules, undo/redo and plan JSON."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QItemSelectionModel, Qt

from studio.core.gguf.layout import layout
from studio.core.model import open_model
from studio.core.plan.plan import (
    Override,
    Plan,
    keep_first_last,
    plan_from_preset,
    plan_uniform,
    with_overrides,
)
from studio.core.plan.presets import PRESETS
from studio.core.quant.types import tensor_bytes
from studio.qt.jobs import JobManager
from studio.qt.panels.plan_editor import PlanEditorPanel
from studio.qt.state import StudioState


@pytest.fixture
def editor(open_plan_editor):
    return open_plan_editor("llama")


def _cell_of(panel, suffix: str) -> tuple[int, int, str]:
    for (r, c), names in panel.model.cells.items():
        for n in names:
            if n.endswith(suffix):
                return r, c, n
    raise KeyError(suffix)


def test_opens_with_q4_k_m_and_a_grid_of_layers_and_roles(editor):
    state, panel, ckpt = editor
    assert panel.model.rowCount() == 3  # model-level row + 2 layers
    assert panel.model.headerData(1, Qt.Orientation.Vertical) == "layer 0"
    assert "ffn_down" in [
        panel.model.headerData(c, Qt.Orientation.Horizontal) for c in range(panel.model.columnCount())
    ]
    ref = plan_from_preset(ckpt.info, "Q4_K_M")
    assert dict(panel.plan.types) == dict(ref.types)
    assert state.plan is panel.plan
    assert panel.summary.total_bytes == ref.summary(ckpt.info).total_bytes


def test_start_from_offers_presets_and_uniform_plans_under_their_own_headings(qtbot, editor):
    _state, panel, ckpt = editor
    combo = panel.preset_combo
    texts = [combo.itemText(i) for i in range(combo.count())]
    # Headings (not choosable) name the two groups; a uniform plan is never called a preset.
    presets_at, uniform_at = texts.index("llama.cpp presets"), texts.index("Uniform (one type)")
    assert not combo.model().item(presets_at).isEnabled() and not combo.model().item(uniform_at).isEnabled()
    assert texts[presets_at + 1 : presets_at + 1 + len(PRESETS)] == list(PRESETS)
    assert texts[uniform_at + 1 :] == ["uniform Q8_0", "uniform Q4_K", "uniform Q4_0"]
    assert combo.currentText() == "Q4_K_M"

    combo.setCurrentIndex(texts.index("uniform Q8_0"))
    qtbot.mouseClick(panel.preset_button, Qt.MouseButton.LeftButton)
    assert dict(panel.plan.types) == dict(plan_uniform(ckpt.info, "Q8_0").types)
    assert panel.plan.name == "uniform Q8_0" and panel.undo_stack.undoText() == "Uniform Q8_0"
    combo.setCurrentIndex(texts.index("Q2_K"))
    qtbot.mouseClick(panel.preset_button, Qt.MouseButton.LeftButton)
    assert dict(panel.plan.types) == dict(plan_from_preset(ckpt.info, "Q2_K").types)


def test_changing_a_cell_changes_the_size_by_that_tensors_bytes(qtbot, editor):
    state, panel, ckpt = editor
    r, c, name = _cell_of(panel, "layers.1.self_attn.q_proj.weight")
    shape = layout(ckpt.info).by_hf()[name].shape
    old_type = panel.plan.types[name]
    before = panel.summary.total_bytes
    label_before = panel.size_label.text()
    with qtbot.waitSignal(state.planChanged, timeout=1000):
        assert panel.model.setData(panel.model.index(r, c), "Q8_0", Qt.ItemDataRole.EditRole)
    assert panel.plan.types[name] == "Q8_0"
    assert panel.summary.total_bytes - before == tensor_bytes("Q8_0", shape) - tensor_bytes(old_type, shape)
    assert panel.size_label.text() != label_before
    assert panel.model.index(r, c).data() == "Q8_0"
    # Undo and redo through the keyboard shortcuts.
    panel.table.setFocus()
    qtbot.keyClick(panel.table, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert panel.plan.types[name] == old_type and panel.summary.total_bytes == before
    qtbot.keyClick(
        panel.table, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    assert panel.plan.types[name] == "Q8_0"
    assert state.plan is panel.plan


def test_delegate_combo_edits_a_cell(qtbot, editor):
    _state, panel, _ckpt = editor
    r, c, name = _cell_of(panel, "layers.0.mlp.up_proj.weight")
    index = panel.model.index(r, c)
    editor_widget = panel.delegate.createEditor(panel.table.viewport(), None, index)
    panel.delegate.setEditorData(editor_widget, index)
    assert editor_widget.currentText() == panel.plan.types[name]
    editor_widget.setCurrentText("Q5_K")
    panel.delegate.setModelData(editor_widget, panel.model, index)
    assert panel.plan.types[name] == "Q5_K"


def test_multi_select_keep_first_last_and_regex_rules(editor):
    _state, panel, ckpt = editor
    sel = panel.table.selectionModel()
    r1, c1, n1 = _cell_of(panel, "layers.0.self_attn.k_proj.weight")
    r2, c2, n2 = _cell_of(panel, "layers.1.mlp.gate_proj.weight")
    for r, c in ((r1, c1), (r2, c2)):
        sel.select(panel.model.index(r, c), QItemSelectionModel.SelectionFlag.Select)
    panel.set_selected("Q5_0")
    assert panel.plan.types[n1] == panel.plan.types[n2] == "Q5_0"

    before = panel.plan
    panel.apply_regex(r"mlp\.down_proj", "Q6_K")
    assert panel.plan.types == with_overrides(before, ckpt.info, [Override(r"mlp\.down_proj", "Q6_K")]).types
    downs = [n for n in panel.plan.types if "down_proj" in n]
    assert downs and all(panel.plan.types[n] == "Q6_K" for n in downs)
    panel.apply_regex(r"attn_output", "Q8_0")  # GGUF names match too
    assert all(t == "Q8_0" for n, t in panel.plan.types.items() if "o_proj" in n)

    before = panel.plan
    panel.keep_first_last(1, "F16")
    assert panel.plan.types == keep_first_last(before, ckpt.info, 1, "F16").types  # the core verb's meaning
    quantizable = {n for names in panel.model.cells.values() for n in names if ".layers." in n}
    assert all(panel.plan.types[n] == "F16" for n in quantizable)  # 2 layers: both are first/last
    # the embeddings and the output go with the first and last layers (the CLI's --keep-first-last)
    assert panel.plan.types["model.embed_tokens.weight"] == "F16" == panel.plan.types["lm_head.weight"]
    assert panel.plan.types["model.norm.weight"] == "F32"

    panel.apply_regex("(unclosed", "Q8_0")
    assert "is not a valid regex" in panel.status.text()
    assert panel.undo_stack.count() == 4  # the bad rule changed nothing


def test_save_and_load_plan_json(tmp_path, editor):
    _state, panel, ckpt = editor
    panel.apply_regex(r"q_proj", "Q8_0")
    saved = dict(panel.plan.types)
    path = tmp_path / "plan.json"
    panel.save_plan(path)
    assert json.loads(path.read_text())["version"] == 1
    assert not list(tmp_path.glob("*.partial"))
    panel.apply_preset("Q2_K")
    assert dict(panel.plan.types) != saved
    assert panel.load_plan(path)
    assert dict(panel.plan.types) == saved
    assert Plan.from_json(path.read_text(), ckpt.info).types == panel.plan.types

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    before = panel.plan
    assert not panel.load_plan(bad)
    assert panel.plan is before and "not valid JSON" in panel.status.text()


def test_fallback_cells_are_marked(qtbot, tiny_model):
    state = StudioState()
    ckpt = open_model(tiny_model("llama", hidden=320))
    panel = PlanEditorPanel(state, JobManager())
    qtbot.addWidget(panel)
    state.set_checkpoint(ckpt)
    try:
        r, c, name = _cell_of(panel, "layers.0.self_attn.q_proj.weight")
        panel.set_cells([(r, c)], "Q4_K")
        assert panel.plan.types[name] == "Q5_0"  # rows of 320 values cannot take 256-value blocks
        index = panel.model.index(r, c)
        assert index.data(Qt.ItemDataRole.BackgroundRole) is not None
        assert "wanted Q4_K, got Q5_0" in index.data(Qt.ItemDataRole.ToolTipRole)
        assert index.data() == "Q5_0 ⚠"
        panel.set_cells([(r, c)], "Q8_0")
        assert index.data(Qt.ItemDataRole.BackgroundRole) is None
    finally:
        ckpt.close()
