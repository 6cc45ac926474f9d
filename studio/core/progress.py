"""Work weighted by its cost, and the ETA it implies: the one ETA rule of long calibrated jobs.

A job declares its units of work up front with their costs (multiply-adds, say: rows × columns ×
tokens for a forward pass, rows × columns² for a GPTQ sweep), then marks each done. The share of the
cost done, not of the count of steps, is the progress, so a job whose steps differ a thousandfold in
cost (a chunk through a layer, a GPTQ sweep of a 14336-column matrix) still shows an ETA that moves
with the work: elapsed time × cost left / cost done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from studio.core.units import format_eta

__all__ = ["ETA_MIN_SHARE", "WorkMeter"]

ETA_MIN_SHARE = 0.002
"""Share of a job's cost done before its ETA is shown."""


@dataclass
class WorkMeter:
    """Cost done against ``total`` since the meter was made, on ``clock`` (a fake one in tests)."""

    total: float
    clock: Callable[[], float] = time.monotonic
    done: float = 0.0
    t0: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.t0 < 0:
            self.t0 = self.clock()

    def add(self, cost: float) -> None:
        """Mark ``cost`` more as done (never past the total)."""
        self.done = min(self.total, self.done + max(0.0, cost))

    def grow(self, cost: float) -> None:
        """Add ``cost`` to the total: work found on the way (a layer computed again)."""
        self.total += max(0.0, cost)

    @property
    def fraction(self) -> float:
        """Share of the total cost done, 0..1."""
        return min(1.0, self.done / self.total) if self.total > 0 else 1.0

    def eta(self) -> float | None:
        """Seconds left at the rate so far; None before ``ETA_MIN_SHARE`` of the work is done (the first
        steps, e.g. the embeddings' lookups, carry start-up time a rate would multiply: "ETA 19 h")."""
        if self.done <= 0 or self.done < ETA_MIN_SHARE * self.total:
            return None
        return (self.clock() - self.t0) * max(0.0, self.total - self.done) / self.done

    def line(self, msg: str) -> str:
        """``msg`` with the ETA appended, as every calibrated step shows it."""
        return f"{msg} · ETA {format_eta(self.eta())}"
