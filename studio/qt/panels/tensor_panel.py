"""The tensor panel: what is known about the selected tensor, and the type each preset gives it.

Everything shown comes from the model's ``TensorInfo`` and the core's estimates (``Estimate.types``);
the inspector plots of the studio window slot in next to it as their own dock.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.qt.fmt import human_bytes, human_count, role_text, shape_text
from studio.qt.jobs import JobManager
from studio.qt.state import StudioState

FIELDS = ("Name", "Role", "Layer", "Shape", "Dtype", "Parameters", "Bytes", "File")


class TensorPanel(QWidget):
    """Details of the tensor selected in the shared state."""

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("TensorPanel")
        self._state = state

        self.placeholder = QLabel("Select a tensor in the model tree to see its details.", self)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setEnabled(False)

        self.details = QWidget(self)
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        self.values: dict[str, QLabel] = {}
        for key in FIELDS:
            label = QLabel("–", self.details)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            form.addRow(f"{key}:", label)
            self.values[key] = label
        self.types_table = QTableWidget(0, 2, self.details)
        self.types_table.setHorizontalHeaderLabels(["Preset", "Type in the GGUF file"])
        self.types_table.verticalHeader().setVisible(False)
        self.types_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.types_table.setShowGrid(False)
        self.types_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.types_table.horizontalHeader().setStretchLastSection(True)
        self.types_table.setMinimumWidth(300)
        row = QHBoxLayout(self.details)
        row.setContentsMargins(0, 0, 0, 0)
        row.addLayout(form, 3)
        row.addWidget(self.types_table, 2, Qt.AlignmentFlag.AlignTop)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.placeholder)
        layout.addWidget(self.details)
        self.details.hide()

        state.tensorSelected.connect(self._refresh)
        state.estimatesChanged.connect(self._refresh)
        state.modelClosed.connect(self._refresh)

    @Slot()
    def _refresh(self, *_args: Any) -> None:
        info, name = self._state.info, self._state.selected_tensor
        t = None
        if info is not None and name:
            try:
                t = info.tensor(name)
            except KeyError:
                t = None
        self.placeholder.setVisible(t is None)
        self.details.setVisible(t is not None)
        if t is None:
            return
        v = self.values
        v["Name"].setText(t.name)
        v["Role"].setText(role_text(t.role))
        v["Layer"].setText("–" if t.layer is None else str(t.layer))
        v["Shape"].setText(shape_text(tuple(t.shape)))
        v["Dtype"].setText(str(t.dtype))
        v["Parameters"].setText(f"{human_count(t.n_elements)}  ({t.n_elements:,})")
        v["Bytes"].setText(f"{human_bytes(t.nbytes)}  ({t.nbytes:,})")
        v["File"].setText(t.file.name if hasattr(t.file, "name") else str(t.file))
        v["File"].setToolTip(str(t.file))
        self._fill_types(t.name)

    def _fill_types(self, name: str) -> None:
        rows = [(str(e.preset), (getattr(e, "types", None) or {}).get(name)) for e in self._state.estimates]
        table = self.types_table
        table.setRowCount(len(rows))
        for r, (preset, qtype) in enumerate(rows):
            table.setItem(r, 0, QTableWidgetItem(preset))
            table.setItem(r, 1, QTableWidgetItem(qtype or "not exported"))
        table.resizeRowsToContents()
        # As tall as its rows (the dock scrolls nothing away), so it does not float in empty space.
        rows = sum(table.rowHeight(r) for r in range(table.rowCount()))
        table.setFixedHeight(table.horizontalHeader().sizeHint().height() + rows + 2 * table.frameWidth())
