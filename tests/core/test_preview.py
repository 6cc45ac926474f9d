"""Quantization preview: its numbers are the block quantizers' and the metrics module's, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.preview import generic_schemes, preview_array, preview_schemes, preview_tensor
from studio.core.quant.blocks import dequantize, quantize
from studio.core.quant.generic import quantize_fp8, quantize_int
from studio.core.stats.metrics import error_metrics


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
