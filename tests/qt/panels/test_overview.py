"""Overview panel over a real factory model: per-tensor numbers match numpy, a click selects the tensor."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

from studio.core.model import open_model
from studio.core.stats.cache import StatsCache
from studio.core.stats.overview import OverviewMetric
from studio.qt.jobs import JobManager
from studio.qt.panels.overview import OverviewPanel
from studio.qt.state import StudioState


@pytest.fixture
def analyzed(qtbot, tiny_models):
    state = StudioState()
    jobs = JobManager()
    ckpt = open_model(tiny_models("llama"))
    cache = StatsCache()
    panel = OverviewPanel(state, jobs)
    panel.cache = cache
    qtbot.addWidget(panel)
    panel.resize(900, 500)
    panel.show()
    state.set_checkpoint(ckpt)
    with qtbot.waitSignal(panel.overviewShown, timeout=60_000):
        for _ in range(5):  # FAULTS 50: rapid clicks start one analysis
            qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    yield state, jobs, panel, ckpt, cache
    jobs.shutdown(5000)
    ckpt.close()


def test_one_analysis_and_values_match_numpy(analyzed):
    state, jobs, panel, ckpt, cache = analyzed
    assert panel.task.started == 1
    matrices = [t for t in ckpt.info.tensors if len(t.shape) >= 2]
    assert sorted(panel.overview.names()) == sorted(t.name for t in matrices)
    assert len(cache) == len(matrices)  # the inspector will find them cached

    panel.set_metric(OverviewMetric.SCALE_RATIO)
    for name in panel.overview.names()[:4]:
        x = ckpt.read(name)
        rows = np.abs(x).max(axis=1)
        _, y = panel.point_position(name)
        assert y == pytest.approx(rows.max() / np.median(rows), rel=1e-6)

    panel.set_metric(OverviewMetric.KURTOSIS)
    name = panel.overview.names()[2]
    d = ckpt.read(name).astype(np.float64).ravel()
    d -= d.mean()
    kurt = (d**4).mean() / (d**2).mean() ** 2 - 3
    assert panel.point_position(name)[1] == pytest.approx(kurt, rel=1e-4, abs=1e-4)


def test_clicking_a_point_selects_its_tensor(qtbot, analyzed):
    state, _jobs, panel, _ckpt, _cache = analyzed
    name = panel.overview.names()[3]
    x, y = panel.point_position(name)
    vb = panel.plot.getPlotItem().vb
    vb.autoRange()
    qtbot.wait(50)
    pos = panel.plot.mapFromScene(vb.mapViewToScene(QPointF(x, y)))
    with qtbot.waitSignal(state.tensorSelected, timeout=3000) as sig:
        qtbot.mouseClick(panel.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert sig.args == [name]
    assert state.selected_tensor == name
    mx, my = panel.selected_marker.getData()
    assert (mx[0], my[0]) == (x, y)
