"""Where sensitivity scans and their importance matrices are kept between runs, shared by the CLI
(``sensitivity``, ``plan``, ``export --budget``) and the window's budget dialog, so that either finds
what the other computed: scans as JSON (``scan_sensitivity``'s ``cache_dir``), imatrices as GGUF files
keyed by the model's files, the calibration text and the chunking.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.atomic import write_atomic
from studio.core.calib.imatrix import read_imatrix, write_imatrix
from studio.core.errors import CalibrationError, StudioError
from studio.core.model.rotate import rotation_key, rotation_of
from studio.core.paths import user_cache_dir
from studio.core.plan.scan import Sensitivity
from studio.core.stats.cache import checkpoint_key

__all__ = [
    "cached_imatrix",
    "default_cache_dir",
    "imatrix_cache_path",
    "imatrix_digest",
    "load_cached_scan",
    "save_cached_scan",
    "scan_digest",
    "store_imatrix",
]


def default_cache_dir() -> Path:
    """Where scans are kept between runs: ``sensitivity`` in the user's cache folder (``paths``)."""
    return user_cache_dir() / "sensitivity"


def imatrix_cache_path(
    info: Any, text_digest: str, calib_ctx: int, calib_chunks: int | None, cache_dir: Path | None = None
) -> Path:
    """The cache file of the imatrix of ``info``'s model on a text (its ``CalibrationText.digest``)."""
    ck = checkpoint_key(info, "")
    rot = rotation_key(rotation_of(info))  # a rotated view's imatrix apart from the model's own
    key = hashlib.sha256(
        f"{info.path}|{ck.mtime_ns}|{ck.size}|{text_digest}|{calib_ctx}|{calib_chunks}{rot or ''}".encode()
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


def scan_digest(obj: Any) -> str:
    """A short digest of a scan's JSON-able description (the key of its cache file)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


def imatrix_digest(imatrix: Mapping[str, np.ndarray]) -> str:
    """A short digest of an imatrix's names and values."""
    h = hashlib.sha256()
    for k in sorted(imatrix):
        h.update(k.encode())
        h.update(np.ascontiguousarray(imatrix[k], dtype=np.float32).tobytes())
    return h.hexdigest()[:24]


def load_cached_scan(cache_dir: str | os.PathLike[str] | None, key: str) -> Sensitivity | None:
    """The scan kept under ``key`` in ``cache_dir``, or None (no cache, absent, damaged, or holding a usable
    candidate whose KL or error is not finite: such a scan is made again, never reused)."""
    if cache_dir is None:
        return None
    p = Path(cache_dir) / f"sensitivity-{key}.json"
    try:
        scan = Sensitivity.from_dict(json.loads(p.read_text(encoding="utf-8")))  # noqa: TID251 - a cache file the studio wrote (key-named, in its cache folder)
    except (OSError, ValueError, CalibrationError):
        return None
    return None if scan.non_finite() is not None else scan


def save_cached_scan(cache_dir: str | os.PathLike[str] | None, key: str, result: Sensitivity) -> None:
    """Keep ``result`` under ``key``; a failure only costs the next scan its time."""
    if cache_dir is None:
        return
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(cache_dir) / f"sensitivity-{key}.json", json.dumps(result.to_dict()))
    except OSError:
        pass  # a cache that cannot be written only costs the next scan its time
