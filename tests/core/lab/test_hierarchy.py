"""The measured hierarchy picks a ~4-bit weights variant with a full cache and a wide one with a Q4_0 cache."""

from __future__ import annotations

import math

from studio.core.evaluate import VariantScore
from studio.core.lab.hierarchy import hierarchy


def _v(label, kld, bpw, kv, error=None):
    return VariantScore(label, label, 6.0, 0.1, kld, kld, kld, kld, 90.0, 1, bpw, 1, error, kv, 0)


def test_the_pair_and_the_ratio():
    vs = [
        _v("q2 f16", 0.3, 3.0, "f16"),
        _v("q4 f16", 0.02, 4.5, "f16"),
        _v("q4 q4_0", 0.05, 4.5, "q4_0"),  # both rounded: neither side of the comparison
        _v("q8 q4_0", 0.01, 8.5, "q4_0"),
        _v("f16 q4_0", 0.008, 16.0, "q4_0"),
    ]
    h = hierarchy(vs)
    assert (h.weights_label, h.kv_label) == ("q4 f16", "f16 q4_0")
    assert math.isclose(h.ratio, 0.4)
    assert "the weights are 2.5× as sensitive" in h.text


def test_none_without_both_sides():
    assert hierarchy([_v("q4 f16", 0.02, 4.5, "f16")]) is None
    assert hierarchy([_v("q4 f16", 0.02, 4.5, "f16"), _v("q8 q4_0", 0.0, 8.5, "q4_0", error="boom")]) is None
