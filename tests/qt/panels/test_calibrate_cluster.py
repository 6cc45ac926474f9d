"""The Calibrate page on the window's Ray cluster: its chunks run on a real local cluster of two
workers, and the statistics on screen are the in-process run's."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from studio.core.model import open_model
from studio.qt.jobs import JobManager
from studio.qt.panels.calibrate_panel import CalibratePanel
from studio.qt.state import StudioState

pytest.importorskip("ray", reason="Ray is not installed (pip install 'quant-studio[cluster]')")

# It makes the Qt test process a Ray driver: marked so that it runs after every other test
# (tests/conftest.py says why), and slow (a cluster of its own); the same identity is tested without
# Qt in tests/core/cluster/test_ray_calibrate.py.
pytestmark = [pytest.mark.slow, pytest.mark.ray_driver]

CTX, CHUNKS = 64, 3


def test_calibrate_runs_its_chunks_on_the_windows_cluster(qtbot, tiny_models, tmp_path, monkeypatch):
    import studio.core.cluster.ray_executor as rx
    from studio.core.calib import calibrate
    from studio.core.factory import sample_text

    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    model = tiny_models("llama")
    here = calibrate(model, text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu")
    calls = []
    real = rx.calibrate_on_cluster

    def spy(executor, *a, **kw):  # the real cluster job, counted
        calls.append(executor.label)
        return real(executor, *a, **kw)

    monkeypatch.setattr(rx, "calibrate_on_cluster", spy)
    state, jobs = StudioState(), JobManager()
    panel = CalibratePanel(state, jobs)
    qtbot.addWidget(panel)
    ckpt = open_model(model)
    try:
        state.set_checkpoint(ckpt)
        state.cluster = "local:2"  # what the toolbar's "Ray cluster…" choice sets
        panel.set_text("text", text)
        panel.set_run(ctx=CTX, chunks=CHUNKS, device="cpu")
        with qtbot.waitSignal(panel.calibrated, timeout=300_000):
            qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    finally:
        jobs.shutdown(30_000)
        ckpt.close()
    assert calls == ["local Ray cluster (2 workers)"]
    stats = state.activation_stats
    assert stats is not None and stats.n_tokens == CTX * CHUNKS
    assert list(stats.inputs) == list(here.inputs)
    for name, st in here.inputs.items():
        np.testing.assert_allclose(stats.inputs[name].sum_sq, st.sum_sq, rtol=1e-6)
        assert np.array_equal(stats.inputs[name].absmax, st.absmax)
    assert state.imatrix is not None and f"{CHUNKS} chunks" in panel.imatrix_label.text()
