"""The seed's sensitivity hierarchy, measured: weights at 4 bits against the KV cache at 4 bits.

From one evaluation that scored a ~4-bit GGUF with a full-precision KV cache and an 8-bit (or wider)
GGUF with a Q4_0 KV cache (``evaluate(..., kv_types=("f16", "q4_0"))``), the two mean KL divergences
say which of the two roundings costs this model more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Hierarchy", "WEIGHT_4BIT_BPW", "hierarchy"]

WEIGHT_4BIT_BPW = (4.0, 5.5)  # Q4_0 4.5, Q4_K_M ~4.9: "weights at 4 bits" with their scales
FULL_KV = ("f32", "f16")


@dataclass(frozen=True)
class Hierarchy:
    """The two variants compared and their mean KL divergences (nats per token)."""

    weights_label: str
    weights_bpw: float
    weights_kl: float
    kv_label: str
    kv_kl: float

    @property
    def ratio(self) -> float:
        """How many times the 4-bit KV cache's KL the 4-bit weights' is (inf when the weights' is 0)."""
        return self.kv_kl / self.weights_kl if self.weights_kl > 0 else math.inf

    @property
    def text(self) -> str:
        """One sentence for the Evaluate page."""
        head = (
            f"Measured on this model (mean KL): weights at 4 bits ({self.weights_label}, "
            f"{self.weights_bpw:.2f} bpw) {self.weights_kl:.4g}; KV cache at 4 bits ({self.kv_label}) "
            f"{self.kv_kl:.4g}"
        )
        r = self.ratio
        if not math.isfinite(r):
            return head + "."
        if r >= 1:
            return head + f": the KV cache is {r:.1f}× as sensitive as the weights."
        return head + f": here the weights are {1 / r:.1f}× as sensitive as the KV cache."


def hierarchy(variants: Any) -> Hierarchy | None:
    """The pair from ``EvalReport.variants``, or None when the evaluation did not score both."""
    ok = [v for v in variants if not v.error and math.isfinite(v.kld_mean) and math.isfinite(v.bpw)]
    lo, hi = WEIGHT_4BIT_BPW
    weights = [v for v in ok if v.kv_type in FULL_KV and lo <= v.bpw < hi]
    kv = [v for v in ok if v.kv_type == "q4_0" and v.bpw >= 8.0]
    if not weights or not kv:
        return None
    w = min(weights, key=lambda v: abs(v.bpw - 4.5))
    k = max(kv, key=lambda v: v.bpw)  # the widest weights: the KV cache's rounding alone
    return Hierarchy(w.label, w.bpw, w.kld_mean, k.label, k.kld_mean)
