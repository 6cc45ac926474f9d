"""Inspector panel over a real factory model: the plots hold exactly what numpy computes from the weights."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QThread
from PySide6.QtWidgets import QApplication

from studio.core.model import open_model
from studio.core.stats.tensor_stats import OutlierKind, OutlierRule
from studio.qt.jobs import JobManager
from studio.qt.panels import assert_gui_thread
from studio.qt.panels.inspector import InspectorPanel
from studio.qt.state import StudioState


@pytest.fixture
def opened(qtbot, tiny_models):
    state = StudioState()
    jobs = JobManager()
    ckpt = open_model(tiny_models("llama"))
    panel = InspectorPanel(state, jobs)
    qtbot.addWidget(panel)
    state.set_checkpoint(ckpt)
    yield state, jobs, panel, ckpt
    jobs.shutdown(5000)
    ckpt.close()


def _matrix(ckpt, name: str) -> str:
    return next(t.name for t in ckpt.info.tensors if t.name.endswith(name) and len(t.shape) == 2)


def test_selecting_a_tensor_draws_numpy_histogram_and_channel_absmax(qtbot, opened):
    state, _jobs, panel, ckpt = opened
    name = _matrix(ckpt, "layers.0.mlp.down_proj.weight")
    with qtbot.waitSignal(panel.statsShown, timeout=20_000) as sig:
        state.select_tensor(name)
    assert sig.args == [name]
    x = ckpt.read(name)

    edges = panel.hist_item.xData
    counts, _ = np.histogram(x, bins=edges)
    assert edges[0] == x.min() and edges[-1] == x.max()
    np.testing.assert_array_equal(panel.hist_item.yData, np.log10(1.0 + counts))
    assert counts.sum() == x.size

    np.testing.assert_array_equal(panel.out_channels.curve.yData, np.abs(x).max(axis=1))
    np.testing.assert_array_equal(panel.in_channels.curve.yData, np.abs(x).max(axis=0))

    # Outliers highlighted with the default rule (5 x median of the channel absmax).
    col = np.abs(x).max(axis=0)
    expected = np.flatnonzero(col > 5 * np.median(col))
    sx, _ = panel.in_channels.outliers.getData()
    np.testing.assert_array_equal(sx.astype(int), expected)
    assert panel.table_value("elements") == f"{x.size:,}"
    assert float(panel.table_value("std")) == pytest.approx(float(x.std(dtype=np.float64)), rel=1e-5)


def test_outlier_rule_switch_rehighlights_without_recomputing(qtbot, opened):
    state, _jobs, panel, ckpt = opened
    name = _matrix(ckpt, "layers.1.self_attn.q_proj.weight")
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        state.select_tensor(name)
    started = panel.task.started
    x = ckpt.read(name)
    t = float(np.quantile(np.abs(x), 0.999))
    panel.rule_combo.setCurrentIndex(1)  # |x| > t
    panel.rule_spin.setValue(round(t, 2))
    thr = float(panel.rule_spin.value())
    sx, sy = panel.out_channels.outliers.getData()
    np.testing.assert_array_equal(sx.astype(int), np.flatnonzero(np.abs(x).max(axis=1) > thr))
    assert panel.out_channels.threshold.value() == pytest.approx(thr)
    assert panel.rule == OutlierRule(OutlierKind.ABS, thr)
    share = float(panel.table_value(f"outlier share (|x| > {thr:g})").split()[0]) / 100
    assert share == pytest.approx((np.abs(x) > thr).mean(), rel=0.02, abs=2e-6)
    assert panel.task.started == started


def test_heat_map_is_block_max_of_abs_weights(qtbot, opened):
    state, _jobs, panel, ckpt = opened
    name = _matrix(ckpt, "embed_tokens.weight")
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        state.select_tensor(name)
    x = np.abs(ckpt.read(name))
    fr, fc = panel.stats.heat_block
    img = panel.heat_item.image
    assert img.shape[0] <= 512 and img.shape[1] <= 512
    i, j = img.shape[0] // 2, img.shape[1] - 1
    assert img[i, j] == x[i * fr : (i + 1) * fr, j * fc : (j + 1) * fc].max()


def test_repeated_selection_starts_one_job(qtbot, opened):
    """FAULTS 50: five rapid requests of the same tensor start one job."""
    state, jobs, panel, ckpt = opened
    name = _matrix(ckpt, "layers.0.mlp.up_proj.weight")
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        for _ in range(5):
            panel.request(name)
    assert panel.task.started == 1
    assert len([j for j in jobs.history() if j.kind == "statistics"]) == 1


def test_worker_error_is_shown(qtbot, opened, monkeypatch):
    """FAULTS 49: an exception in the worker reaches the panel as a shown sentence."""
    state, _jobs, panel, ckpt = opened

    def boom(*args, **kwargs):
        raise ValueError("disk on fire")

    monkeypatch.setattr("studio.qt.panels.inspector.tensor_stats", boom)
    name = _matrix(ckpt, "layers.0.mlp.gate_proj.weight")
    with qtbot.waitSignal(panel.errorShown, timeout=10_000) as sig:
        state.select_tensor(name)
    assert "disk on fire" in sig.args[0]
    assert "disk on fire" in panel.status.text()


def test_ui_methods_refuse_worker_threads(qtbot, opened):
    """FAULTS 51: a UI method called from a worker raises instead of touching widgets."""
    _state, _jobs, panel, _ckpt = opened
    errors: list[str] = []

    class Worker(QThread):
        def run(self) -> None:
            try:
                panel.clear()
            except RuntimeError as err:
                errors.append(str(err))

    w = Worker()
    w.start()
    assert w.wait(5000)
    assert errors and "worker thread" in errors[0]
    assert QThread.currentThread() is QApplication.instance().thread()
    assert_gui_thread()  # and the GUI thread passes


def test_planted_outlier_input_channels_are_the_highlighted_ones(qtbot, opened):
    """The factory records the input channels it made large; the inspector flags exactly those."""
    import json

    state, _jobs, panel, ckpt = opened
    meta = json.loads((ckpt.info.path / "quant_studio_factory.json").read_text())
    name = meta["outlier_tensors"][0]
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        state.select_tensor(name)
    sx, _ = panel.in_channels.outliers.getData()
    assert sorted(sx.astype(int).tolist()) == sorted(meta["outlier_channels"])
    assert (
        panel.table_value("outlier input channels")
        == f"{len(meta['outlier_channels'])} of {ckpt.read(name).shape[1]}"
    )


def test_rotated_box_shows_the_rotated_weights_and_says_what_they_did(qtbot, opened):
    from studio.core.model.rotate import RotatedCheckpoint, Rotation

    state, _jobs, panel, ckpt = opened
    name = _matrix(ckpt, "layers.0.mlp.gate_proj.weight")
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        state.select_tensor(name)
    plain = np.array(panel.in_channels.curve.yData)
    np.testing.assert_array_equal(plain, np.abs(ckpt.read(name)).max(axis=0))
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        panel.rotate_box.setChecked(True)
    rot = np.abs(RotatedCheckpoint(ckpt, Rotation()).read(name)).max(axis=0)
    np.testing.assert_allclose(panel.in_channels.curve.yData, rot, rtol=1e-6)
    assert "Rotated: the largest input channel is" in panel.status.text()
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        panel.rotate_box.setChecked(False)
    np.testing.assert_array_equal(panel.in_channels.curve.yData, plain)
    assert panel.status.text() == ""


def test_a_tensor_chosen_as_the_model_opens_is_shown_whatever_slot_runs_first(qtbot, tiny_models):
    """``quant-studio MODEL --select T`` selects T from a modelOpened slot connected before the panel was
    built (panels are built lazily), so it ran before the panel's own reset, which used to wipe it: the
    tree showed T selected and the Inspector "Select a tensor…" with empty plots."""
    state, jobs = StudioState(), JobManager()
    ckpt = open_model(tiny_models("gpt2"))
    name = "transformer.h.0.mlp.c_fc.weight"

    def select_once(_checkpoint) -> None:
        state.modelOpened.disconnect(select_once)
        state.select_tensor(name)

    state.modelOpened.connect(select_once)  # before the panel exists, as in studio.app
    panel = InspectorPanel(state, jobs)
    qtbot.addWidget(panel)
    try:
        with qtbot.waitSignal(panel.statsShown, timeout=20_000):
            state.set_checkpoint(ckpt)
        assert panel.stats is not None and panel.stats.name == name
        assert name in panel.title.text()
    finally:
        jobs.shutdown(5000)
        ckpt.close()
