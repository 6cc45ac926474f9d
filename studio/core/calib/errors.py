"""The one error calibration raises: a sentence for the user, naming the file, layer or tensor."""

from __future__ import annotations

from studio.core.errors import StudioError


class CalibrationError(StudioError):
    """Calibration cannot run or its result cannot be used (bad text, NaN activations, wrong model)."""
