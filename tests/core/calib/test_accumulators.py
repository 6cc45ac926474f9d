"""The per-channel reductions: the compiled CPU kernel, the torch path (CUDA/MPS) and numpy agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.core.calib import accumulators as acc
from studio.core.calib.accumulators import HiddenAccumulator, InputAccumulator, Reduction, hist_edges


def _rows(seed=0, rows=300, cols=96):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[:, 7] *= 40  # an outlier feature
    x[5, :3] = 0.0
    x[9, 4] = 3e-30  # below the first bin
    x[11, 5] = -7e5  # above the last
    return x


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setattr(acc, "_compiled", lambda _x: False)
    return request.param


def test_reductions_equal_numpy(path):
    xs = [_rows(0), _rows(1)]
    a = InputAccumulator(96, "cpu")
    for x in xs:
        r = Reduction.of(torch.from_numpy(x))
        assert r.finite
        a.add(r)
    st = a.result()
    x = np.concatenate(xs).astype(np.float64)
    np.testing.assert_allclose(st.sum_sq[0], (x * x).sum(0), rtol=1e-5)
    np.testing.assert_allclose(st.sum_abs[0], np.abs(x).sum(0), rtol=1e-5)
    np.testing.assert_array_equal(st.absmax[0], np.abs(x).max(0).astype(np.float32))
    assert st.count.tolist() == [600]
    want, _ = np.histogram(np.abs(x.astype(np.float32)), bins=hist_edges())
    np.testing.assert_array_equal(st.hist, want)  # every element in its bin, exactly


def test_non_finite_rows_are_flagged(path):
    x = _rows()
    x[3, 2] = np.nan
    assert not Reduction.of(torch.from_numpy(x)).finite
    x[3, 2] = np.inf
    assert not Reduction.of(torch.from_numpy(x)).finite
    assert Reduction.of(torch.from_numpy(_rows())).finite


def test_hidden_accumulator(path):
    h = _rows(2, 64, 32)
    a = HiddenAccumulator(0, 32, "cpu")
    a.add(torch.from_numpy(h[None]))
    a.add(torch.from_numpy(h[None]))
    r = a.result()
    norms = np.linalg.norm(h.astype(np.float64), axis=1)
    assert r.tokens == 128
    assert r.mean_norm == pytest.approx(norms.mean(), rel=1e-6)
    assert r.max_norm == pytest.approx(norms.max(), rel=1e-6)
    assert r.rms == pytest.approx(np.sqrt((h.astype(np.float64) ** 2).mean()), rel=1e-6)
    np.testing.assert_array_equal(r.absmax, np.abs(h).max(0))


def test_half_precision_rows_are_reduced_in_float32(path):
    x = _rows(3, 40, 16)
    r = Reduction.of(torch.from_numpy(x).to(torch.bfloat16))
    xb = torch.from_numpy(x).to(torch.bfloat16).float().numpy().astype(np.float64)
    np.testing.assert_allclose(r.sum_sq.double().numpy(), (xb * xb).sum(0), rtol=1e-5)


def test_kernel_sums_stay_float64_accurate():
    # the per-channel totals stay within 1e-6 of float64 over long, skewed inputs
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((1000, 200)) * rng.lognormal(0, 3, 200)).astype(np.float32)
    x[70:90, 3] = 3e20  # finite, but its float32 square overflows: still finite, and exact
    r = Reduction.of(torch.from_numpy(x))
    assert r.finite
    d = x.astype(np.float64)
    np.testing.assert_allclose(r.sum_sq.numpy(), (d * d).sum(0), rtol=1e-6)
    np.testing.assert_allclose(r.sum_abs.numpy(), np.abs(d).sum(0), rtol=1e-6)
