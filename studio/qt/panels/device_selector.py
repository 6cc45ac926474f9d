"""Device selector: the CPU, every CUDA device and MPS, as detected by ``studio.core.hardware``; in the
window's toolbar also a Ray cluster ("Ray cluster at …")."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QInputDialog, QLabel, QWidget

from studio.core import executor
from studio.core.errors import StudioError
from studio.core.executor import INSTALL_HINT, ClusterError, ClusterSpec
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
    gb = 1e9  # decimal, as every size in the studio
    for g in getattr(hw, "gpus", ()) or ():
        backend = getattr(g.backend, "value", str(g.backend))
        free = f"{g.free_bytes / gb:.1f}/{g.total_bytes / gb:.1f} GB free"
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
    clusterRefused = Signal(str)  # the sentence saying why a cluster cannot be used

    def __init__(
        self, state: StudioState, jobs: JobManager, parent: QWidget | None = None, *, cluster: bool = False
    ) -> None:
        super().__init__(parent)
        self.state, self.jobs = state, jobs
        self.settings: AppSettings | None = None
        # cluster: the window's choice also offers a Ray cluster (the scan, calibrated quantization and
        # evaluation send their units there; the rest runs on the CPU here)
        self.offers_cluster = cluster
        self.ask_cluster = self._ask_cluster  # replaceable: the dialog asking for the address
        self._cluster = ""  # the cluster address chosen last ("" before any)
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
        """The chosen device id (the CPU when a cluster is chosen: the head's work runs here)."""
        data = str(self.combo.currentData() or "cpu")
        return "cpu" if data.startswith(_CLUSTER) else data

    @property
    def cluster(self) -> str | None:
        """The chosen cluster's address (``auto``, ``local:N``, ``ray://HOST:PORT``), or None."""
        data = str(self.combo.currentData() or "")
        return data[len(_CLUSTER) :] or None if data.startswith(_CLUSTER) else None

    def set_cluster(self, address: str) -> None:
        """Choose the Ray cluster at ``address``; ClusterError (one sentence) when it names none or Ray
        is not installed (the choice then stays as it was)."""
        ClusterSpec.parse(address)
        if not executor.ray_installed():  # on the module: tests replace it
            raise ClusterError(f"A Ray cluster needs Ray, which is not installed: {INSTALL_HINT}.")
        self._cluster = address.strip()
        self._wanted = _CLUSTER + self._cluster
        self._populate(self.state.hardware)
        self._remember()

    def _ask_cluster(self) -> str | None:
        text, ok = QInputDialog.getText(
            self,
            "Ray cluster",
            "Address of the Ray cluster (ray://HOST:PORT, auto, or local:N for N workers here):",
            text=self._cluster or "ray://127.0.0.1:10001",
        )
        return text.strip() if ok and text.strip() else None

    def set_device(self, device: str) -> bool:
        """Choose ``device`` if it is available; returns whether it was."""
        return choose(self.combo, device)

    def devices(self) -> list[str]:
        """Every device id offered (the Ray cluster entries are not devices)."""
        ids = [str(self.combo.itemData(i)) for i in range(self.combo.count())]
        return [d for d in ids if not d.startswith(_CLUSTER)]

    @Slot(object)
    def _populate(self, hw: Any) -> None:
        keep = self._wanted  # the user's last explicit choice; otherwise the first GPU wins
        self.combo.blockSignals(True)
        self.combo.clear()
        for dev, label in device_choices(hw):
            self.combo.addItem(label, dev)
        if self.offers_cluster:
            if keep.startswith(_CLUSTER) and not self._cluster:
                self._cluster = keep[len(_CLUSTER) :]
            if self._cluster:
                self.combo.addItem(_cluster_label(self._cluster), _CLUSTER + self._cluster)
            self.combo.addItem("Ray cluster…", _CLUSTER)
        i = self.combo.findData(keep) if keep else -1
        if i < 0:
            i = 0  # the first GPU if any, else the CPU
        self.combo.setCurrentIndex(i)
        self.combo.blockSignals(False)
        self.deviceChanged.emit(self.device)

    @Slot(int)
    def _on_index(self, _i: int) -> None:
        if str(self.combo.currentData() or "") == _CLUSTER:  # "Ray cluster…": ask where
            self._choose_cluster()
            return
        self._remember()

    def _choose_cluster(self) -> None:
        address = self.ask_cluster()
        try:
            if address is None:
                raise LookupError
            self.set_cluster(address)
            self.combo.setToolTip("Where quantization and verification run")
        except (LookupError, StudioError) as err:
            if isinstance(err, StudioError):  # one sentence, on the combo and in the window's status bar
                self.combo.setToolTip(str(err))
                self.clusterRefused.emit(str(err))
            self.combo.blockSignals(True)
            i = self.combo.findData(self._wanted)
            self.combo.setCurrentIndex(max(0, i))
            self.combo.blockSignals(False)

    def _remember(self) -> None:
        self._wanted = str(self.combo.currentData() or "cpu")
        if self.settings is not None:
            self.settings.device = self._wanted
        self.state.cluster = self.cluster if self.offers_cluster else self.state.cluster
        self.deviceChanged.emit(self.device)


_CLUSTER = "cluster:"  # item data of a cluster choice: "cluster:" + its address


def _cluster_label(address: str) -> str:
    try:
        return ClusterSpec.parse(address).describe()
    except ClusterError:
        return f"Ray cluster at {address}"
