"""The memory calculator page: its numbers equal the stated formulas, worked by hand; inputs change them."""

from __future__ import annotations

import pytest

from studio.qt.jobs import JobManager
from studio.qt.panels.memory_panel import MemoryPanel
from studio.qt.state import StudioState

GIB = 1024**3
MIB = 1024**2


@pytest.fixture
def panel(qtbot):
    p = MemoryPanel(StudioState(), JobManager())
    qtbot.addWidget(p)
    p.show()
    yield p
    p.jobs.shutdown()


def test_a_hand_computed_case(panel):
    # 1e9 parameters, 16 layers, 4 KV heads of 64, vocabulary 32000, 2000 tokens, Q8_0 cache.
    panel.set_shape(1e9, 16, 4, 64, 32000)
    panel.set_context(2000)
    panel.set_kv_type("q8_0")
    kv = 2 * 16 * 4 * 64 * 2048 * 34 // 32  # context rounded up to 2048; Q8_0 is 34 bytes per 32 values
    assert kv == 17_825_792
    weights = 562_500_000  # 1e9 × 4.5 bits ÷ 8 (Q4_0: 18 bytes per 32 values)
    overhead = 28_125_000 + 64 * MIB + 32000 * 512 * 4  # 5 % of the weights + 64 MiB + logits
    total = weights + kv + overhead
    assert panel.cell_bytes("INT4/Q4_0", "Weights") == weights
    assert panel.cell_bytes("INT4/Q4_0", "KV cache") == kv
    assert panel.cell_bytes("INT4/Q4_0", "Overhead") == overhead
    assert panel.cell_bytes("INT4/Q4_0", "Total") == total == 741_095_656
    assert panel.cell_bytes("INT4/Q4_0", "8 GB") is True
    fp32 = 4_000_000_000 + kv + 200_000_000 + 64 * MIB + 32000 * 512 * 4
    assert panel.cell_bytes("FP32", "Total") == fp32
    # the bars stack exactly the table's parts
    totals = panel.bar_totals()
    names = [panel.table.item(r, 0).text() for r in range(panel.table.rowCount())]
    assert totals[names.index("INT4/Q4_0")] == pytest.approx(total, rel=1e-9)
    # the worked formula shows the selected row's numbers
    panel.table.selectRow(names.index("INT4/Q4_0"))
    worked = panel.worked.text()
    assert "1,000,000,000 parameters × 4.5 bits" in worked
    assert "2 × 16 layers × 4 KV heads × 64 head dim × 2048 tokens × 34/32 bytes (Q8_0)" in worked
    assert "weights  = parameters × bits per weight ÷ 8" in panel.formulas.text()


def test_llama3_70b_sanity_point_and_the_kv_type_and_card_change_what_is_shown(panel):
    panel.set_shape(70.6e9, 80, 8, 128, 128256)
    panel.set_context(32768)
    panel.set_kv_type("f16")
    assert panel.cell_bytes("FP16/BF16", "KV cache") == 10 * GIB
    assert panel.cell_bytes("FP16/BF16", "Weights") == 141_200_000_000
    assert panel.table.item(1, 3).text() == "10.74 GB"  # decimal units, as everywhere
    assert panel.cell_bytes("FP16/BF16", "80 GB") is False
    assert panel.cell_bytes("Q4_K_M", "80 GB") is True
    panel.set_kv_type("q4_0")
    assert panel.cell_bytes("Q4_K_M", "KV cache") == 10 * GIB * 18 // 32 // 2
    panel.set_card(48)
    # the bars' axis is in decimal GB: a "48 GB" card's 48 GiB less 512 MiB is 51.0 GB usable
    assert panel.plot.getPlotItem().getAxis("left").labelText == "memory (GB)"
    assert panel.card_line.value() == pytest.approx((48 * GIB - 512 * MIB) / 1e9)
    assert "51.00 GB usable" in panel.card_line.label.format
    assert "48 GB card holds" in panel.headline.text()
    fits48 = [
        panel.table.item(r, 0).text()
        for r in range(panel.table.rowCount())
        if panel.cell_bytes(panel.table.item(r, 0).text(), "48 GB")
    ]
    assert fits48 and all(name in panel.headline.text() for name in fits48)
    assert "FP16/BF16" not in panel.headline.text()


def test_the_open_model_is_the_default_source(panel, tiny_models):
    from studio.core.model import open_model

    checkpoint = open_model(tiny_models("llama"))
    panel.state.set_checkpoint(checkpoint)
    assert panel.source_combo.currentData() == "model"
    assert not panel.layers_spin.isEnabled()
    info = checkpoint.info
    assert panel.layers_spin.value() == info.n_layers
    assert panel.report.shape.params == info.parameters
    assert panel.report.row("Q4_K_M").bpw_source == "plan"  # the exporter's per-tensor types
    panel.state.close_model()
    assert panel.source_combo.currentData() == "shape" and panel.layers_spin.isEnabled()


def test_opening_or_closing_a_model_draws_the_report_once(panel, tiny_models):
    # the source combo's own signal used to draw it a second time (the report is ~50 ms of table and bars)
    from studio.core.model import open_model

    shown: list[object] = []
    panel.reportShown.connect(shown.append)
    panel.state.set_checkpoint(open_model(tiny_models("llama")))
    assert len(shown) == 1 and shown[0].shape.name != "typed shape"
    panel.state.close_model()
    assert len(shown) == 2 and shown[1].shape.name == "typed shape"


def test_a_hidden_page_waits_until_shown_then_draws_the_open_model_once(qtbot, tiny_models):
    # opening a model must not pay the report of every precision on the GUI thread for a hidden page
    from studio.core.model import open_model

    p = MemoryPanel(StudioState(), JobManager())
    qtbot.addWidget(p)
    shown: list[object] = []
    p.reportShown.connect(shown.append)
    try:
        checkpoint = open_model(tiny_models("llama"))
        p.state.set_checkpoint(checkpoint)
        assert shown == [] and p.report is None
        p.show()
        assert len(shown) == 1 and p.report.shape.params == checkpoint.info.parameters
        assert p.source_combo.currentData() == "model" and not p.layers_spin.isEnabled()
        p.hide()
        p.state.close_model()
        p.show()
        assert len(shown) == 2 and p.report.shape.name == "typed shape" and p.layers_spin.isEnabled()
    finally:
        p.jobs.shutdown()
