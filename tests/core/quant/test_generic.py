"""Generic INT/FP8 quantizers used by the inspector's what-if analysis."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.quant import generic

GRANULARITIES = [
    ("tensor", None),
    ("channel", None),
    ("group", 32),
    ("group", 64),
    ("group", 128),
    ("group", 256),
]


def weights(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 512), dtype=np.float32)
    w[3] *= 10  # one loud channel, so per-channel scales matter
    return w


@pytest.mark.parametrize(("gran", "gs"), GRANULARITIES, ids=[f"{g}{s or ''}" for g, s in GRANULARITIES])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("bits", [16, 8, 6, 5, 4, 3, 2])
def test_int_levels_scales_and_error_bound(bits: int, symmetric: bool, gran: str, gs: int | None) -> None:
    w = weights()
    r = generic.quantize_int(w, bits, symmetric=symmetric, granularity=gran, group_size=gs)
    assert r.dequantized.shape == w.shape and r.dequantized.dtype == np.float32
    groups = {"tensor": (1, 1), "channel": (16, 1)}.get(gran, (16, 512 // (gs or 1)))
    assert r.scales.shape == groups
    if symmetric:
        assert r.zero_points is None
        assert r.codes.min() >= -(2 ** (bits - 1)) and r.codes.max() <= 2 ** (bits - 1) - 1
    else:
        assert r.zero_points is not None and r.zero_points.shape == groups
        assert r.codes.min() >= 0 and r.codes.max() <= 2**bits - 1
    # Round-to-nearest inside the range: every value is within half a step of its reconstruction.
    step = np.broadcast_to(
        r.scales.reshape(groups[0], groups[1], 1), (groups[0], groups[1], w.size // (groups[0] * groups[1]))
    )
    err = np.abs(r.dequantized - w).reshape(step.shape)
    # plus float32 rounding of w/scale and q*scale, which matters next to the tiny steps of 16 bits
    ulp = 4 * np.finfo(np.float32).eps * np.abs(w).reshape(step.shape)
    assert np.all(err <= step * 0.5 * (1 + 1e-5) + ulp + 1e-7)


def test_finer_granularity_and_more_bits_reduce_error() -> None:
    w = weights(1)

    def mse(**kw) -> float:
        return float(np.mean((generic.quantize_int(w, **kw).dequantized - w) ** 2))

    assert (
        mse(bits=4, granularity="tensor")
        > mse(bits=4, granularity="channel")
        > mse(bits=4, granularity="group", group_size=32)
    )
    assert (
        mse(bits=2, granularity="channel")
        > mse(bits=3, granularity="channel")
        > mse(bits=4, granularity="channel")
        > mse(bits=8, granularity="channel")
    )


def test_int4_symmetric_known_values() -> None:
    w = np.array([[-7.0, -3.2, 0.0, 0.74, 3.5, 7.0] + [0.0] * 26], np.float32)
    r = generic.quantize_int(w, 4, granularity="channel")
    assert r.scales[0, 0] == np.float32(1.0)
    assert r.codes[0, :6].tolist() == [-7, -3, 0, 1, 4, 7]  # rint: 3.5 -> 4 (ties to even)
    r2 = generic.quantize_int(w, 4, symmetric=False, granularity="channel")
    assert r2.zero_points[0, 0] == 8 and np.isclose(r2.scales[0, 0], 14 / 15)  # rint(7.5) = 8


def test_zero_groups_and_empty_tensors() -> None:
    z = np.zeros((4, 64), np.float32)
    for sym in (True, False):
        r = generic.quantize_int(z, 4, symmetric=sym, granularity="group", group_size=32)
        assert np.array_equal(r.dequantized, z) and np.all(r.scales == 1)
    e = generic.quantize_int(np.zeros((0, 64), np.float32), 8)
    assert e.dequantized.shape == (0, 64)
    assert generic.quantize_fp8(np.zeros((0, 8), np.float32)).dequantized.shape == (0, 8)


def test_bad_arguments_are_refused() -> None:
    w = weights()
    for bad in (1, 17):
        with pytest.raises(QuantizationError, match=f"INT{bad}"):
            generic.quantize_int(w, bad)
    with pytest.raises(QuantizationError, match="group size"):
        generic.quantize_int(np.ones((2, 100), np.float32), 4, granularity="group", group_size=64)
    with pytest.raises(QuantizationError, match="Group size"):
        generic.quantize_int(w, 4, granularity="group", group_size=48)
    with pytest.raises(QuantizationError, match="NaN"):
        generic.quantize_int(np.array([[1.0, np.nan]], np.float32), 8)
    with pytest.raises(QuantizationError, match="FP8"):
        generic.quantize_fp8(w, "e3m4")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_numpy_rounding_equals_torch_cast(fmt: str) -> None:
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8 dtypes")
    rng = np.random.default_rng(5)
    fmax = generic.FP8_FORMATS[fmt][3]
    v = np.concatenate(
        [
            (rng.standard_normal(50_000) * fmax / 8).astype(np.float32),
            rng.uniform(-fmax, fmax, 50_000).astype(np.float32),
            (rng.standard_normal(50_000) * 2.0**-8).astype(np.float32),  # subnormal range
            np.array([0.0, fmax, -fmax, 2.0**-9, 2.0**-10, 3 * 2.0**-10], np.float32),
        ]
    )
    dt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    want = torch.from_numpy(v).to(dt).to(torch.float32).numpy()
    assert np.array_equal(generic._fp8_round_numpy(v, fmt), want)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize(("gran", "gs"), [("tensor", None), ("channel", None), ("group", 128)])
def test_fp8_scales_map_max_to_format_max(fmt: str, gran: str, gs: int | None) -> None:
    w = weights(2)
    r = generic.quantize_fp8(w, fmt, granularity=gran, group_size=gs)
    fmax = generic.FP8_FORMATS[fmt][3]
    assert np.abs(r.codes).max() == fmax
    rel = np.abs(r.dequantized - w) / np.maximum(np.abs(w), 1e-3)
    assert np.median(rel) < (0.04 if fmt == "e4m3" else 0.08)
    assert r.bits_per_weight > 8.0


def test_torch_input_is_accepted() -> None:
    torch = pytest.importorskip("torch")
    w = weights(3)
    a = generic.quantize_int(torch.from_numpy(w), 8)
    b = generic.quantize_int(w, 8)
    assert np.array_equal(a.dequantized, b.dequantized)


def test_complex_and_object_inputs_are_refused_not_truncated() -> None:
    import torch

    for bad in (
        np.ones((2, 64), complex),
        np.array([[None] * 64]),
        torch.ones((2, 64), dtype=torch.complex64),
    ):
        with pytest.raises(QuantizationError, match="only real numbers"):
            generic.quantize_int(bad, 8)
        with pytest.raises(QuantizationError, match="only real numbers"):
            generic.quantize_fp8(bad)
    w = np.arange(-32, 32, dtype=np.int16).reshape(2, 32).astype(">i2")  # ints, big-endian: fine
    assert np.array_equal(
        generic.quantize_int(w, 8).dequantized, generic.quantize_int(w.astype(np.float32), 8).dequantized
    )
