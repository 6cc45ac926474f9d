"""Keeps the state's per-preset estimates current as the model, the hardware or the context length change."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, Slot

from studio.core.errors import StudioError
from studio.qt.services import Services
from studio.qt.state import StudioState

log = logging.getLogger(__name__)


class PresetEstimates(QObject):
    """Recomputes ``state.estimates`` (size, memory and fit per preset) whenever one of its inputs changes."""

    def __init__(
        self, state: StudioState, services: Services, show_status: Callable[[str, int], None], parent: QObject
    ) -> None:
        super().__init__(parent)
        self.state, self.services, self._show_status = state, services, show_status
        for sig in (state.modelOpened, state.hardwareChanged, state.contextLengthChanged):
            sig.connect(self.recompute)

    @Slot()
    def recompute(self, *_args: object) -> None:
        """Estimate every preset for the open model on the detected hardware (nothing without both)."""
        info, hw = self.state.info, self.state.hardware
        if info is None or hw is None:
            if self.state.estimates:
                self.state.set_estimates(())
            return
        try:
            estimates = self.services.estimate_presets(info, hw, self.state.context_length)
        except StudioError as err:
            self._show_status(str(err), 10000)
            estimates = ()
        except Exception as err:  # an estimate failing must not take the window down
            log.exception("estimating presets failed")
            self._show_status(f"Estimating the presets failed ({type(err).__name__}: {err}).", 10000)
            estimates = ()
        self.state.set_estimates(tuple(estimates))
