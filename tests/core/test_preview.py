"""Quantization preview: its numbers are the block quantizers' and the metrics module's, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.preview import generic_schemes, preview_array, preview_schemes, preview_tensor
from studio.core.quant.blocks import dequantize, quantize
from studio.core.quant.generic import quantize_fp8, quantize_int
from studio.core.quant.metrics import error_metrics


def _w(rows=32, cols=512, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    x[3] *= 20  # one loud output channel
    return x


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q4_0", "Q6_K"])
def test_block_preview_matches_quantize_dequantize(qtype):
    x = _w()
    r = preview_array(x, qtype)
    y = dequantize(quantize(x, qtype), qtype, x.shape)
    m = error_metrics(x, y)
    assert r.applied == qtype and r.fallback_reason is None
    assert r.snr_db == m.snr_db and r.cosine == m.cosine
    np.testing.assert_array_equal(r.metrics.per_channel_mse, m.per_channel_mse)
    np.testing.assert_array_equal(r.original_hist.edges, r.dequantized_hist.edges)
    np.testing.assert_array_equal(r.original_hist.counts, np.histogram(x, bins=r.original_hist.edges)[0])
    np.testing.assert_array_equal(
        r.dequantized_hist.counts, np.histogram(y, bins=r.dequantized_hist.edges)[0]
    )
    np.testing.assert_array_equal(r.error_hist.counts, np.histogram(y - x, bins=r.error_hist.edges)[0])
    assert r.worst_channels[0].index == int(np.argmax(m.per_channel_mse))
    assert [c.mse for c in r.worst_channels] == sorted((c.mse for c in r.worst_channels), reverse=True)


def test_fallback_for_rows_the_block_cannot_take():
    x = _w(8, 320)
    r = preview_array(x, "Q4_K")
    assert r.applied == "Q5_0" and "320" in r.fallback_reason
    y = dequantize(quantize(x, "Q5_0"), "Q5_0", x.shape)
    assert r.snr_db == error_metrics(x, y).snr_db


def test_generic_schemes():
    x = _w()
    assert "INT4 sym g128" in generic_schemes() and "Q4_K" in preview_schemes()
    r = preview_array(x, "INT4 sym g128")
    y = quantize_int(x, 4, symmetric=True, granularity="group", group_size=128).dequantized
    assert r.snr_db == error_metrics(x, y).snr_db and r.bits_per_weight == pytest.approx(4.125)
    r = preview_array(x, "FP8 E4M3 channel")
    y = quantize_fp8(x, "e4m3", granularity="channel").dequantized
    assert r.snr_db == error_metrics(x, y).snr_db
    with pytest.raises(QuantizationError):
        preview_array(x, "INT5 sym banana")


def test_nonfinite_tensor_is_refused_with_its_name():
    x = _w(4, 256)
    x[1, 2] = np.nan
    with pytest.raises(QuantizationError, match="blk.0.w"):
        preview_array(x, "Q8_0", name="blk.0.w")


def test_preview_of_a_checkpoint_tensor(llama_model):
    from studio.core.model import open_model

    with open_model(llama_model) as ckpt:
        name = next(t.name for t in ckpt.info.tensors if t.name.endswith("self_attn.o_proj.weight"))
        r = preview_tensor(ckpt, name, "Q8_0")
        x = ckpt.read(name)
        assert r.snr_db == error_metrics(x, dequantize(quantize(x, "Q8_0"), "Q8_0", x.shape)).snr_db


def test_gpt2_conv1d_is_previewed_in_gguf_row_order(gpt2_model):
    from studio.core.model import open_model

    with open_model(gpt2_model) as ckpt:
        name = next(t.name for t in ckpt.info.tensors if t.name.endswith("attn.c_attn.weight"))
        x = ckpt.read(name)  # stored (in, out)
        r = preview_tensor(ckpt, name, "Q8_0")
        assert r.shape == (x.shape[1], x.shape[0])
        xt = np.ascontiguousarray(x.T)
        assert r.snr_db == error_metrics(xt, dequantize(quantize(xt, "Q8_0"), "Q8_0", xt.shape)).snr_db


def _importance(cols=512, seed=1):
    """Skewed column importance, as real activations give: a few channels carry most of it."""
    rng = np.random.default_rng(seed)
    w = rng.exponential(1.0, cols).astype(np.float32)
    w[rng.choice(cols, 8, replace=False)] *= 200
    return w


@pytest.mark.parametrize("qtype", ["Q4_K", "Q3_K", "Q4_0"])
def test_preview_with_an_imatrix_quantizes_with_it_and_weights_the_error(qtype):
    x, w = _w(), _importance()
    r = preview_array(x, qtype, imatrix=w)
    y = dequantize(quantize(x, qtype, w), qtype, x.shape)
    assert r.imatrix_used and r.snr_db == error_metrics(x, y).snr_db  # the quantizer got the imatrix
    e = (y - x).astype(np.float64) ** 2
    w64 = w.astype(np.float64)
    assert r.weighted_mse == pytest.approx(float((e @ w64).mean() / w64.sum()), rel=1e-9)
    plain = preview_array(x, qtype)
    assert plain.weighted_mse is None and not plain.imatrix_used
    # what the imatrix is for: the error the layer's output sees is lower with it
    y0 = dequantize(quantize(x, qtype), qtype, x.shape)
    without = float((((y0 - x).astype(np.float64) ** 2) @ w.astype(np.float64)).mean() / w.sum())
    assert r.weighted_mse < without


def test_preview_imatrix_per_expert_and_bad_sizes():
    x = _w(32, 256)
    w = np.stack([_importance(256, 1), _importance(256, 2)])  # two experts of 16 rows each
    r = preview_array(x, "Q4_K", imatrix=w)
    y = np.concatenate(
        [dequantize(quantize(x[e * 16 : (e + 1) * 16], "Q4_K", w[e]), "Q4_K", (16, 256)) for e in range(2)]
    )
    assert r.snr_db == error_metrics(x, y).snr_db
    with pytest.raises(QuantizationError, match="importance matrix"):
        preview_array(x, "Q4_K", imatrix=np.ones(100, np.float32))


def test_preview_of_a_checkpoint_tensor_with_its_imatrix_entry(llama_model):
    from studio.core.calib.imatrix import Imatrix, ImatrixEntry
    from studio.core.model import open_model

    with open_model(llama_model) as ckpt:
        name = next(t.name for t in ckpt.info.tensors if t.name.endswith("layers.1.mlp.down_proj.weight"))
        x = ckpt.read(name)
        sums = _importance(x.shape[1])[None] * 64
        im = Imatrix(
            {
                "blk.1.ffn_down.weight": ImatrixEntry(
                    "blk.1.ffn_down.weight", sums, np.array([64.0], np.float32)
                )
            }
        )
        r = preview_tensor(ckpt, name, "Q4_K", imatrix=im)  # looked up under its GGUF name
        y = dequantize(quantize(x, "Q4_K", im["blk.1.ffn_down.weight"]), "Q4_K", x.shape)
        assert r.imatrix_used and r.snr_db == error_metrics(x, y).snr_db
        emb = next(t.name for t in ckpt.info.tensors if t.name.endswith("embed_tokens.weight"))
        with pytest.raises(QuantizationError, match="no entry"):
            preview_tensor(ckpt, emb, "Q4_K", imatrix=im)
