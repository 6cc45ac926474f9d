"""Error metrics between a tensor and its reconstruction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.quant import metrics
from studio.core.quant.metrics import error_metrics


def test_known_values() -> None:
    ref = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    app = np.array([[3.0, 5.0], [0.0, -1.0]], np.float32)
    m = error_metrics(ref, app)
    assert m.mse == pytest.approx(0.5)
    assert m.max_abs_error == 1.0
    assert m.snr_db == pytest.approx(10 * math.log10(25 / 2))
    assert m.cosine == pytest.approx((9 + 20) / (5 * math.sqrt(9 + 25 + 1)))
    assert m.per_channel_mse.tolist() == [0.5, 0.5]
    assert m.count == 4


def test_exact_copy_and_scaled_copy() -> None:
    x = np.random.default_rng(0).standard_normal((8, 33)).astype(np.float32)
    m = error_metrics(x, x.copy())
    assert m.mse == 0 and m.snr_db == math.inf and m.cosine == pytest.approx(1.0) and m.max_abs_error == 0
    assert error_metrics(x, -x).cosine == pytest.approx(-1.0)
    assert error_metrics(x, 2 * x).cosine == pytest.approx(1.0)
    assert error_metrics(x, 2 * x).snr_db == pytest.approx(0.0, abs=1e-9)  # error as loud as the signal


def test_per_channel_error_finds_the_bad_row() -> None:
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    y = x.copy()
    y[11] += 0.5
    m = error_metrics(x, y)
    assert int(np.argmax(m.per_channel_mse)) == 11
    assert m.per_channel_mse[11] == pytest.approx(0.25)


def test_chunked_accumulation_equals_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 40)).astype(np.float32)
    y = x + rng.standard_normal((50, 40)).astype(np.float32) * 0.1
    whole = error_metrics(x, y)
    monkeypatch.setattr(metrics, "_CHUNK_ELEMS", 80)  # 2 rows per step
    parts = error_metrics(x, y)
    assert parts.mse == pytest.approx(whole.mse, rel=1e-12)
    assert parts.cosine == pytest.approx(whole.cosine, rel=1e-12)
    assert np.allclose(parts.per_channel_mse, whole.per_channel_mse)
    e = (y.astype(np.float64) - x) ** 2
    assert whole.mse == pytest.approx(float(e.mean()), rel=1e-12)


def test_edge_cases() -> None:
    z = np.zeros((3, 4), np.float32)
    assert error_metrics(z, z).cosine == 1.0
    m = error_metrics(z, np.ones((3, 4), np.float32))
    assert m.snr_db == -math.inf and m.cosine == 0.0
    e = error_metrics(np.zeros((0, 4)), np.zeros((0, 4)))
    assert e.count == 0 and e.mse == 0.0
    s = error_metrics(np.float32(2.0), np.float32(1.5))
    assert s.mse == 0.25 and s.per_channel_mse.shape == (1,)
    one_d = error_metrics(np.arange(4.0), np.arange(4.0) + 1)
    assert one_d.per_channel_mse.shape == (4,)
    with pytest.raises(QuantizationError, match="shapes"):
        error_metrics(z, np.zeros((4, 3)))
    with pytest.raises(QuantizationError, match="NaN"):
        error_metrics(np.array([1.0, np.nan]), np.array([1.0, 2.0]))


def test_torch_inputs() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    m = error_metrics(x, x.to(torch.bfloat16))
    assert 0 < m.mse < 1e-3 and m.cosine > 0.999


def test_complex_inputs_are_refused_not_truncated() -> None:
    import torch

    a = np.ones((2, 8))
    with pytest.raises(QuantizationError, match="real numbers, not a tensor of dtype complex128"):
        error_metrics(a, a + 1j)  # the imaginary error used to vanish: MSE 0, SNR inf
    with pytest.raises(QuantizationError, match="complex64"):
        error_metrics(torch.ones((2, 8), dtype=torch.complex64), torch.ones((2, 8)))
    assert error_metrics(a.astype(">f8"), a.astype(np.int8)).mse == 0.0
