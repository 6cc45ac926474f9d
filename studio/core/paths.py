"""Where Quant Studio keeps its files on this machine: the one rule for the per-user cache folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SOURCE_MARKER = "quant_studio_source.json"
"""The file in a Hugging Face folder made from a GGUF file that names that file and its tensor types
(here, below the model layer, so that the window reads it without importing the GGUF reader)."""

__all__ = ["SOURCE_MARKER", "user_cache_dir"]


def user_cache_dir() -> Path:
    """This platform's per-user cache folder for Quant Studio (``$QUANT_STUDIO_CACHE``, else XDG,
    macOS Caches or LOCALAPPDATA)."""
    override = os.environ.get("QUANT_STUDIO_CACHE")
    if override:
        return Path(override).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "quant-studio" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "quant-studio"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "quant-studio"
