"""Calibrate, then imatrix, then scan: the one order of every sensitivity scan the faces start.

``calibrate_then_scan`` is what the CLI (``sensitivity``, ``plan``, ``export --budget``) and the
window's budget dialog run: the importance matrix of the calibration text is read from the scan cache
when it is there (the CLI and the window share it), else calibrated and stored; then the scan runs on
it. ``scan_imatrix`` is its first step alone, for a face that needs the imatrix before the scan. Given a
rotated view's ``info`` (``studio.core.model.rotate``), both run on the rotated model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.calib.calibrate import calibrate, load_tokenizer
from studio.core.calib.data import CalibrationText, ChatFormat, load_calibration
from studio.core.calib.imatrix import imatrix_from_stats
from studio.core.calib.scan_cache import cached_imatrix, default_cache_dir, imatrix_cache_path, store_imatrix
from studio.core.calib.sensitivity import ScanSettings, Sensitivity, scan_sensitivity
from studio.core.jobs import JobContext
from studio.core.model.rotate import rotation_of

__all__ = ["ScanRun", "calibrate_then_scan", "scan_imatrix"]


@dataclass(frozen=True)
class ScanRun:
    """A scan, the importance matrix it ran on, and whether that imatrix had to be calibrated."""

    scan: Sensitivity
    imatrix: Any
    calibrated: bool


def scan_imatrix(
    info: Any,
    text: Any,
    *,
    calib_ctx: int,
    calib_chunks: int | None,
    ctx: JobContext,
    cache: bool = True,
    device: str = "cpu",
) -> tuple[Any, bool]:
    """(the imatrix of ``text`` for ``info``'s model, whether it had to calibrate): the cached one when
    there is one, else calibrated now on ``device`` in float32 and stored (``cache=False``: neither).
    ``text``: ``"builtin"``, a file, or a ``CalibrationText`` (e.g. a text less its held-out end)."""
    if isinstance(text, CalibrationText):
        data = text
    else:
        ctx.report(0, 1, "Reading the calibration text")
        tok = load_tokenizer(info.path)
        data = load_calibration(text, ChatFormat.of_tokenizer(tok, Path(info.path).name), ctx)
    rotation = rotation_of(info)  # a rotated view's imatrix is the rotated model's, cached apart
    path = imatrix_cache_path(info, data.digest, calib_ctx, calib_chunks) if cache else None
    im = None if path is None else cached_imatrix(path)
    if im is not None:
        return im, False
    ctx.report(0, 1, "Calibrating (importance matrix), step 1 of 2")
    stats = calibrate(
        info.path,
        data,
        n_ctx=calib_ctx,
        n_chunks=calib_chunks,
        device=device,
        dtype="float32",
        histogram=False,
        ctx=ctx,
        rotation=rotation,
    )
    im = imatrix_from_stats(stats, info)
    if path is not None:
        store_imatrix(im, path)  # without a cache the next run calibrates again
    return im, True


def calibrate_then_scan(
    info: Any,
    text: Any,
    settings: ScanSettings,
    *,
    ctx: JobContext,
    imatrix: Any = None,
    also: tuple[Any, ...] = (),
    cache: bool = True,
    executor: Any = None,
) -> ScanRun:
    """Scan ``info``'s model on ``text``: on ``imatrix`` when given (a Calibrate run's), else on
    ``scan_imatrix``'s (cached or calibrated now); the scan itself is cached too unless ``cache=False``.
    ``also``: more texts the scan measures beside ``text`` (``scan_sensitivity``'s ``also``).
    ``executor`` (``studio.core.executor``) runs the scan's units, on a cluster or here."""
    calibrated = False
    if imatrix is None:
        imatrix, calibrated = scan_imatrix(
            info,
            text,
            calib_ctx=settings.calib_ctx,
            calib_chunks=settings.calib_chunks,
            ctx=ctx,
            cache=cache,
            device=settings.device,
        )
    scan = scan_sensitivity(
        info.path,
        text,
        settings,
        imatrix=imatrix,
        also=also,
        cache_dir=default_cache_dir() if cache else None,
        ctx=ctx,
        executor=executor,
        rotation=rotation_of(info),
    )
    return ScanRun(scan, imatrix, calibrated)
