"""The plan editor over a mixture-of-experts model converted by llama.cpp's converter: the merged
3-D expert tensors are cells of their own role columns, and editing one changes the plan and size."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from studio.core.model import open_model
from studio.core.plan.plan import plan_from_preset
from studio.core.quant.types import tensor_bytes
from studio.qt.jobs import JobManager
from studio.qt.state import StudioState


@pytest.fixture
def moe_editor(open_plan_editor):
    from tests.core.export.converter_fixtures import need_converter

    need_converter()
    return open_plan_editor("mixtral")


def test_merged_expert_tensors_are_edited_like_any_tensor(qtbot, moe_editor):
    state, panel, ckpt = moe_editor
    headers = [panel.model.headerData(c, Qt.Orientation.Horizontal) for c in range(panel.model.columnCount())]
    assert {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"} <= set(headers)
    assert "unknown" not in headers and "ffn_gate_inp" not in headers  # routers stay F32, not editable
    assert dict(panel.plan.types) == dict(plan_from_preset(ckpt.info, "Q4_K_M").types)
    col = headers.index("ffn_down_exps")
    row = [panel.model.headerData(r, Qt.Orientation.Vertical) for r in range(panel.model.rowCount())].index(
        "layer 1"
    )
    (name,) = panel.model.tensors_at(row, col)
    assert name == "blk.1.ffn_down_exps.weight"
    shape = panel._layout_by_name[name].shape
    assert len(shape) == 3 and shape[0] == 8
    old = panel.plan.types[name]
    assert panel.model.index(row, col).data() == old
    before = panel.summary.total_bytes
    with qtbot.waitSignal(state.planChanged, timeout=2000):
        assert panel.model.setData(panel.model.index(row, col), "Q8_0", Qt.ItemDataRole.EditRole)
    assert panel.plan.types[name] == "Q8_0" and panel.model.index(row, col).data() == "Q8_0"
    assert panel.summary.total_bytes - before == tensor_bytes("Q8_0", shape) - tensor_bytes(old, shape)


def test_summary_shows_experts_and_active_weights(qtbot, tiny_models):
    from tests.core.export.converter_fixtures import need_converter

    need_converter()
    from studio.core.hardware import HardwareInfo
    from studio.core.plan.estimate import estimate_presets
    from studio.qt.panels.summary import SummaryPanel

    state = StudioState()
    panel = SummaryPanel(state, JobManager())
    qtbot.addWidget(panel)
    with open_model(tiny_models("mixtral")) as ckpt:
        state.set_checkpoint(ckpt)
        estimates = estimate_presets(ckpt.info, HardwareInfo("cpu", 4, 64 << 30, 32 << 30), 512)
        state.set_estimates(estimates)
    note = panel.estimate_note.text()
    assert "Mixture of experts: 8 per layer, 2 used per token" in note
    assert "weights active per token" in note
    assert estimates[0].n_active_params < estimates[0].n_params
