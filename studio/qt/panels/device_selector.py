"""Device selector: the CPU, every CUDA device and MPS, as detected by ``studio.core.hardware``."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QWidget

from studio.qt.jobs import JobManager
from studio.qt.panels import choose
from studio.qt.settings import AppSettings
from studio.qt.state import StudioState

__all__ = ["DeviceSelector", "device_choices"]


def device_choices(hw: Any) -> list[tuple[str, str]]:
    """``(device id, label)`` for each device of a ``HardwareInfo`` (or just the CPU when it is None).

    Ids are what torch and ``quant-studio-cli export --device`` take: ``cuda:N``, ``mps``, ``cpu``.
    """
    out: list[tuple[str, str]] = []
    gib = 1024**3
    for g in getattr(hw, "gpus", ()) or ():
        backend = getattr(g.backend, "value", str(g.backend))
        free = f"{g.free_bytes / gib:.1f}/{g.total_bytes / gib:.1f} GiB free"
        if backend == "cuda":
            out.append((f"cuda:{g.index}", f"CUDA {g.index}: {g.name} ({free})"))
        elif backend == "mps":
            out.append(("mps", f"MPS: {g.name} (unified memory, {free})"))
    cores = getattr(hw, "cpu_cores", None)
    name = getattr(hw, "cpu_name", "") or "CPU"
    out.append(("cpu", f"CPU: {name}" + (f" ({cores} cores)" if cores else "")))
    return out


class DeviceSelector(QWidget):
    """A labelled combo box of devices for quantization; with ``remember_in`` the choice is kept."""

    deviceChanged = Signal(str)  # device id: "cuda:0", "mps" or "cpu"

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state, self.jobs = state, jobs
        self.settings: AppSettings | None = None
        self.combo = QComboBox(self)
        self.combo.setToolTip("Where quantization and verification run")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("Device:", self))
        lay.addWidget(self.combo, 1)
        self._wanted = ""  # the user's last explicit choice
        self._populate(state.hardware)
        self.combo.currentIndexChanged.connect(self._on_index)
        state.hardwareChanged.connect(self._populate)

    def remember_in(self, settings: AppSettings) -> None:
        """Keep the choice in ``settings`` from now on, and choose the one they remember."""
        self.settings = settings
        self._wanted = settings.device
        self._populate(self.state.hardware)

    @property
    def device(self) -> str:
        """The chosen device id."""
        return str(self.combo.currentData() or "cpu")

    def set_device(self, device: str) -> bool:
        """Choose ``device`` if it is available; returns whether it was."""
        return choose(self.combo, device)

    def devices(self) -> list[str]:
        """Every device id offered."""
        return [str(self.combo.itemData(i)) for i in range(self.combo.count())]

    @Slot(object)
    def _populate(self, hw: Any) -> None:
        keep = self._wanted  # the user's last explicit choice; otherwise the first GPU wins
        self.combo.blockSignals(True)
        self.combo.clear()
        for dev, label in device_choices(hw):
            self.combo.addItem(label, dev)
        i = self.combo.findData(keep) if keep else -1
        if i < 0:
            i = 0  # the first GPU if any, else the CPU
        self.combo.setCurrentIndex(i)
        self.combo.blockSignals(False)
        self.deviceChanged.emit(self.device)

    @Slot(int)
    def _on_index(self, _i: int) -> None:
        self._wanted = self.device
        if self.settings is not None:
            self.settings.device = self.device
        self.deviceChanged.emit(self.device)
