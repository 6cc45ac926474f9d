"""The window's device choice offers a Ray cluster ("Ray cluster at …"); the jobs read it from the state."""

from __future__ import annotations

from PySide6.QtCore import QSettings

import studio.core.executor as executor_mod
from studio.qt.jobs import JobManager
from studio.qt.panels.device_selector import DeviceSelector
from studio.qt.settings import AppSettings
from studio.qt.state import StudioState


def _pick_cluster_item(sel):
    i = sel.combo.findText("Ray cluster…")
    assert i >= 0
    sel.combo.setCurrentIndex(i)


def test_choosing_a_cluster_names_it_and_the_state_carries_it(qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(executor_mod, "ray_installed", lambda: True)
    state = StudioState()
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    sel = DeviceSelector(state, JobManager(), cluster=True)
    sel.remember_in(AppSettings(settings))
    qtbot.addWidget(sel)
    assert sel.device == "cpu" and sel.cluster is None and state.cluster is None
    sel.ask_cluster = lambda: "ray://10.0.0.5:10001"
    _pick_cluster_item(sel)
    assert sel.combo.currentText() == "Ray cluster at ray://10.0.0.5:10001"
    assert sel.cluster == "ray://10.0.0.5:10001" and state.cluster == "ray://10.0.0.5:10001"
    assert sel.device == "cpu"  # the head's own work runs here
    # remembered: a new window offers and chooses the same cluster
    sel2 = DeviceSelector(StudioState(), JobManager(), cluster=True)
    sel2.remember_in(AppSettings(settings))
    qtbot.addWidget(sel2)
    assert (
        sel2.combo.currentText() == "Ray cluster at ray://10.0.0.5:10001"
        and sel2.cluster == "ray://10.0.0.5:10001"
    )
    # back to the CPU: no cluster
    assert sel.set_device("cpu") and state.cluster is None
    # a local cluster of two workers
    sel.ask_cluster = lambda: "local:2"
    _pick_cluster_item(sel)
    assert sel.combo.currentText() == "local Ray cluster (2 workers)" and state.cluster == "local:2"


def test_a_cluster_without_ray_is_refused_in_one_sentence(qtbot, monkeypatch):
    monkeypatch.setattr(executor_mod, "ray_installed", lambda: False)
    state = StudioState()
    sel = DeviceSelector(state, JobManager(), cluster=True)
    qtbot.addWidget(sel)
    sel.ask_cluster = lambda: "ray://10.0.0.5:10001"
    with qtbot.waitSignal(sel.clusterRefused) as sig:
        _pick_cluster_item(sel)
    assert sig.args[0] == (
        "A Ray cluster needs Ray, which is not installed: pip install 'quant-studio[cluster]' (or pip install ray)."
    )
    assert sel.device == "cpu" and sel.cluster is None and state.cluster is None
    assert sel.combo.currentText().startswith("CPU")


def test_only_the_windows_choice_offers_a_cluster(qtbot):
    sel = DeviceSelector(StudioState(), JobManager())
    qtbot.addWidget(sel)
    assert sel.combo.findText("Ray cluster…") < 0
