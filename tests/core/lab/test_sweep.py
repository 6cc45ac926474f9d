"""Bit-width sweep on the factory's tiny Llama: the quality order the lab teaches, and rows equal to the quantizers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.lab.sweep import SWEEP_BITS, SweepRow, find_cliffs, sweep_array, sweep_tensor
from studio.core.model import open_model
from studio.core.quant import generic
from studio.core.quant.metrics import error_metrics

DOWN = "model.layers.0.mlp.down_proj.weight"  # (256, 768): every group size divides its rows


@pytest.fixture(scope="module")
def swept(llama_model):
    with open_model(llama_model) as ck:
        return sweep_tensor(ck, DOWN), ck.read(DOWN)


def test_per_channel_snr_rises_with_bits(swept):
    result, _ = swept
    for sym in (True, False):
        snr = [r.snr_db for r in result.series("per-channel", None, sym)]
        assert len(snr) == len(SWEEP_BITS)
        assert all(b > a for a, b in zip(snr, snr[1:], strict=False)), snr


def test_at_four_bits_smaller_groups_win(swept):
    result, _ = swept
    for sym in (True, False):
        at4 = {
            r.group: r.snr_db for r in result.rows if r.kind == "int" and r.bits == 4 and r.symmetric == sym
        }
        assert at4[32] > at4[64] > at4[128] > at4[256], at4
        per_channel = next(r for r in result.series("per-channel", None, sym) if r.bits == 4)
        assert at4[256] > per_channel.snr_db


def test_rows_are_the_quantizers_numbers(swept):
    result, x = swept
    row = next(r for r in result.rows if r.scheme == "INT3 asym g64")
    ref = generic.quantize_int(x, 3, symmetric=False, granularity="group", group_size=64)
    m = error_metrics(x, ref.dequantized)
    assert (row.bits, row.granularity, row.group, row.symmetric) == (3, "group", 64, False)
    assert row.snr_db == pytest.approx(m.snr_db, rel=1e-12) and row.mse == pytest.approx(m.mse, rel=1e-12)
    assert row.bpw == pytest.approx(3 + 32 / 64)  # 16-bit scale and zero point per 64 values
    from studio.core.quant.blocks import dequantize, quantize

    q4k = next(r for r in result.rows if r.scheme == "Q4_K")
    y = dequantize(quantize(x, "Q4_K"), "Q4_K", x.shape)
    assert q4k.snr_db == pytest.approx(error_metrics(x, y).snr_db, rel=1e-12)
    assert (q4k.bpw, q4k.group, q4k.symmetric, q4k.applied) == (4.5, 32, False, None)
    d = result.to_dict()
    assert set(d["rows"][0]) >= {
        "bits",
        "granularity",
        "group",
        "symmetric",
        "snr_db",
        "mse",
        "cosine",
        "bpw",
    }
    assert {r["granularity"] for r in d["rows"]} == {"per-tensor", "per-channel", "group"}


def test_rows_that_do_not_fit_fall_back_or_are_skipped(odd_hidden_model):
    name = "model.layers.0.self_attn.q_proj.weight"  # rows of 320 values
    with open_model(odd_hidden_model) as ck:
        result = sweep_tensor(ck, name, bits=(4,), gguf_types=("Q4_K", "Q8_0"), fp8=False)
    groups = {r.group for r in result.rows if r.kind == "int"}
    assert groups == {None, 32, 64}
    assert any("groups of 128" in s for s in result.skipped) and any(
        "groups of 256" in s for s in result.skipped
    )
    q4k = next(r for r in result.rows if r.scheme == "Q4_K")
    assert q4k.applied == "Q5_0" and q4k.bpw == pytest.approx(5.5)  # llama.cpp's fallback for 320


def test_cliff_is_where_a_series_crosses_the_line():
    def row(bits: int, snr: float) -> SweepRow:
        return SweepRow(f"INT{bits}", "int", bits, "per-channel", None, True, float(bits), 0.0, snr, 1.0)

    (c,) = find_cliffs([row(2, 2.0), row(3, 8.0), row(4, 14.0), row(8, 38.0)], line_db=12.0)
    assert c.lowest_good_bits == 4
    assert c.bpw_at_line == pytest.approx(3 + 4 / 6)  # 8 → 14 dB between 3 and 4 bpw
    (none,) = find_cliffs([row(2, 1.0), row(3, 5.0)], line_db=12.0)
    assert none.lowest_good_bits is None and none.bpw_at_line is None


def test_bad_tensors_are_refused(llama_model):
    with open_model(llama_model) as ck, pytest.raises(QuantizationError, match="no tensor called"):
        sweep_tensor(ck, "model.nope.weight")
    with pytest.raises(QuantizationError, match="NaN"):
        sweep_array(np.array([[1.0, math.nan]], np.float32))
