"""Preview panel over a real factory model: the SNR shown is the core's, clicks and errors behave."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from studio.core.model import open_model
from studio.core.quant.blocks import dequantize, quantize
from studio.core.quant.metrics import error_metrics
from studio.qt.jobs import JobManager
from studio.qt.panels.preview import PreviewPanel, format_db
from studio.qt.state import StudioState


@pytest.fixture
def opened(qtbot, tiny_models):
    state = StudioState()
    jobs = JobManager()
    ckpt = open_model(tiny_models("llama"))
    panel = PreviewPanel(state, jobs)
    qtbot.addWidget(panel)
    panel.show()
    state.set_checkpoint(ckpt)
    name = next(t.name for t in ckpt.info.tensors if t.name.endswith("layers.0.mlp.down_proj.weight"))
    state.select_tensor(name)
    yield state, jobs, panel, ckpt, name
    jobs.shutdown(5000)
    ckpt.close()


def test_q4_k_preview_shows_the_core_snr(qtbot, opened):
    _state, _jobs, panel, ckpt, name = opened
    panel.set_qtype("Q4_K")
    with qtbot.waitSignal(panel.previewShown, timeout=60_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    x = ckpt.read(name)
    y = dequantize(quantize(x, "Q4_K"), "Q4_K", x.shape)
    core = error_metrics(x, y)
    assert panel.result.snr_db == core.snr_db
    assert panel.snr_label.text() == format_db(core.snr_db)
    assert panel.cosine_label.text() == f"{core.cosine:.6f}"
    # Overlaid histograms share their edges and count every value once.
    np.testing.assert_array_equal(panel.orig_item.xData, panel.deq_item.xData)
    counts, _ = np.histogram(y, bins=panel.deq_item.xData)
    np.testing.assert_array_equal(panel.deq_item.yData, np.log10(1.0 + counts))
    err_counts, _ = np.histogram(y - x, bins=panel.err_item.xData)
    np.testing.assert_array_equal(panel.err_item.yData, np.log10(1.0 + err_counts))
    worst = int(panel.worst_table.item(0, 0).text())
    assert worst == int(np.argmax(core.per_channel_mse))


def test_generic_qtype_preview(qtbot, opened):
    _state, _jobs, panel, ckpt, name = opened
    panel.set_qtype("INT8 sym channel")
    with qtbot.waitSignal(panel.previewShown, timeout=60_000):
        panel.start()
    from studio.core.quant.generic import quantize_int

    x = ckpt.read(name)
    core = error_metrics(x, quantize_int(x, 8, symmetric=True, granularity="channel").dequantized)
    assert panel.result.snr_db == pytest.approx(core.snr_db, rel=1e-12)


def test_five_rapid_clicks_start_one_job(qtbot, opened):
    """FAULTS 50: rapid clicks on Preview start one job."""
    _state, jobs, panel, _ckpt, _name = opened
    panel.set_qtype("Q4_K")
    with qtbot.waitSignal(panel.previewShown, timeout=60_000):
        for _ in range(5):
            qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
            panel.start()  # even bypassing the disabled button
    assert panel.task.started == 1
    assert len([j for j in jobs.history() if j.kind == "quantize"]) == 1
    assert panel.run_button.isEnabled()


def test_worker_exception_is_shown(qtbot, opened, monkeypatch):
    """FAULTS 49: an exception raised in the worker is delivered and shown, the button works again."""
    _state, _jobs, panel, _ckpt, _name = opened

    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr("studio.qt.panels.preview.preview_tensor", boom)
    with qtbot.waitSignal(panel.errorShown, timeout=10_000) as sig:
        panel.start()
    assert "kernel exploded" in sig.args[0] and "kernel exploded" in panel.status.text()
    qtbot.waitUntil(panel.run_button.isEnabled, timeout=2000)
