"""The offline demo checkpoint: a small Llama-style model with outliers, built once and cached."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from studio.core.errors import StudioError
from studio.core.jobs import JobContext, null_context

DEMO_VERSION = 1
"""Bump when the demo's recipe changes so a stale cached demo is rebuilt under a new folder."""

DEMO_ARCH = "llama"
DEMO_HIDDEN = 512
DEMO_LAYERS = 4
DEMO_SEED = 1234


class DemoError(StudioError):
    """The demo model could not be built or stored."""


def user_cache_dir() -> Path:
    """This platform's per-user cache folder for Quant Studio (XDG, macOS Caches or LOCALAPPDATA)."""
    override = os.environ.get("QUANT_STUDIO_CACHE")
    if override:
        return Path(override)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "quant-studio" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "quant-studio"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "quant-studio"


def demo_folder(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the demo model of this version lives (it may not be built yet)."""
    return Path(cache_dir or user_cache_dir()) / f"demo-{DEMO_VERSION}"


def _is_complete(folder: Path) -> bool:
    from studio.core.factory import FACTORY_INFO_NAME

    # The factory writes its info file last and the folder appears by rename, so this means "whole".
    return (folder / "config.json").is_file() and (folder / FACTORY_INFO_NAME).is_file()


def demo_model_path(cache_dir: str | os.PathLike[str] | None = None, ctx: JobContext | None = None) -> Path:
    """Return the folder of the demo model, building it first if this version is not cached yet.

    The model is built in a temporary folder beside the target and renamed into place, so an
    interrupted build never leaves a half model and two concurrent callers both end with a whole one.
    """
    from studio.core.factory import make_tiny_model

    ctx = ctx or null_context()
    target = demo_folder(cache_dir)
    if _is_complete(target):
        ctx.report(1, 1, "Demo model ready")
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".demo-", suffix=".partial", dir=target.parent))
    except OSError as exc:
        raise DemoError(
            f"The demo model cannot be stored in {target.parent} ({exc.strerror}).",
            hint="Set QUANT_STUDIO_CACHE to a writable folder.",
        ) from exc
    try:
        built = make_tiny_model(
            work / "model",
            DEMO_ARCH,
            hidden=DEMO_HIDDEN,
            layers=DEMO_LAYERS,
            seed=DEMO_SEED,
            outliers=True,
            ctx=ctx,
        )
        ctx.check_cancelled()
        if target.exists() and not _is_complete(target):
            shutil.rmtree(target, ignore_errors=True)  # leftover of an older, broken layout
        try:
            os.replace(built, target)
        except OSError:
            # Another process finished first: use its copy if it is whole, else report ours failed.
            if not _is_complete(target):
                raise
    except OSError as exc:
        raise DemoError(
            f"The demo model could not be written to {target} ({exc.strerror}).",
            hint="Check free disk space and permissions, or set QUANT_STUDIO_CACHE.",
        ) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
