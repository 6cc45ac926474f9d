"""The Lab sweep shows every type llama-quantize writes as a point (issue 24), the i-quants that need an
importance matrix with a flat one."""

from __future__ import annotations

import numpy as np

from studio.core.lab.sweep import sweep_array
from studio.core.quant.types import QTYPES

NEW = (
    "IQ1_S",
    "IQ1_M",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "TQ1_0",
    "TQ2_0",
    "MXFP4",
    "Q1_0",
    "Q2_0",
)


def test_the_sweep_has_a_point_for_every_low_bit_type():
    x = np.random.default_rng(3).standard_normal((8, 512)).astype(np.float32)
    r = sweep_array(x, bits=(4,), groups=(), fp8=False)
    rows = {row.scheme: row for row in r.rows if row.kind == "gguf"}
    assert set(NEW) <= set(rows) and set(rows) == {q for q in QTYPES if q != "F32"}
    for q in NEW:
        assert rows[q].bpw == QTYPES[q].bits_per_weight and rows[q].applied is None, q
        assert np.isfinite(rows[q].snr_db) and rows[q].snr_db > 0, q
    # more bits, less error along the i-quant ladder
    ladder = ["IQ1_S", "IQ2_XXS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"]
    snr = [rows[q].snr_db for q in ladder]
    assert snr == sorted(snr), dict(zip(ladder, snr, strict=True))
