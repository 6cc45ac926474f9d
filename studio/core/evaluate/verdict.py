"""Verdicts in plain words beside a perplexity delta: excellent, good, acceptable, something went wrong.

The rules of thumb (absolute): ΔPPL = PPL(variant) − PPL(original) below 0.5 is excellent, 0.5–1
good, 1–2 acceptable, above 2 something went wrong. They were made on 7-8B models scored on
WikiText-2, whose perplexities sit near ``REFERENCE_PPL`` = 6 (Llama-2-7B 5.47, Llama-3-8B ~6.1).

A perplexity delta only means the same thing at the same scale: +2 on a model at 6 is a third worse,
+2 on a tiny model at 60 is 3 % worse. The relative form scales the thresholds with the original's
perplexity: ΔPPL / PPL(original) below 0.5/6 ≈ 8.3 % is excellent, below 1/6 ≈ 16.7 % good, below
2/6 ≈ 33.3 % acceptable. It is the natural unit because ΔPPL / PPL ≈ the change of the mean
cross-entropy in nats per token, which does not depend on the model's scale (a model at exactly the
reference perplexity gets the same verdict in both forms).

Which form the verdict uses: the absolute one while the original's perplexity is within a factor of
two of the reference (3 to 12), where the two forms differ by at most a factor of two in ΔPPL; the
relative one outside, where the absolute thresholds lose their meaning.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

__all__ = [
    "ABSOLUTE_THRESHOLDS",
    "REFERENCE_PPL",
    "Judgement",
    "Verdict",
    "judge",
    "verdict_of",
]

REFERENCE_PPL = 6.0
ABSOLUTE_THRESHOLDS: tuple[float, float, float] = (0.5, 1.0, 2.0)
ABSOLUTE_RANGE = (REFERENCE_PPL / 2, REFERENCE_PPL * 2)


class Verdict(str, Enum):
    """A rule-of-thumb judgement of a perplexity delta."""

    EXCELLENT = "excellent"
    GOOD = "good"
    ACCEPTABLE = "acceptable"
    WRONG = "something went wrong"


def verdict_of(delta: float, thresholds: tuple[float, float, float]) -> Verdict:
    """The verdict for ``delta`` against (excellent, good, acceptable) upper bounds; NaN is WRONG."""
    if not math.isfinite(delta):
        return Verdict.WRONG
    for limit, v in zip(thresholds, (Verdict.EXCELLENT, Verdict.GOOD, Verdict.ACCEPTABLE), strict=True):
        if delta < limit:
            return v
    return Verdict.WRONG


@dataclass(frozen=True)
class Judgement:
    """Both forms of the verdict for one variant, and which one speaks."""

    delta_ppl: float
    delta_pct: float  # 100 × ΔPPL / PPL(original)
    absolute: Verdict
    relative: Verdict
    form: str  # "absolute" or "relative"

    @property
    def verdict(self) -> Verdict:
        """The verdict of the form that applies to this model's scale."""
        return self.absolute if self.form == "absolute" else self.relative

    @property
    def text(self) -> str:
        """One line for a badge's tooltip or a table: ``ΔPPL +0.31 (+1.2 %): excellent``."""
        return (
            f"ΔPPL {self.delta_ppl:+.3g} ({self.delta_pct:+.1f} %): {self.verdict.value} ({self.form} rule)"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; NaN deltas become None."""
        d = asdict(self)
        d.update(absolute=self.absolute.value, relative=self.relative.value, verdict=self.verdict.value)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def judge(original_ppl: float, variant_ppl: float) -> Judgement:
    """Judge a variant's perplexity against its original's; see the module docstring for the rules."""
    delta = variant_ppl - original_ppl
    ok = math.isfinite(original_ppl) and original_ppl > 0
    rel = delta / original_ppl if ok else float("nan")
    lo, hi = ABSOLUTE_RANGE
    form = "absolute" if ok and lo <= original_ppl <= hi else "relative"
    return Judgement(
        delta_ppl=delta,
        delta_pct=100.0 * rel,
        absolute=verdict_of(delta, ABSOLUTE_THRESHOLDS),
        relative=verdict_of(rel, tuple(t / REFERENCE_PPL for t in ABSOLUTE_THRESHOLDS)),  # type: ignore[arg-type]
        form=form,
    )
