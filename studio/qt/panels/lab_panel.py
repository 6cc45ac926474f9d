"""The quantization lab page: the bit-width sweep, the memory calculator and QAT against PTQ, one tab each.

Each tab is its own panel (``sweep_panel``, ``memory_panel``, ``qat_panel``) over ``studio.core.lab``;
this page only holds them and passes their error sentences on.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from studio.qt.jobs import JobManager
from studio.qt.panels.memory_panel import MemoryPanel
from studio.qt.panels.qat_panel import QatPanel
from studio.qt.panels.sweep_panel import SweepPanel
from studio.qt.state import StudioState

__all__ = ["LabPanel"]


class LabPanel(QWidget):
    """Tabs "Sweep", "Memory" and "QAT"; ``sweep``, ``memory`` and ``qat`` are the panels."""

    errorShown = Signal(str)

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tabs = QTabWidget(self)
        self.sweep = SweepPanel(state, jobs, self.tabs)
        self.memory = MemoryPanel(state, jobs, self.tabs)
        self.qat = QatPanel(state, jobs, self.tabs)
        for panel, title in ((self.sweep, "Sweep"), (self.memory, "Memory"), (self.qat, "QAT")):
            self.tabs.addTab(panel, title)
            panel.errorShown.connect(self.errorShown)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.tabs)

    def show_tab(self, key: str) -> None:
        """Bring the ``sweep``, ``memory`` or ``qat`` tab to the front."""
        self.tabs.setCurrentWidget(getattr(self, key))
