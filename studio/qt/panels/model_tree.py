"""The model tree panel: layers → tensors with shape, dtype, parameter count and role."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, QSortFilterProxyModel, Qt, Slot
from PySide6.QtGui import QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLineEdit, QTreeView, QVBoxLayout, QWidget

from studio.qt.fmt import human_count, role_text, shape_text
from studio.qt.jobs import JobManager
from studio.qt.state import StudioState

NAME_ROLE = Qt.ItemDataRole.UserRole + 1  # full tensor name on tensor rows, "" on group rows
SORT_ROLE = Qt.ItemDataRole.UserRole + 2  # numeric value for sorting

COLUMNS = ("Tensor", "Shape", "Dtype", "Params", "Role")
COL_NAME, COL_SHAPE, COL_DTYPE, COL_PARAMS, COL_ROLE = range(len(COLUMNS))
GLOBAL_GROUP = "Model-level tensors"


def _short_name(name: str, layer: int | None) -> str:
    """The part of a tensor name after its layer number ("model.layers.3.mlp.up_proj.weight" -> "mlp.up_proj.weight")."""
    if layer is None:
        return name
    marker = f".{layer}."
    pos = name.find(marker)
    return name[pos + len(marker) :] if pos >= 0 else name


class TensorTreeModel(QStandardItemModel):
    """Tree of one model's tensors: a group per layer plus one group for tensors outside any layer."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(list(COLUMNS))
        self._index_of: dict[str, QStandardItem] = {}

    def set_info(self, info: Any | None) -> None:
        """Show the tensors of ``info`` (a ModelInfo), or nothing for None."""
        self.removeRows(0, self.rowCount())
        self._index_of.clear()
        if info is None:
            return
        groups: dict[int | None, list[Any]] = {}
        for t in info.tensors:
            groups.setdefault(t.layer, []).append(t)
        order = ([None] if None in groups else []) + sorted(k for k in groups if k is not None)
        root = self.invisibleRootItem()
        for layer in order:
            tensors = groups[layer]
            title = GLOBAL_GROUP if layer is None else f"Layer {layer}"
            params = sum(t.n_elements for t in tensors)
            group = self._row(
                title,
                f"{len(tensors)} tensor{'s' if len(tensors) != 1 else ''}",
                "",
                human_count(params),
                "",
                sort=(layer if layer is not None else -1, params),
            )
            group[COL_NAME].setData("", NAME_ROLE)
            bold = QFont(group[COL_NAME].font())
            bold.setBold(True)
            group[COL_NAME].setFont(bold)
            for t in tensors:
                row = self._row(
                    _short_name(t.name, t.layer),
                    shape_text(tuple(t.shape)),
                    str(t.dtype),
                    human_count(t.n_elements),
                    role_text(t.role),
                    sort=(t.name, t.n_elements),
                )
                row[COL_NAME].setData(t.name, NAME_ROLE)
                row[COL_NAME].setToolTip(t.name)
                self._index_of[t.name] = row[COL_NAME]
                group[COL_NAME].appendRow(row)
            root.appendRow(group)

    def tensor_count(self) -> int:
        """Number of tensor rows (leaves) in the tree."""
        return len(self._index_of)

    def index_of(self, name: str) -> QModelIndex:
        """Index of a tensor's name cell, invalid when the tensor is not shown."""
        item = self._index_of.get(name)
        return item.index() if item is not None else QModelIndex()

    @staticmethod
    def _row(
        name: str, shape: str, dtype: str, params: str, role: str, *, sort: tuple[Any, Any]
    ) -> list[QStandardItem]:
        cells = [QStandardItem(text) for text in (name, shape, dtype, params, role)]
        for c in cells:
            c.setEditable(False)
        cells[COL_NAME].setData(sort[0], SORT_ROLE)
        cells[COL_PARAMS].setData(sort[1], SORT_ROLE)
        for col in (COL_SHAPE, COL_DTYPE, COL_ROLE):
            cells[col].setData(cells[col].text(), SORT_ROLE)
        cells[COL_PARAMS].setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return cells


class _TensorFilter(QSortFilterProxyModel):
    """Keeps rows whose visible cells match, or whose full tensor name does ("model.layers.3.mlp.up_proj")."""

    needle = ""  # the filter text in lower case (setFilterFixedString's pattern is escaped)

    def filterAcceptsRow(self, row: int, parent: QModelIndex) -> bool:  # noqa: N802 - Qt's name
        if super().filterAcceptsRow(row, parent) or not self.needle:
            return True
        full = self.sourceModel().index(row, COL_NAME, parent).data(NAME_ROLE)
        return bool(full) and self.needle in str(full).lower()


class ModelTreePanel(QWidget):
    """A filterable tree of the open model's tensors; selecting one selects it in the shared state."""

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ModelTreePanel")
        self._state = state
        self.model = TensorTreeModel(self)
        self.proxy = _TensorFilter(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setRecursiveFilteringEnabled(True)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.proxy.setFilterKeyColumn(-1)
        self.proxy.setSortRole(SORT_ROLE)

        self.filter_edit = QLineEdit(self)
        self.filter_edit.setPlaceholderText("Filter tensors by name, role or dtype")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self._on_filter)

        self.view = QTreeView(self)
        self.view.setModel(self.proxy)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSortingEnabled(False)
        header = self.view.header()
        header.setStretchLastSection(True)
        for col in (COL_NAME, COL_SHAPE, COL_DTYPE, COL_PARAMS):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setMinimumSectionSize(48)
        self.view.selectionModel().currentRowChanged.connect(self._on_current_changed)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addWidget(self.filter_edit)
        layout.addWidget(self.view)

        state.modelOpened.connect(self._on_model_opened)
        state.modelClosed.connect(self._on_model_closed)
        state.tensorSelected.connect(self._on_tensor_selected)

    @Slot(object)
    def _on_model_opened(self, checkpoint: Any) -> None:
        self.model.set_info(checkpoint.info)
        # Open the model-level group and the first layer so the roles are visible at a glance.
        if self.proxy.rowCount() > 0:
            first_layer = 1 if self.proxy.rowCount() > 1 else 0
            self.view.expand(self.proxy.index(0, 0))
            self.view.expand(self.proxy.index(first_layer, 0))

    @Slot()
    def _on_model_closed(self) -> None:
        self.model.set_info(None)

    @Slot(str)
    def _on_filter(self, text: str) -> None:
        self.proxy.needle = text.strip().lower()
        self.proxy.setFilterFixedString(text.strip())
        if text.strip():
            self.view.expandAll()

    @Slot(QModelIndex, QModelIndex)
    def _on_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        name = current.siblingAtColumn(COL_NAME).data(NAME_ROLE) if current.isValid() else ""
        if name:
            self._state.select_tensor(name)

    @Slot(str)
    def _on_tensor_selected(self, name: str) -> None:
        src = self.model.index_of(name)
        if not src.isValid():
            return
        idx = self.proxy.mapFromSource(src)
        if idx.isValid() and idx != self.view.currentIndex():
            self.view.setCurrentIndex(idx)
            self.view.scrollTo(idx)
