"""The sweep page: a real sweep of the open model's tensor fills both charts and the table; cancel stops it."""

from __future__ import annotations

import pytest

from studio.qt.jobs import JobManager
from studio.qt.panels.sweep_panel import SweepPanel
from studio.qt.state import StudioState

TENSOR = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture
def panel(qtbot, tiny_models):
    from studio.core.model import open_model

    state = StudioState()
    p = SweepPanel(state, JobManager())
    qtbot.addWidget(p)
    p.show()
    state.set_checkpoint(open_model(tiny_models("llama")))
    yield p
    p.cancel()
    qtbot.waitUntil(lambda: not p.running, timeout=60_000)
    p.jobs.shutdown()
    state.close_model()


def test_a_sweep_draws_the_cliff_and_the_group_curves(qtbot, panel):
    assert panel.tensor_combo.findText(TENSOR) >= 0
    assert panel.tensor_combo.findText("model.norm.weight") < 0  # vectors are not swept
    panel.state.select_tensor(TENSOR)  # the selection elsewhere picks the tensor here
    assert panel.tensor_combo.currentText() == TENSOR
    panel.gguf_check.setChecked(False)
    with qtbot.waitSignal(panel.resultShown, timeout=120_000) as blocker:
        assert panel.start()
        assert panel.cancel_button.isEnabled() and not panel.run_button.isEnabled()
    result = blocker.args[0]
    assert result.tensor == TENSOR
    assert panel.table.rowCount() == len(result.rows) > 0
    series = panel.plotted_series()
    # per-channel SNR rises with bits, as drawn
    snr = [y for _, y in series["per-channel sym"]]
    assert len(snr) >= 6 and snr == sorted(snr)
    # at 4 bits a group of 32 beats 128, which beats 256 (the group-size chart, x = log2(group))
    int4 = dict(series["group INT4"])
    assert int4[5.0] > int4[7.0] > int4[8.0]
    assert panel.cliff_line.value() == result.cliff_snr_db
    assert "g32" in panel.summary.text() and "cliff" in panel.summary.text()
    assert TENSOR in panel.status.text()


def test_cancel_stops_the_sweep(qtbot, panel):
    panel.select_tensor(TENSOR)
    assert panel.start()
    panel.cancel()
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    assert panel.status.text() == "Sweep cancelled."
    assert panel.table.rowCount() == 0 and panel.run_button.isEnabled()
