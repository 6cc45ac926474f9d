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
    """Cost done against ``total`` since the meter was made, on ``clock`` (a fake one in tests).

    Work of different kinds (``plan``'s and ``add``'s ``kind``: a GPTQ sweep, AWQ's grid, a forward
    pass) runs at different speeds per unit of cost, by ratios no cost model knows for every machine
    (numba's one-thread rounding against torch's threaded matmuls; a GPU). So each kind keeps its own
    rate, measured on its steps (the time since the step before), and the ETA is each kind's cost left at
    its own rate; a kind not measured yet goes at the job's overall rate. Without kinds: elapsed time ×
    cost left / cost done."""

    total: float
    clock: Callable[[], float] = time.monotonic
    done: float = 0.0
    t0: float = field(default=-1.0)
    # kind → [planned cost, cost done, cost measured, seconds measured]
    _kinds: dict[str, list[float]] = field(default_factory=dict, repr=False)
    _last: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.t0 < 0:
            self.t0 = self.clock()

    def plan(self, cost: float, kind: str = "") -> None:
        """Add ``cost`` of work of ``kind`` to the total."""
        cost = max(0.0, cost)
        self.total += cost
        self._kind(kind)[0] += cost

    def _kind(self, kind: str) -> list[float]:
        k = self._kinds.get(kind)
        if k is None:
            k = self._kinds[kind] = [0.0, 0.0, 0.0, 0.0]
        return k

    def add(self, cost: float, kind: str = "") -> None:
        """Mark ``cost`` more of ``kind`` as done (never past the total). Its time is the time since the
        step before; the first step's is the job's start-up as well, and counts for no kind."""
        cost = max(0.0, min(cost, self.total - self.done))
        self.done += cost
        now = self.clock()
        k = self._kind(kind)
        k[1] += cost
        if self._last is not None and cost > 0:
            k[2] += cost
            k[3] += now - self._last
        if cost > 0:
            self._last = now

    def grow(self, cost: float, kind: str = "") -> None:
        """Add ``cost`` to the total: work found on the way (a layer computed again)."""
        self.plan(cost, kind)

    @property
    def fraction(self) -> float:
        """Share of the total cost done, 0..1."""
        return min(1.0, self.done / self.total) if self.total > 0 else 1.0

    def eta(self) -> float | None:
        """Seconds left: each kind's cost left at its measured rate, the rest at the rate so far; None
        before ``ETA_MIN_SHARE`` of the work is done (the first steps, e.g. the embeddings' lookups, carry
        start-up time a rate would multiply: "ETA 19 h")."""
        if self.done <= 0 or self.done < ETA_MIN_SHARE * self.total:
            return None
        overall = (self.clock() - self.t0) / self.done
        left = max(0.0, self.total - self.done)
        if len(self._kinds) <= 1:
            return overall * left
        secs = 0.0
        for planned, done, measured, seconds in self._kinds.values():
            rest = max(0.0, planned - done)
            left -= rest
            secs += rest * (seconds / measured if measured > 0 else overall)
        return secs + max(0.0, left) * overall

    def line(self, msg: str) -> str:
        """``msg`` with the ETA appended, as every calibrated step shows it."""
        return f"{msg} · ETA {format_eta(self.eta())}"
