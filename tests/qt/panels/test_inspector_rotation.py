"""The Inspector's view of what rotation does to the outlier channels (issue 41): with "Rotated" a plot of the
per-input-channel absmax histogram before and after appears, holding the core's numbers, and the outlier (or the
marked channel) is named with its absmax before → after; unticked, the plot and the names go."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.factory import read_factory_info
from studio.core.model import open_model
from studio.core.model.rotate import RotatedCheckpoint
from studio.core.stats.rotation_effect import default_rotation, rotation_effect
from studio.qt.jobs import JobManager
from studio.qt.panels.inspector import InspectorPanel
from studio.qt.state import StudioState


@pytest.fixture
def opened(qtbot, tiny_models):
    state, jobs = StudioState(), JobManager()
    ckpt = open_model(tiny_models("llama"))
    panel = InspectorPanel(state, jobs)
    qtbot.addWidget(panel)
    panel.show()
    state.set_checkpoint(ckpt)
    yield state, panel, ckpt
    jobs.shutdown(5000)
    ckpt.close()


def _toggle(qtbot, panel, on: bool) -> None:
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        panel.rotate_box.setChecked(on)


def test_the_rotated_box_draws_the_absmax_histograms_and_names_the_outlier(qtbot, opened):
    state, panel, ckpt = opened
    name = next(t for t in read_factory_info(ckpt.info.path).outlier_tensors if "gate_proj" in t)
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        state.select_tensor(name)
    assert not panel.rot_plot.isVisible() and panel.in_channels.note.toPlainText() == ""

    _toggle(qtbot, panel, True)
    want = rotation_effect(RotatedCheckpoint(ckpt, default_rotation()), name)
    edges, before, after = want.curves()
    assert panel.rot_plot.isVisible()
    np.testing.assert_allclose(panel.rot_before.yData, before)
    np.testing.assert_allclose(panel.rot_after.yData, after)
    assert not np.array_equal(before, after)  # the rotation moved the channels
    b, a = want.channel(want.worst)
    note = f"channel {want.worst}: absmax {b:.3g} → {a:.3g}"
    assert panel.in_channels.note.toPlainText() == note and note in panel.status.text()

    # a marked channel (the demo marks its channel 260) is the one named
    panel.mark_input_channel(name, 3, "channel 3")
    _toggle(qtbot, panel, False)
    assert not panel.rot_plot.isVisible() and panel.in_channels.note.toPlainText() == "channel 3"
    _toggle(qtbot, panel, True)
    b, a = want.channel(3)
    assert panel.in_channels.note.toPlainText() == f"channel 3: absmax {b:.3g} → {a:.3g}"


def test_a_tensor_that_is_not_a_matrix_shows_no_histogram(qtbot, opened):
    state, panel, ckpt = opened
    norm = next(t.name for t in ckpt.info.tensors if t.name.endswith("layers.0.input_layernorm.weight"))
    panel.rotate_box.setChecked(True)
    with qtbot.waitSignal(panel.statsShown, timeout=20_000):
        state.select_tensor(norm)
    assert not panel.rot_plot.isVisible() and "not a matrix" in panel.status.text()


@pytest.mark.parametrize(
    ("arch", "matrix", "why"), [("gemma2", "self_attn.o_proj", "post-norms"), ("gpt2", "mlp.c_fc", "")]
)
def test_other_families_show_their_rotation_and_say_what_it_folds(qtbot, tiny_models, arch, matrix, why):
    """Gemma 2 gets R2 alone and the status line says why; GPT-2's Conv1D matrices (stored in, out) show
    their input channels, one per hidden unit."""
    state, jobs = StudioState(), JobManager()
    ckpt = open_model(tiny_models(arch))
    panel = InspectorPanel(state, jobs)
    qtbot.addWidget(panel)
    panel.show()
    try:
        state.set_checkpoint(ckpt)
        name = next(t.name for t in ckpt.info.tensors if matrix in t.name and t.name.endswith(".weight"))
        with qtbot.waitSignal(panel.statsShown, timeout=20_000):
            state.select_tensor(name)
        _toggle(qtbot, panel, True)
        assert panel.rot_plot.isVisible() and panel.effect is not None
        assert ("Only R2" in panel.status.text()) is bool(why) and why in panel.status.text()
        hidden = int(ckpt.info.config.get("hidden_size") or ckpt.info.config.get("n_embd"))
        inputs = ckpt.info.tensor(name).shape[0 if arch == "gpt2" else 1]
        assert len(panel.effect.before) == inputs and (arch != "gpt2" or inputs == hidden)
        assert not np.allclose(panel.effect.before, panel.effect.after)
    finally:
        jobs.shutdown(5000)
        ckpt.close()
