"""Fit badges: would a Hub model, quantized with a preset, run on this machine?

Built on ``studio.core.plan.estimate.estimate_from_config`` from the repository's config.json and its
parameter count, so the Hub panel and the planner agree on every number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from studio.core.errors import HubError
from studio.core.hub.api import fetch_json
from studio.core.jobs import JobContext
from studio.core.plan.estimate import Verdict, estimate_from_config, verdict_for

# The preset the badge speaks for when the user has not picked one: the usual llama.cpp default.
BADGE_PRESET = "Q4_K_M"


@dataclass(frozen=True)
class FitBadge:
    """The verdict for the badge preset, the best preset that still runs well, and all estimates."""

    preset: str
    verdict: str  # an ``estimate.Verdict`` value, e.g. "fits on the GPU"
    memory_bytes: int
    best_preset: str | None  # highest-precision preset that fits on the GPU (or in RAM without a GPU)
    estimates: tuple[Any, ...]

    @property
    def label(self) -> str:
        """Short text for a table cell, e.g. ``Q4_K_M: fits on the GPU``."""
        return f"{self.preset}: {self.verdict}"

    @property
    def ok(self) -> bool:
        """Whether the badge preset runs at all (on the GPU, partially offloaded or on the CPU)."""
        return self.verdict != "does not fit"


def fit_badge(
    config: Mapping[str, Any] | None,
    n_params: int | None,
    hw: Any,
    *,
    ctx_len: int = 4096,
    preset: str = BADGE_PRESET,
) -> FitBadge | None:
    """The fit badge for a model known by its config and parameter count, or None if they are unknown."""
    if not n_params:
        return None

    estimates = tuple(estimate_from_config(dict(config or {}), int(n_params), hw, ctx_len=ctx_len))
    if not estimates:
        return None
    chosen = next((e for e in estimates if e.preset == preset), estimates[len(estimates) // 2])
    good = {Verdict.FITS_GPU} if getattr(hw, "gpus", ()) else {Verdict.CPU_ONLY}
    # PRESETS run from high to low precision, so the first good one is the best.
    best = next((e.preset for e in estimates if e.verdict in good), None)
    return FitBadge(chosen.preset, Verdict(chosen.verdict).value, chosen.memory_bytes, best, estimates)


def gguf_fit(file_bytes: int, hw: Any) -> str:
    """A rough verdict for an already-quantized GGUF file: its size plus ~15 % for context and buffers."""
    return verdict_for(int(file_bytes * 1.15), hw).value


def fit_for_repo(
    repo_id: str,
    n_params: int | None,
    hw: Any,
    *,
    revision: str | None = None,
    token: str | None = None,
    ctx_len: int = 4096,
    ctx: JobContext | None = None,
) -> FitBadge | None:
    """Fetch a repository's config.json and compute its fit badge (None when it cannot be told)."""
    if not n_params:
        return None
    try:
        config = fetch_json(repo_id, "config.json", revision=revision, token=token, ctx=ctx)
    except HubError:
        config = None  # GGUF-only repos have no config.json: fall back to typical bits per weight
    return fit_badge(config, n_params, hw, ctx_len=ctx_len)
