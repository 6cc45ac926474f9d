"""The views' functions: outlier features find the planted channels, SmoothQuant and AWQ formulas, LLM.int8()."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.core.calib.accumulators import InputStats, hist_edges
from studio.core.calib.analysis import (
    FeatureRule,
    activation_histogram,
    awq_saliency,
    channel_profile,
    layer_outlier_counts,
    outlier_features,
    smoothquant,
    top_outlier_features,
    weight_columns,
)
from studio.core.calib.int8 import Int8Analysis, int8_matmul, mixed_matmul
from studio.core.factory import read_factory_info
from studio.core.model import open_model

from .conftest import CHUNKS, CTX


def _stats(absmax, rms=None, tokens=10):
    absmax = np.asarray(absmax, dtype=np.float32)
    n = absmax.size
    rms = np.asarray(rms if rms is not None else absmax / 2, dtype=np.float64)
    return InputStats(
        n,
        np.array([tokens]),
        (rms**2 * tokens)[None, :],
        absmax[None, :],
        (rms * tokens)[None, :],
        np.zeros(len(hist_edges()) - 1, dtype=np.int64),
    )


def test_planted_outlier_channels_are_found(llama_model, llama_stats):
    planted = set(read_factory_info(llama_model).outlier_channels)
    q = llama_stats.inputs["model.layers.0.self_attn.q_proj.weight"]
    prof = channel_profile(q, name="q")
    assert planted <= set(prof.outliers_kmedian.tolist())
    assert planted <= set(prof.outliers_abs.tolist())
    assert (
        set(outlier_features(q, FeatureRule.k_median(10))) == planted
    )  # only the planted ones stand out that far
    per_layer = layer_outlier_counts(llama_stats, FeatureRule.k_median(10))
    assert [lo.layer for lo in per_layer] == [0, 1]
    assert all(planted <= set(lo.channels) for lo in per_layer)
    top = top_outlier_features(llama_stats, FeatureRule.k_median(10), limit=50)
    hidden = [f for f in top if llama_stats.inputs[f.site].n_cols == 256]
    assert {f.channel for f in hidden} == planted  # in the hidden-size inputs, exactly the planted channels
    assert len({(f.site, f.channel) for f in top}) == len(top)  # q/k/v's shared input listed once


def test_profile_aligns_activation_and_weight_channels(llama_model, llama_stats):
    from studio.core.stats.tensor_stats import tensor_stats

    name = "model.layers.0.self_attn.q_proj.weight"
    with open_model(llama_model) as ck:
        ws = tensor_stats(ck, name, heatmap=False)
        cols = weight_columns(ck, name)
        w = ck.read(name)
    prof = channel_profile(llama_stats.inputs[name], ws.absmax_in, name=name)
    np.testing.assert_array_equal(prof.weight_absmax, ws.absmax_in)
    np.testing.assert_allclose(cols.absmax, np.abs(w).max(axis=0))
    np.testing.assert_allclose(cols.norm, np.linalg.norm(w.astype(np.float64), axis=0), rtol=1e-10)
    with pytest.raises(Exception, match="input channels"):
        channel_profile(llama_stats.inputs[name], np.ones(7))


def test_weight_columns_of_a_conv1d_weight(gpt2_model):
    name = "transformer.h.0.attn.c_attn.weight"  # stored (in, out)
    with open_model(gpt2_model) as ck:
        cols = weight_columns(ck, name)
        w = ck.read(name)
    np.testing.assert_allclose(cols.norm, np.linalg.norm(w.astype(np.float64), axis=1), rtol=1e-10)


def test_rules_and_histogram(llama_stats):
    st = _stats([1.0, 2.0, 6.0, 5.99, 100.0])
    assert outlier_features(st).tolist() == [2, 4]  # |x| ≥ 6: the threshold itself counts
    assert outlier_features(st, FeatureRule.k_median(5)).tolist() == [4]
    mean_mag = st.mean_magnitude
    assert (
        outlier_features(st, FeatureRule.k_mean(3)).tolist()
        == np.flatnonzero(st.channel_absmax >= 3 * mean_mag).tolist()
    )
    h = activation_histogram(llama_stats.inputs["model.layers.1.mlp.down_proj.weight"])
    assert h.total == CHUNKS * CTX * 768 and h.edges[0] == 0 and np.isinf(h.edges[-1])
    assert np.all(np.diff(h.edges[1:-1]) > 0)
    am = float(llama_stats.inputs["model.layers.1.mlp.down_proj.weight"].channel_absmax.max())
    assert h.share_above(am * 1.2) == 0.0 and 0 < h.share_above(am / 4) < 0.5


def test_smoothquant_factors():
    act, w = np.array([8.0, 1.0, 0.0, 4.0]), np.array([0.5, 2.0, 1.0, 0.0])
    r = smoothquant(act, w, 0.5)
    np.testing.assert_allclose(r.scales[:2], [np.sqrt(8.0) / np.sqrt(0.5), 1.0 / np.sqrt(2.0)])
    assert r.scales[2] == 1.0 and r.scales[3] == 1.0  # dead channels are left alone
    np.testing.assert_allclose(r.act_after[:2] * r.scales[:2], act[:2])
    np.testing.assert_allclose(r.weight_after[:2], w[:2] * r.scales[:2])
    # α = 0.5 gives both sides the same range per channel: sqrt(max|X| · max|W|)
    np.testing.assert_allclose(r.act_after[:2], r.weight_after[:2])
    live_a, live_w = np.array([8.0, 1.0, 2.0]), np.array([0.5, 2.0, 1.0])
    assert smoothquant(live_a, live_w, 1.0).act_spread == (8.0 / 2.0, 1.0)  # α = 1: activations flat
    assert smoothquant(live_a, live_w, 0.0).weight_spread[1] == 1.0  # α = 0: weights flat
    with pytest.raises(Exception, match="α"):
        smoothquant(act, w, 1.5)


def test_awq_saliency_is_column_norm_times_activation_rms():
    st = _stats([1, 1, 1, 1], rms=[1.0, 10.0, 1.0, 0.1])
    s = awq_saliency(np.array([1.0, 1.0, 5.0, 100.0]), st)
    np.testing.assert_allclose(s.per_channel, [1.0, 10.0, 5.0, 10.0])
    assert s.order[:2].tolist() in ([1, 3], [3, 1]) and s.top(0.25).size == 1
    assert s.top_mass(0.5) == pytest.approx(20.0 / 26.0)


def test_int8_matmul_and_the_fp16_decomposition():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g, dtype=torch.float64)
    w = torch.randn(32, 128, generator=g, dtype=torch.float64)
    sx = x.abs().amax(1, keepdim=True) / 127
    sw = w.abs().amax(1, keepdim=True) / 127
    naive = (torch.round(x / sx) @ torch.round(w / sw).T) * sx * sw.T
    torch.testing.assert_close(int8_matmul(x, w), naive)
    everything = torch.ones(128, dtype=torch.bool)
    torch.testing.assert_close(mixed_matmul(x, w, everything), x.half().double() @ w.half().double().T)
    x[:, 5] *= 50  # an outlier feature
    y = x @ w.T
    plain = (int8_matmul(x, w) - y).norm() / y.norm()
    keep = torch.zeros(128, dtype=torch.bool)
    keep[5] = True
    assert (mixed_matmul(x, w, keep) - y).norm() / y.norm() < plain / 5


def test_int8_analysis_on_the_tiny_model(llama_model, calib_text):
    from studio.core.calib import ActivationCollector, calibrate

    col = ActivationCollector()
    ana = Int8Analysis(col, sample_tokens=128)
    calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=3, device="cpu", consumers=[ana], collector=col)
    rep = ana.report()
    assert rep.sample_tokens == 128
    assert {s.layer for s in rep.layers} == {0, 1} and len(rep.layers) == 8  # 2 layers × 4 rules
    planted = set(read_factory_info(llama_model).outlier_channels)
    for s in rep.layers:
        assert s.err_mixed < s.err_int8  # keeping outliers in FP16 always helps here
    six = [s for s in rep.layers if s.rule == "|x| ≥ 6"]
    assert all(s.n_features >= len(planted) for s in six)
    by_rule = {s.rule: s.n_features for s in rep.layers if s.layer == 0}
    assert by_rule["≥ 3 × mean |x|"] >= by_rule["≥ 6 × mean |x|"] >= by_rule["≥ 10 × mean |x|"]
