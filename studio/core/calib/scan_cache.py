"""Where sensitivity scans and their importance matrices are kept between runs, shared by the CLI
(``sensitivity``, ``plan``, ``export --budget``) and the window's budget dialog, so that either finds
what the other computed: scans as JSON (``scan_sensitivity``'s ``cache_dir``), imatrices as GGUF files
keyed by the model's files, the calibration text and the chunking.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from studio.core.calib.imatrix import read_imatrix, write_imatrix
from studio.core.errors import StudioError
from studio.core.paths import user_cache_dir
from studio.core.stats.cache import checkpoint_key

__all__ = ["cached_imatrix", "default_cache_dir", "imatrix_cache_path", "store_imatrix"]


def default_cache_dir() -> Path:
    """Where scans are kept between runs: ``sensitivity`` in the user's cache folder (``paths``)."""
    return user_cache_dir() / "sensitivity"


def imatrix_cache_path(
    info: Any, text_digest: str, calib_ctx: int, calib_chunks: int | None, cache_dir: Path | None = None
) -> Path:
    """The cache file of the imatrix of ``info``'s model on a text (its ``CalibrationText.digest``)."""
    ck = checkpoint_key(info, "")
    key = hashlib.sha256(
        f"{info.path}|{ck.mtime_ns}|{ck.size}|{text_digest}|{calib_ctx}|{calib_chunks}".encode()
    ).hexdigest()[:24]
    return (cache_dir or default_cache_dir()) / f"imatrix-{key}.gguf"


def cached_imatrix(path: Path) -> Any:
    """The imatrix cached at ``path`` (as a fresh one: no file recorded), or None (absent or damaged)."""
    if not path.is_file():
        return None
    try:
        return dataclasses.replace(read_imatrix(path), path=None)
    except StudioError:
        return None  # a damaged cache file: calibrate again


def store_imatrix(imatrix: Any, path: Path) -> None:
    """Keep ``imatrix`` at ``path``; a failure only means the next run calibrates again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_imatrix(imatrix, path)
    except (OSError, StudioError):
        pass
