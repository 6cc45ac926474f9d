"""The core operations the window uses, bundled so the composition root (studio.app) can hand them in.

Each field is a plain callable over ``studio.core`` types. The real ones import their core module
(the table ``REAL_MODULES``) at their first call, on a worker thread, so that the window shows before
anything heavy is imported; tests may pass their own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
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


# The core module of each real service, imported at its first call (on a worker thread, in a job) so
# that the window shows before the core loads; each service then imports only its own module.
REAL_MODULES = {
    "open_model": "studio.core.model",
    "detect_hardware": "studio.core.hardware",
    "estimate_presets": "studio.core.plan.estimate",
    "demo_model_path": "studio.core.demo",
}


def _core(service: str) -> Any:
    """The core module of ``service`` (``REAL_MODULES``), imported now if it is not yet."""
    return importlib.import_module(REAL_MODULES[service])


def _open_model(path: Path, ctx: JobContext, allow_pickle: bool = False) -> Any:
    benchmodel = importlib.import_module("studio.core.benchmodel")
    if str(path) == benchmodel.BENCH_ALIAS:  # `quant-studio BENCH`, as every CLI command takes it
        path = benchmodel.bench_model_path()  # not fetched yet: one sentence naming the fetch command
    ckpt = _core("open_model").open_model(path, ctx, allow_pickle=allow_pickle)
    # its GGUF layout made here, on the worker, and kept with the info: the plan editor lays the model out
    # on the GUI thread as it opens, which built gguf's name map there (40 ms at 32 layers)
    try:
        importlib.import_module("studio.core.gguf.layout").layout(ckpt.info)
    except StudioError:
        pass  # a model llama.cpp cannot lay out: the plan editor says so
    return ckpt


def _detect_hardware() -> Any:
    return _core("detect_hardware").detect(probe_torch=False)


def _estimate_presets(info: Any, hw: Any, ctx_len: int) -> tuple[Any, ...]:
    return tuple(_core("estimate_presets").estimate_presets(info, hw, ctx_len=ctx_len))


def _demo_model_path(ctx: JobContext) -> Path:
    return _core("demo_model_path").demo_model_path(ctx=ctx)


def real_services() -> Services:
    """The services backed by ``studio.core`` (imported on first use)."""
    return Services(
        open_model=_open_model,
        detect_hardware=_detect_hardware,
        estimate_presets=_estimate_presets,
        demo_model_path=_demo_model_path,
    )
