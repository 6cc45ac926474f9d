"""Export verification in Evaluate's words: the same numbers, the same verdict rule, and what it was on.

Verification (``studio.core.export.verify``) is a quick check on one chunk; Evaluate measures whole texts.
Both are scored by ``studio.core.quality``'s definitions, and both are judged by
``studio.core.evaluate.verdict.judge`` on the perplexities of the scored tokens. This module turns a
``VerifyResult`` into the line and the JSON the faces show, so the export dialog and
``quant-studio-cli export --verify`` say the same thing.
"""

from __future__ import annotations

import math
from typing import Any

from studio.core.evaluate.verdict import Judgement, judge


def judgement(v: Any) -> Judgement | None:
    """The verdict of a verification (None for encoders, which have no perplexity)."""
    c = getattr(v, "comparison", None)
    if c is None or not (math.isfinite(c.ppl_original) and math.isfinite(c.ppl_variant)):
        return None
    return judge(c.ppl_original, c.ppl_variant)


def verification_line(v: Any) -> str:
    """``top-1 agreement 97.0 % (same top token), mean KL divergence 0.0012 nats per token, PPL …: verdict;
    quick check: 63 tokens scored of …`` (the cosine line for encoders)."""
    c, on = getattr(v, "comparison", None), getattr(v, "measured_on", None)
    where = f"; {on.describe()}" if on is not None else f"; quick check on {v.n_tokens} tokens"
    if c is None:
        if v.top1_agreement is not None:
            return (
                f"top-1 agreement {100 * v.top1_agreement:.1f} % (same top token), "
                f"mean KL divergence {v.mean_kl:.3g} nats per token{where}"
            )
        return f"mean cosine similarity of hidden states {v.mean_cosine:.5f}{where}"
    j = judgement(v)
    verdict = f": {j.verdict.value} ({j.form} rule, ΔPPL {j.delta_ppl:+.3g})" if j is not None else ""
    return (
        f"top-1 agreement {c.same_top_pct:.1f} % (same top token), mean KL divergence {c.kl_mean:.3g} "
        f"nats per token, PPL {c.ppl_original:.4g} → {c.ppl_variant:.4g}{verdict}{where}"
    )


def verification_dict(v: Any) -> dict[str, Any]:
    """The comparison, the verdict and what it was measured on, JSON-ready (NaN as None)."""
    c, on, j = getattr(v, "comparison", None), getattr(v, "measured_on", None), judgement(v)
    out: dict[str, Any] = {
        "same_top_pct": c.same_top_pct if c else None,
        "kl_mean": c.kl_mean if c else None,
        "kl_p99": c.kl_p99 if c else None,
        "ppl_original": c.ppl_original if c else None,
        "ppl_variant": c.ppl_variant if c else None,
        "verdict": j.verdict.value if j else None,
        "verdict_detail": j.to_dict() if j else None,
        "measured_on": on.to_dict() if on else None,
    }
    return {k: (None if isinstance(x, float) and not math.isfinite(x) else x) for k, x in out.items()}
