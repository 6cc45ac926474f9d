"""The core operations the window uses, bundled so the composition root (studio.app) can hand them in.

Each field is a plain callable over ``studio.core`` types. The real ones import their modules lazily
(inside the call, on a worker thread) so that the window shows before anything heavy is imported;
tests may pass their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.jobs import JobContext


@dataclass(frozen=True)
class Services:
    """Core calls used by the Qt layer."""

    # (path, ctx, allow_pickle) -> Checkpoint
    open_model: Callable[[Path, JobContext, bool], Any]
    # () -> HardwareInfo
    detect_hardware: Callable[[], Any]
    # (ModelInfo, HardwareInfo, ctx_len) -> tuple[Estimate, ...]
    estimate_presets: Callable[[Any, Any, int], tuple[Any, ...]]
    # (ctx) -> Path of the (cached) demo checkpoint
    demo_model_path: Callable[[JobContext], Path]


def _open_model(path: Path, ctx: JobContext, allow_pickle: bool = False) -> Any:
    from studio.core.model import open_model

    return open_model(path, ctx, allow_pickle=allow_pickle)


def _detect_hardware() -> Any:
    from studio.core.hardware import detect

    return detect(probe_torch=False)


def _estimate_presets(info: Any, hw: Any, ctx_len: int) -> tuple[Any, ...]:
    from studio.core.plan.estimate import estimate_presets

    return tuple(estimate_presets(info, hw, ctx_len=ctx_len))


def _demo_model_path(ctx: JobContext) -> Path:
    from studio.core.demo import demo_model_path

    return demo_model_path(ctx=ctx)


def real_services() -> Services:
    """The services backed by ``studio.core`` (imported on first use)."""
    return Services(
        open_model=_open_model,
        detect_hardware=_detect_hardware,
        estimate_presets=_estimate_presets,
        demo_model_path=_demo_model_path,
    )
