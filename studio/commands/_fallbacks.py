"""``export``'s fallback lines: one summary line by default, every tensor with ``--verbose``.

A 576-wide model falls back on almost every tensor (181 lines for SmolLM2 at Q2_K); the summary says
how many tensors got which type instead of which, and why, grouped, in one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

MAX_GROUPS = 4  # groups named in the summary line; the rest are counted


def fallback_lines(fallbacks: Sequence[Any], *, verbose: bool) -> list[str]:
    """``fallback: …`` lines: one per tensor when ``verbose``, else one summary line (none without fallbacks)."""
    if not fallbacks:
        return []
    if verbose:
        return [f"fallback: {f.tensor}: {f.wanted} → {f.got} ({f.reason})" for f in fallbacks]
    groups = Counter((f.wanted, f.got) for f in fallbacks)
    reasons = Counter(f.reason for f in fallbacks)
    parts = [f"{w} → {g} ×{n}" for (w, g), n in groups.most_common(MAX_GROUPS)]
    if len(groups) > MAX_GROUPS:
        parts.append(f"{len(groups) - MAX_GROUPS} more")
    why, _ = reasons.most_common(1)[0]
    more_why = f" and {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else ""
    n = len(fallbacks)
    return [
        f"fallback: {n} tensor{'s' if n != 1 else ''} took another type ({', '.join(parts)}): "
        f"{why}{more_why}; --verbose lists them"
    ]
