"""The proxy sensitivity scan judged on real weights: the demo's held-out pairs against their exact KL.

Slow (a calibration and a proxy scan of SmolLM2-135M, a few minutes on 2 cores): ``-m slow``.
"""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_the_proxy_predicts_the_exact_kl_of_held_out_pairs_on_the_demo(demo_dir):
    from studio.core.calib import calibrate, imatrix_from_stats
    from studio.core.calib.sensitivity import ScanSettings, scan_sensitivity
    from studio.core.model import open_model

    stats = calibrate(demo_dir, "builtin", n_chunks=8, device="cpu", dtype="float32", histogram=False)
    with open_model(demo_dir) as ck:
        im = imatrix_from_stats(stats, ck.info)
    scan = scan_sensitivity(demo_dir, "builtin", ScanSettings(calib_chunks=8), imatrix=im)
    assert scan.mode == "proxy" and scan.check is not None and len(scan.check.pairs) >= 10
    # measured on the demo (2 × 128 tokens of the built-in text): median |ln ratio| ≈ 0.18 (a factor
    # 1.2), rank correlation ≈ 0.77 over 14 held-out pairs, KL from 1e-6 to 1e-2
    assert scan.check.median_abs_log_ratio < math.log(1.5), scan.check.pairs
    assert scan.check.spearman > 0.6, scan.check.pairs
    # the demo's weights come from a Q4_1 file: at Q4_1 and Q5_1 they come back exactly (KL 0, nothing
    # to predict), as ProxyCheck's own figures leave out
    within = [abs(math.log(p / e)) < math.log(3) for _, _, e, p in scan.check.pairs if e > 0 and p > 0]
    assert len(within) >= 8 and sum(within) >= 0.8 * len(within), scan.check.pairs
