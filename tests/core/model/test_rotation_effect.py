"""The Inspector's rotation numbers (issue 41): a planted outlier input channel is spread out."""

from __future__ import annotations

import numpy as np

from studio.core.factory import read_factory_info
from studio.core.model import open_model
from studio.core.model.rotate import RotatedCheckpoint, Rotation
from studio.core.stats.rotation_effect import rotation_effect


def test_rotation_flattens_a_planted_outlier_channel(tiny_model):
    path = tiny_model("llama")
    name = next(t for t in read_factory_info(path).outlier_tensors if "gate_proj" in t)
    with open_model(path) as ck:
        eff = rotation_effect(RotatedCheckpoint(ck, Rotation()), name)
    assert eff.before.shape == eff.after.shape
    assert eff.spread(eff.after) < eff.spread(eff.before) / 2
    ch = int(eff.before.argmax())  # the weight's strongest input channel is spread over the others
    b, a = eff.channel(ch)  # (the norm's gain is folded in, so compare each against its median)
    assert a / np.median(eff.after) < b / np.median(eff.before) / 2
    assert eff.hist_before.sum() == eff.hist_after.sum() == len(eff.before)
    assert f"channel {ch}" in eff.sentence(ch)
    assert np.all(np.diff(eff.edges) > 0)


def test_the_effect_names_the_outlier_channel_and_its_histograms_move_left(tiny_model):
    path = tiny_model("llama")
    name = next(t for t in read_factory_info(path).outlier_tensors if "gate_proj" in t)
    with open_model(path) as ck:
        eff = rotation_effect(RotatedCheckpoint(ck, Rotation()), name)
    ch = eff.worst
    assert eff.before[ch] == eff.before.max()
    b, a = eff.channel(ch)
    assert eff.sentence().endswith(f"channel {ch}: absmax {b:.3g} → {a:.3g}.")  # named without a mark
    assert eff.channel_note(len(eff.before)) == ""
    edges, before, after = eff.curves()
    assert len(edges) == len(before) + 1 == len(after) + 1 and np.all(np.diff(edges) > 0)
    # the outlier's bin (the top one before) is empty after: its absmax is spread over the others
    top = int(np.searchsorted(edges, eff.before.max(), side="right")) - 1
    top = min(top, len(before) - 1)
    assert before[top] > 0 and after[top] == 0
    assert np.all(after[edges[:-1] > eff.after.max()] == 0)  # nothing above the rotated largest
