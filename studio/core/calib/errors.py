"""The one error calibration raises (``studio.core.errors.CalibrationError``, kept importable here)."""

from __future__ import annotations

from studio.core.errors import CalibrationError

__all__ = ["CalibrationError"]
