"""Calibrate page and the activation views over a real factory model: what the screen shows is numpy's
reduction of what the run observed and of the weights, and bad input leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from studio.core.model import open_model
from studio.qt.jobs import JobManager
from studio.qt.panels.calibrate_panel import CalibratePanel
from studio.qt.panels.inspector import InspectorPanel
from studio.qt.panels.overview import OverviewPanel
from studio.qt.panels.preview import PreviewPanel
from studio.qt.state import StudioState

CTX, CHUNKS = 64, 3


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory) -> Path:
    from studio.core.factory import sample_text

    p = tmp_path_factory.mktemp("calib") / "calib.txt"
    p.write_text(sample_text() * 2, encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def core_stats(tiny_models, calib_file):
    """The core's own run over the same text and settings as the panel's."""
    from studio.core.calib import calibrate

    return calibrate(tiny_models("llama"), calib_file, n_ctx=CTX, n_chunks=CHUNKS, device="cpu")


@pytest.fixture
def open_panel(qtbot, tiny_models):
    """``open_panel(Cls)`` -> (state, jobs, panel, ckpt): the panel, shown, over the tiny llama."""
    opened = []

    def make(cls):
        state, jobs = StudioState(), JobManager()
        ckpt = open_model(tiny_models("llama"))
        panel = cls(state, jobs)
        qtbot.addWidget(panel)
        panel.show()
        state.set_checkpoint(ckpt)
        opened.append((jobs, ckpt))
        return state, jobs, panel, ckpt

    yield make
    for jobs, ckpt in opened:
        jobs.shutdown(10_000)
        ckpt.close()


@pytest.fixture
def page(open_panel):
    return open_panel(CalibratePanel)


def _matrix(ckpt, suffix: str) -> str:
    return next(t.name for t in ckpt.info.tensors if t.name.endswith(suffix) and len(t.shape) == 2)


def _empty(curve) -> bool:
    return curve.yData is None or curve.yData.size == 0


def _abs_outliers(stats, t: float) -> list[tuple[str, int, float]]:
    """(input, channel, absmax) with absmax ≥ t, largest first, inputs shared by q/k/v once (numpy)."""
    rows, seen = [], set()
    for s in stats.sites:
        st = stats.inputs[s.name]
        if id(st) in seen:
            continue
        seen.add(id(st))
        am = np.asarray(st.absmax).max(axis=0)
        rows += [(s.name, int(c), float(am[c])) for c in np.flatnonzero(am >= t)]
    return sorted(rows, key=lambda r: -r[2])


def test_a_calibrate_click_shows_the_runs_outliers_and_an_imatrix_that_saves_and_loads(
    qtbot, page, calib_file, core_stats, tmp_path
):
    state, _jobs, panel, ckpt = page
    assert panel.run_button.isEnabled() and not panel.save_button.isEnabled()
    panel.set_text("text", calib_file)
    panel.set_run(ctx=CTX, chunks=CHUNKS, device="cpu")
    with qtbot.waitSignal(panel.calibrated, timeout=120_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    stats = state.activation_stats
    assert stats is not None and stats.n_tokens == CTX * CHUNKS
    assert f"{CTX * CHUNKS:,} tokens ({CHUNKS} × {CTX})" in panel.summary.text()
    # The same run as the core's: every linear input's Σx² agrees.
    for name, st in core_stats.inputs.items():
        np.testing.assert_allclose(stats.inputs[name].sum_sq, st.sum_sq, rtol=1e-5)
    # The outlier table lists the |x| ≥ 6 channels, largest first (numpy over the raw absmax).
    want = _abs_outliers(stats, 6.0)[:50]
    assert want, "the factory llama has planted activation outliers"
    shown = [
        (
            panel.outliers.item(i, 1).text(),
            int(panel.outliers.item(i, 2).text()),
            float(panel.outliers.item(i, 3).text()),
        )
        for i in range(panel.outliers.rowCount())
    ]
    assert [(n, c) for n, c, _ in shown] == [(n, c) for n, c, _ in want]
    assert [a for *_, a in shown] == pytest.approx([a for *_, a in want], rel=1e-3)
    # The imatrix is made and can be saved in both formats, then read back.
    im = state.imatrix
    assert im is not None and panel.save_button.isEnabled()
    assert f"{len(im)} entries, {CHUNKS} chunks" in panel.imatrix_label.text()
    for suffix in ("gguf", "dat"):
        out = tmp_path / f"m.imatrix.{suffix}"
        assert panel.save_imatrix(out)
        assert out.is_file() and state.imatrix.path is not None
        panel.forget_button.click()
        assert state.imatrix is None and "none" in panel.imatrix_label.text()
        assert panel.load_imatrix(out)
        back = state.imatrix
        assert set(back) == set(im)
        for k in im:
            np.testing.assert_allclose(np.asarray(back[k]), np.asarray(im[k]), rtol=1e-6)
    # Double-clicking an outlier row selects that weight.
    panel._outlier_clicked(0, 0)
    assert state.selected_tensor == shown[0][0]


def test_too_short_text_gives_one_sentence_and_keeps_nothing(qtbot, page, tmp_path):
    state, _jobs, panel, _ckpt = page
    short = tmp_path / "short.txt"
    short.write_text("Only a few words.", encoding="utf-8")
    before = sorted(tmp_path.iterdir())
    panel.set_text("text", short)
    panel.set_run(ctx=CTX, chunks=0, device="cpu")
    with qtbot.waitSignal(panel.errorShown, timeout=60_000) as sig:
        panel.start()
    msg = sig.args[0]
    assert "\n" not in msg and msg.endswith(".") and "Traceback" not in msg
    assert panel.status.text() == msg
    assert state.activation_stats is None and state.imatrix is None
    assert sorted(tmp_path.iterdir()) == before
    assert panel.run_button.isEnabled() and not panel.cancel_button.isEnabled()


def test_bad_choices_are_refused_before_any_job(qtbot, page, tmp_path):
    _state, jobs, panel, _ckpt = page
    panel.set_text("text", "")
    with qtbot.waitSignal(panel.errorShown, timeout=5_000) as sig:
        assert panel.start() is None
    assert "Choose a calibration file" in sig.args[0]
    panel.set_text("chat", tmp_path / "chats.txt")
    with qtbot.waitSignal(panel.errorShown, timeout=5_000) as sig:
        assert panel.start() is None
    assert ".jsonl" in sig.args[0]
    assert panel.task.started == 0


def test_cancel_keeps_nothing_and_says_so(qtbot, page, calib_file):
    state, _jobs, panel, _ckpt = page
    panel.set_text("text", calib_file)
    panel.set_run(ctx=CTX, chunks=CHUNKS, device="cpu")
    panel.start()
    assert panel.cancel_button.isEnabled() and not panel.run_button.isEnabled()
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    assert "cancelled" in panel.status.text()
    assert state.activation_stats is None and state.imatrix is None
    assert panel.run_button.isEnabled()


def test_an_imatrix_for_another_model_is_refused(qtbot, page, odd_hidden_model, tmp_path):
    from studio.core.calib import calibrate
    from studio.core.calib.imatrix import imatrix_from_stats, write_imatrix
    from studio.core.factory import sample_text

    state, _jobs, panel, _ckpt = page
    text = tmp_path / "t.txt"
    text.write_text(sample_text(), encoding="utf-8")
    st = calibrate(odd_hidden_model, text, n_ctx=32, n_chunks=1, device="cpu")  # hidden 320, not 256
    with open_model(odd_hidden_model) as ck:
        path = write_imatrix(imatrix_from_stats(st, ck.info), tmp_path / "other.imatrix.gguf").path
    with qtbot.waitSignal(panel.errorShown, timeout=5_000) as sig:
        assert not panel.load_imatrix(path)
    assert "another model" in sig.args[0] and "\n" not in sig.args[0]
    assert panel.status.text() == sig.args[0]
    assert state.imatrix is None


def test_saliency_and_smoothquant_views_draw_numpy_over_weight_and_activations(qtbot, page, core_stats):
    state, _jobs, panel, ckpt = page
    state.set_activation_stats(core_stats)
    name = _matrix(ckpt, "layers.0.mlp.down_proj.weight")
    with qtbot.waitSignal(panel.viewsShown, timeout=30_000) as sig:
        state.select_tensor(name)
    assert sig.args == [name]
    w = ckpt.read(name).astype(np.float64)
    st = core_stats.inputs[name]
    rms = np.sqrt(np.asarray(st.sum_sq).sum(axis=0) / st.tokens)
    sal = np.linalg.norm(w, axis=0) * rms
    np.testing.assert_allclose(panel.saliency.saliency.per_channel, sal, rtol=1e-5)
    top = np.argsort(-sal, kind="stable")[: max(1, round(0.01 * sal.size))]
    np.testing.assert_array_equal(panel.saliency.top.xData.astype(int), top)
    # A wider share marks more channels on screen.
    panel.saliency.share_spin.setValue(10.0)
    assert panel.saliency.top.xData.size == round(0.1 * sal.size)

    act, wmax = np.asarray(st.absmax).max(axis=0).astype(np.float64), np.abs(w).max(axis=0)
    for alpha in (0.5, 0.8):
        panel.smooth.set_alpha(alpha)
        s = act**alpha / wmax ** (1 - alpha)
        np.testing.assert_allclose(panel.smooth.act_after.yData, act / s, rtol=1e-5)
        np.testing.assert_allclose(panel.smooth.w_after.yData, wmax * s, rtol=1e-5)
        assert f"α = {alpha:.2f}" in panel.smooth.label.text()
    # A tensor no linear reads clears the views.
    state.select_tensor(_matrix(ckpt, "embed_tokens.weight"))
    assert panel.saliency.saliency is None and _empty(panel.smooth.act_after)


def test_inspector_draws_the_activation_absmax_on_the_weights_channel_axis(qtbot, open_panel, core_stats):
    state, _jobs, panel, ckpt = open_panel(InspectorPanel)
    name = _matrix(ckpt, "layers.1.mlp.down_proj.weight")
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        state.select_tensor(name)
    assert _empty(panel.act_curve)
    assert "run Calibrate" in panel.act_plot.getPlotItem().titleLabel.text
    state.set_activation_stats(core_stats)
    am = np.asarray(core_stats.inputs[name].absmax).max(axis=0)
    np.testing.assert_array_equal(panel.act_curve.yData, am.astype(np.float64))
    assert panel.act_curve.yData.size == ckpt.info.tensor(name).shape[1]
    t = float(np.quantile(am, 0.9))
    panel.act_abs_spin.setValue(round(t, 2))
    thr = panel.act_abs_spin.value()
    sx, _ = panel.act_out_abs.getData()
    np.testing.assert_array_equal(sx.astype(int), np.flatnonzero(am >= thr))
    panel.act_k_spin.setValue(2.0)
    mx, _ = panel.act_out_med.getData()
    np.testing.assert_array_equal(mx.astype(int), np.flatnonzero(am > 2.0 * np.median(am)))
    n_abs, n_med = int((am >= thr).sum()), int((am > 2.0 * np.median(am)).sum())
    assert f"({n_abs} + {n_med} marked)" in panel.act_plot.getPlotItem().titleLabel.text
    assert panel.table_value(f"activation outliers (|x| ≥ {thr:g})").startswith(
        f"{int((am >= thr).sum())} of {am.size}"
    )
    # Its histogram counts every value the run saw entering this weight.
    h = np.asarray(core_stats.inputs[name].hist)
    assert int(h.sum()) == core_stats.inputs[name].tokens * am.size
    nz = np.flatnonzero(h[1:-1]) + 1
    np.testing.assert_allclose(panel.act_hist_item.yData, np.log10(1.0 + h[nz[0] : nz[-1] + 1]), rtol=1e-12)
    state.set_activation_stats(None)
    assert _empty(panel.act_curve)


def test_overview_counts_outlier_features_per_layer(qtbot, open_panel, core_stats):
    state, _jobs, panel, ckpt = open_panel(OverviewPanel)
    assert not panel.act_plot.isVisible()
    state.set_activation_stats(core_stats)
    assert panel.act_plot.isVisible()
    panel.rule_combo.setCurrentIndex(1)  # |x| > t
    panel.rule_spin.setValue(3.0)
    hidden = core_stats.hidden[0].absmax.size
    want = []
    for layer in sorted({s.layer for s in core_stats.sites if s.layer is not None}):
        chans: set[int] = set()
        for s in core_stats.layer_sites(layer):
            am = np.asarray(core_stats.inputs[s.name].absmax).max(axis=0)
            if am.size == hidden:
                chans.update(np.flatnonzero(am >= 3.0).tolist())
        want.append(len(chans))
    heights = list(panel.act_bars.opts["height"])
    assert heights == want and sum(want) > 0
    assert f"{sum(want)} outlier features over {len(want)} layers" in panel.act_label.text()
    panel.rule_spin.setValue(1e5)
    assert list(panel.act_bars.opts["height"]) == [0] * len(want)


def test_preview_with_the_imatrix_is_the_cores_and_differs_without(qtbot, open_panel, core_stats):
    from studio.core.calib.imatrix import imatrix_from_stats
    from studio.core.preview import preview_tensor

    state, _jobs, panel, ckpt = open_panel(PreviewPanel)
    name = _matrix(ckpt, "layers.0.mlp.down_proj.weight")
    state.select_tensor(name)
    assert not panel.imatrix_check.isEnabled()
    im = imatrix_from_stats(core_stats, ckpt.info)
    state.set_imatrix(im)
    assert panel.imatrix_check.isEnabled() and panel.imatrix_check.isChecked()
    panel.set_qtype("Q3_K")
    with qtbot.waitSignal(panel.previewShown, timeout=60_000):
        panel.start()
    core = preview_tensor(ckpt, name, "Q3_K", imatrix=im)
    assert panel.result.imatrix_used and panel.result.snr_db == core.snr_db
    assert panel.wmse_label.text() == f"{core.weighted_mse:.4g}"
    assert "with the imatrix" in panel.status.text()
    panel.imatrix_check.setChecked(False)
    with qtbot.waitSignal(panel.previewShown, timeout=60_000):
        panel.start()
    plain = preview_tensor(ckpt, name, "Q3_K")
    assert not panel.result.imatrix_used and panel.result.snr_db == plain.snr_db != core.snr_db
    assert panel.wmse_label.text() == "–"
