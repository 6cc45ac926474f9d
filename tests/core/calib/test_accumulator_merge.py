"""Merging per-batch statistics in order gives, bit for bit, what one accumulator fed every batch
gives (what a cluster's calibration relies on: each chunk's sums are made on a worker)."""

from __future__ import annotations

import numpy as np
import torch

from studio.core.calib.accumulators import HiddenAccumulator, InputAccumulator, Reduction, merge_input_stats


def _batches(seed: int, n: int, rows: int, cols: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, cols, generator=g) * (1 + 10 * i) for i in range(n)]


def test_merged_input_stats_equal_one_accumulator_bit_for_bit():
    xs = _batches(0, 5, 37, 96)
    one = InputAccumulator(96, "cpu")
    parts = []
    for x in xs:
        r = Reduction.of(x)
        one.add(r)
        acc = InputAccumulator(96, "cpu")
        acc.add(r)
        parts.append(acc.result())
    want, got = one.result(), merge_input_stats(parts)
    for f in ("count", "sum_sq", "absmax", "sum_abs", "hist"):
        assert np.array_equal(getattr(want, f), getattr(got, f)), f


def test_merged_hidden_sums_equal_one_accumulator_bit_for_bit():
    hs = [h.reshape(1, -1, 64) for h in _batches(1, 4, 29, 64)]
    one = HiddenAccumulator(3, 64, "cpu")
    merged = HiddenAccumulator(3, 64, "cpu")
    for h in hs:
        one.add(h)
        part = HiddenAccumulator(3, 64, "cpu")
        part.add(h)
        merged.merge(part)
    a, b = one.result(), merged.result()
    assert (a.layer, a.tokens, a.mean_norm, a.max_norm, a.rms) == (
        b.layer,
        b.tokens,
        b.mean_norm,
        b.max_norm,
        b.rms,
    )
    assert np.array_equal(a.absmax, b.absmax)
