"""The demo model (SmolLM2-135M) scanned exactly through a local two-worker Ray cluster: the same KL
of every (tensor, type) as in process. Slow (two exact scans of 30 layers on 2 cores): ``-m slow``."""

from __future__ import annotations

import pytest
import torch

from tests.core.cluster.conftest import local_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_the_demos_exact_scan_through_ray_equals_in_process(demo_dir, local_cluster):  # noqa: F811
    from studio.core.calib import calibrate, imatrix_from_stats
    from studio.core.calib.sensitivity import ScanSettings, scan_sensitivity
    from studio.core.model import open_model

    stats = calibrate(demo_dir, "builtin", n_chunks=2, device="cpu", dtype="float32", histogram=False)
    with open_model(demo_dir) as ck:
        im = imatrix_from_stats(stats, ck.info)
    st = ScanSettings(types=("Q4_K", "Q8_0"), exact=True, n_ctx=32, n_chunks=1, calib_chunks=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs
    try:
        here = scan_sensitivity(demo_dir, "builtin", st, imatrix=im)
    finally:
        torch.set_num_threads(threads)
    there = scan_sensitivity(demo_dir, "builtin", st, imatrix=im, executor=local_cluster)
    assert [t.name for t in there.tensors] == [t.name for t in here.tensors]
    n = 0
    for a, b in zip(here.tensors, there.tensors, strict=True):
        for q, c in a.by_type.items():
            assert b.by_type[q].kl == pytest.approx(c.kl, rel=1e-6, abs=1e-12), (a.name, q)
            n += 1
    assert n > 400  # 211 tensors × 2 types
