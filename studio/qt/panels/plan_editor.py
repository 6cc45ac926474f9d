"""Precision plan editor: layers × tensor roles, a GGUF type per cell, presets, rules, undo/redo, JSON.

Plans are ``studio.core.plan.plan.Plan`` objects, changed only through the core's plan verbs
(``with_types``, ``keep_first_last``, ``with_overrides``), the same the CLI uses; sizes come from
``Plan.summary`` and the fit verdict from ``studio.core.plan.estimate``. Every change makes a new
(immutable) plan, pushed on a ``QUndoStack`` and announced through ``StudioState.set_plan``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, Signal, Slot
from PySide6.QtGui import QAction, QBrush, QColor, QKeySequence, QUndoCommand, QUndoStack
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QStyledItemDelegate,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.atomic import write_atomic
from studio.core.errors import StudioError
from studio.core.gguf.layout import layout
from studio.core.modelinfo import Role
from studio.core.plan import estimate as est
from studio.core.plan.memory import overhead_bytes
from studio.core.plan.plan import (
    Override,
    Plan,
    keep_first_last,
    plan_from_preset,
    plan_uniform,
    tensors_matching,
    with_overrides,
    with_types,
)
from studio.core.plan.presets import PRESETS, Fallback, allows_quantization
from studio.core.quant.types import PLAN_TYPES
from studio.core.textfile import read_untrusted
from studio.qt import folders, widgets
from studio.qt.fmt import human_bytes
from studio.qt.jobs import JobManager
from studio.qt.panels import assert_gui_thread
from studio.qt.state import StudioState
from studio.qt.theme import FALLBACK_RGBA, set_status

__all__ = ["PlanEditorPanel", "PlanTableModel", "TypeDelegate"]

TYPES: tuple[str, ...] = PLAN_TYPES
DEFAULT_PRESET = "Q4_K_M"
# "Start from" offers llama.cpp's presets (mixtures of types, as llama-quantize makes them), then
# uniform plans: one type on every quantizable tensor (the CLI's --uniform).
UNIFORM_TYPES = ("Q8_0", "Q4_K", "Q4_0")
_ROLE_ORDER = (
    Role.TOKEN_EMBD,
    Role.ATTN_Q,
    Role.ATTN_K,
    Role.ATTN_V,
    Role.ATTN_QKV,
    Role.ATTN_OUT,
    Role.FFN_GATE,
    Role.FFN_UP,
    Role.FFN_GATE_UP,
    Role.FFN_DOWN,
    Role.FFN_GATE_EXPS,
    Role.FFN_UP_EXPS,
    Role.FFN_GATE_UP_EXPS,
    Role.FFN_DOWN_EXPS,
    Role.OUTPUT,
    Role.POS_EMBD,
    Role.TYPE_EMBD,
    Role.OTHER,
    Role.UNKNOWN,
)
_FALLBACK_BRUSH = QBrush(QColor(*FALLBACK_RGBA))
_MIXED = "mixed"


class _PlanCommand(QUndoCommand):
    def __init__(self, panel: PlanEditorPanel, old: Plan, new: Plan, text: str) -> None:
        super().__init__(text)
        self._panel, self._old, self._new = panel, old, new

    def redo(self) -> None:
        self._panel._set_plan(self._new)

    def undo(self) -> None:
        self._panel._set_plan(self._old)


class PlanTableModel(QAbstractTableModel):
    """Layers (rows) × roles (columns); each cell holds the quantizable tensors of that layer and role."""

    cellEdited = Signal(int, int, str)  # row, column, type asked for

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.rows: list[int | None] = []
        self.roles: list[Role] = []
        self.cells: dict[tuple[int, int], list[str]] = {}
        self.plan: Plan | None = None
        self._fallbacks: dict[str, Fallback] = {}

    def set_layout(self, layout: Any, roles_by_name: Mapping[str, Role]) -> None:
        """Build the grid from the exported tensors of a model."""
        self.beginResetModel()
        editable = [
            tm
            for tm in layout.tensors
            if allows_quantization(tm.gguf_name, len(tm.shape)) and math.prod(tm.shape) > 0
        ]
        layers = sorted({tm.layer for tm in editable if tm.layer is not None})
        self.rows = ([None] if any(tm.layer is None for tm in editable) else []) + layers
        # a merged tensor (llama.cpp's 3-D experts) has no checkpoint name: its layout knows its role
        role_of = {
            tm.hf_name: roles_by_name.get(tm.hf_name) or getattr(tm, "role", None) or Role.UNKNOWN
            for tm in editable
        }
        present = set(role_of.values())
        self.roles = [r for r in _ROLE_ORDER if r in present] + sorted(present - set(_ROLE_ORDER))
        self.cells = {}
        for tm in editable:
            key = (self.rows.index(tm.layer), self.roles.index(role_of[tm.hf_name]))
            self.cells.setdefault(key, []).append(tm.hf_name)
        self.endResetModel()

    def set_plan(self, plan: Plan | None) -> None:
        """Show ``plan``'s types."""
        self.plan = plan
        self._fallbacks = {f.tensor: f for f in plan.fallbacks} if plan is not None else {}
        if self.rows and self.roles:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.rows) - 1, len(self.roles) - 1))

    def tensors_at(self, row: int, column: int) -> list[str]:
        """HF names of the tensors in a cell."""
        return list(self.cells.get((row, column), ()))

    def cell_type(self, row: int, column: int) -> str:
        """The type shown in a cell ("" when empty, "mixed" when its tensors differ)."""
        names = self.cells.get((row, column))
        if not names or self.plan is None:
            return ""
        types = {self.plan.types.get(n, "F32") for n in names}
        return types.pop() if len(types) == 1 else _MIXED

    def cell_fallbacks(self, row: int, column: int) -> list[Fallback]:
        """Fallbacks applied to a cell's tensors."""
        return [self._fallbacks[n] for n in self.cells.get((row, column), ()) if n in self._fallbacks]

    # -- Qt model API
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.roles)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if orientation == Qt.Orientation.Horizontal:
            return self.roles[section].value if 0 <= section < len(self.roles) else None
        if 0 <= section < len(self.rows):
            layer = self.rows[section]
            return "model" if layer is None else f"layer {layer}"
        return None

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        if not index.isValid() or (index.row(), index.column()) not in self.cells:
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEditable

    def data(
        self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if not index.isValid():
            return None
        r, c = index.row(), index.column()
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            t = self.cell_type(r, c)
            if role == Qt.ItemDataRole.DisplayRole and t and self.cell_fallbacks(r, c):
                return f"{t} ⚠"
            return t
        if role == Qt.ItemDataRole.BackgroundRole:
            return _FALLBACK_BRUSH if self.cell_fallbacks(r, c) else None
        if role == Qt.ItemDataRole.ToolTipRole:
            names = self.cells.get((r, c))
            if not names:
                return None
            lines = [f"{n}: {self.plan.types.get(n, 'F32') if self.plan else '?'}" for n in names]
            lines += [
                f"fallback: {f.tensor} wanted {f.wanted}, got {f.got} ({f.reason})"
                for f in self.cell_fallbacks(r, c)
            ]
            return "\n".join(lines)
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignCenter)
        return None

    def setData(
        self, index: QModelIndex | QPersistentModelIndex, value: Any, role: int = Qt.ItemDataRole.EditRole
    ) -> bool:
        if role != Qt.ItemDataRole.EditRole or not index.isValid() or str(value) not in PLAN_TYPES:
            return False
        if (index.row(), index.column()) not in self.cells:
            return False
        # The panel turns the edit into an undoable plan change; the model shows it when the plan arrives.
        self.cellEdited.emit(index.row(), index.column(), str(value))
        return True


def type_combo(parent: QWidget, current: str = "") -> QComboBox:
    """A combo box of the GGUF types, at ``current`` (default the first)."""
    combo = QComboBox(parent)
    combo.addItems(list(TYPES))
    if current:
        combo.setCurrentText(current)
    return combo


class TypeDelegate(QStyledItemDelegate):
    """A combo box of GGUF types as the cell editor."""

    def createEditor(
        self, parent: QWidget, option: Any, index: QModelIndex | QPersistentModelIndex
    ) -> QWidget:
        return type_combo(parent)

    def setEditorData(self, editor: QWidget, index: QModelIndex | QPersistentModelIndex) -> None:
        t = index.data(Qt.ItemDataRole.EditRole)
        i = editor.findText(str(t)) if t else -1  # type: ignore[attr-defined]
        if i >= 0:
            editor.setCurrentIndex(i)  # type: ignore[attr-defined]

    def setModelData(self, editor: QWidget, model: Any, index: QModelIndex | QPersistentModelIndex) -> None:
        model.setData(index, editor.currentText(), Qt.ItemDataRole.EditRole)  # type: ignore[attr-defined]


class PlanEditorPanel(QWidget):
    """Edit the precision plan of the open model; the plan lives in ``StudioState.plan``."""

    planEdited = Signal(object)  # the plan now shown (after any change, undo or redo)
    errorShown = Signal(str)

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.jobs = jobs  # unused today: every operation here is instant
        self.plan: Plan | None = None
        self.summary: Any = None
        self.estimate: dict[str, Any] = {}
        self._info: Any = None
        self._layout_by_name: dict[str, Any] = {}
        self._roles: dict[str, Role] = {}
        self._updating = False
        self.undo_stack = QUndoStack(self)
        self._build()
        state.modelOpened.connect(self._on_model_opened)
        state.modelClosed.connect(self._on_model_closed)
        state.planChanged.connect(self._on_state_plan)
        for sig in ("hardwareChanged", "contextLengthChanged"):
            getattr(state, sig).connect(lambda *_: self._refresh_estimate())
        if state.checkpoint is not None:
            self._on_model_opened(state.checkpoint)
        self._update_enabled()

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        self.preset_combo = QComboBox(self)
        self.preset_combo.setToolTip("A llama.cpp preset, or one type on every quantizable tensor")
        self._add_heading("llama.cpp presets")
        for name, preset in PRESETS.items():
            self.preset_combo.addItem(name, f"preset:{name}")
            self.preset_combo.setItemData(
                self.preset_combo.count() - 1, preset.description, Qt.ItemDataRole.ToolTipRole
            )
        self.preset_combo.insertSeparator(self.preset_combo.count())
        self._add_heading("Uniform (one type)")
        for qtype in UNIFORM_TYPES:
            self.preset_combo.addItem(f"uniform {qtype}", f"uniform:{qtype}")
        self.preset_combo.setCurrentIndex(self.preset_combo.findData(f"preset:{DEFAULT_PRESET}"))
        self.preset_button = widgets.button("Apply", self, self._apply_start)

        self.keep_n = widgets.spin_box(self, 1, 999, 1)
        self.keep_type = type_combo(self, "Q8_0")
        self.keep_button = widgets.button(
            "Keep first/last N layers",
            self,
            lambda: self.keep_first_last(self.keep_n.value(), self.keep_type.currentText()),
            tip="The first and last N layers, the token embeddings and the output at the chosen type "
            "(as export --keep-first-last does)",
        )

        self.set_type = type_combo(self, "Q8_0")
        self.set_button = widgets.button(
            "Set selected cells", self, lambda: self.set_selected(self.set_type.currentText())
        )

        self.regex_edit = widgets.line_edit(self, r"regex on tensor names, e.g. mlp\.down_proj|attn_v")
        self.regex_type = type_combo(self, "Q6_K")
        self.regex_button = widgets.button(
            "Apply rule",
            self,
            lambda: self.apply_regex(self.regex_edit.text(), self.regex_type.currentText()),
        )

        self.save_button = widgets.button("Save plan…", self, self._save_dialog)
        self.load_button = widgets.button("Load plan…", self, self._load_dialog)

        self.undo_action = self.undo_stack.createUndoAction(self, "Undo")
        self.undo_action.setShortcut(QKeySequence("Ctrl+Z"))
        self.redo_action = self.undo_stack.createRedoAction(self, "Redo")
        self.redo_action.setShortcuts([QKeySequence("Ctrl+Shift+Z"), QKeySequence("Ctrl+Y")])
        for act in (self.undo_action, self.redo_action):
            act.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            self.addAction(act)
        self.undo_button = widgets.button("Undo", self, self.undo_stack.undo)
        self.redo_button = widgets.button("Redo", self, self.undo_stack.redo)
        self.undo_stack.canUndoChanged.connect(self.undo_button.setEnabled)
        self.undo_stack.canRedoChanged.connect(self.redo_button.setEnabled)
        self.undo_button.setEnabled(False)
        self.redo_button.setEnabled(False)

        row1 = QHBoxLayout()
        row1.addWidget(QLabel("Start from:", self))
        row1.addWidget(self.preset_combo)
        row1.addWidget(self.preset_button)
        row1.addSpacing(12)
        row1.addWidget(QLabel("N:", self))
        row1.addWidget(self.keep_n)
        row1.addWidget(self.keep_type)
        row1.addWidget(self.keep_button)
        row1.addStretch(1)
        row2 = QHBoxLayout()
        row2.addWidget(self.set_type)
        row2.addWidget(self.set_button)
        row2.addSpacing(12)
        row2.addWidget(self.regex_edit, 1)
        row2.addWidget(self.regex_type)
        row2.addWidget(self.regex_button)
        # undo/redo/save/load end this row, whose rule field gives way, not the first: that row then
        # needed ~1000 px, more than a 1280×720 window's page has beside the model tree (it scrolled)
        row2.addSpacing(12)
        for b in (self.undo_button, self.redo_button, self.save_button, self.load_button):
            row2.addWidget(b)

        self.model = PlanTableModel(self)
        self.model.cellEdited.connect(self._on_cell_edited)
        self.table = QTableView(self)
        self.table.setModel(self.model)
        self.delegate = TypeDelegate(self.table)
        self.table.setItemDelegate(self.delegate)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.SelectedClicked
        )

        self.size_label = QLabel("–", self)
        self.bpw_label = QLabel("–", self)
        self.verdict_label = QLabel("–", self)
        self.status = QLabel("", self)
        self.status.setWordWrap(True)
        bottom = QHBoxLayout()
        bottom.addWidget(QLabel("File size:", self))
        bottom.addWidget(self.size_label)
        bottom.addSpacing(12)
        bottom.addWidget(QLabel("Bits per weight:", self))
        bottom.addWidget(self.bpw_label)
        bottom.addSpacing(12)
        bottom.addWidget(QLabel("On this machine:", self))
        bottom.addWidget(self.verdict_label)
        bottom.addStretch(1)

        lay = QVBoxLayout(self)
        lay.addLayout(row1)
        lay.addLayout(row2)
        lay.addWidget(self.table, 1)
        lay.addLayout(bottom)
        lay.addWidget(self.status)

    # -- operations (each one undoable) -------------------------------------------------------------

    def apply_preset(self, preset: str) -> None:
        """Replace the plan with a llama.cpp preset's mixture of types."""
        self._start_from(lambda info: plan_from_preset(info, preset), f"Preset {preset}")

    def apply_uniform(self, qtype: str) -> None:
        """Replace the plan with ``qtype`` on every quantizable tensor."""
        self._start_from(lambda info: plan_uniform(info, qtype), f"Uniform {qtype}")

    def _start_from(self, make: Callable[[Any], Plan], text: str) -> None:
        info = self._info
        if info is not None:
            self._apply(lambda _plan: make(info), text)  # a new plan from the model, not from the old plan

    def _apply_start(self) -> None:
        kind, _, name = str(self.preset_combo.currentData()).partition(":")
        (self.apply_uniform if kind == "uniform" else self.apply_preset)(name)

    def _add_heading(self, text: str) -> None:
        # A label over a group of choices, not a choice itself.
        self.preset_combo.addItem(text)
        self.preset_combo.model().item(self.preset_combo.count() - 1).setEnabled(False)

    def set_tensors(self, names: list[str], qtype: str, text: str | None = None) -> None:
        """Ask for ``qtype`` on the named tensors (fallbacks applied where rows need it)."""
        if self.plan is None or not names:
            return
        changes = {n: qtype for n in names if n in self._layout_by_name}
        if changes:
            self._apply(
                lambda p: with_types(p, self._info, changes),
                text or f"Set {len(changes)} tensor(s) to {qtype}",
            )

    def set_cells(self, cells: list[tuple[int, int]], qtype: str) -> None:
        """Ask for ``qtype`` in the given (row, column) cells."""
        names = [n for r, c in cells for n in self.model.tensors_at(r, c)]
        self.set_tensors(names, qtype, f"Set {len(cells)} cell(s) to {qtype}")

    def set_selected(self, qtype: str) -> None:
        """Ask for ``qtype`` in every selected cell."""
        cells = sorted({(i.row(), i.column()) for i in self.table.selectionModel().selectedIndexes()})
        if not cells:
            self._error("Select one or more cells first.")
            return
        self.set_cells(cells, qtype)

    def keep_first_last(self, n: int, qtype: str) -> None:
        """Put the first and last ``n`` layers, the token embeddings and the output at ``qtype``
        (the core's ``keep_first_last``, as ``export --keep-first-last`` does)."""
        if self.plan is not None:
            self._apply(
                lambda p: keep_first_last(p, self._info, n, qtype), f"Keep first/last {n} layers at {qtype}"
            )

    def apply_regex(self, pattern: str, qtype: str) -> None:
        """Ask for ``qtype`` on every quantizable tensor whose HF or GGUF name matches ``pattern``
        (an override, as ``export --override`` adds one)."""
        if self.plan is None:
            return
        try:
            matched = tensors_matching(self._info, pattern)
        except StudioError as err:  # an invalid regular expression, in the words the CLI uses
            self._error(str(err))
            return
        if not matched:
            self._error(f"No quantizable tensor matches {pattern!r}.")
            return
        self._apply(
            lambda p: with_overrides(p, self._info, [Override(pattern, qtype)]), f"Rule {pattern} → {qtype}"
        )

    def save_plan(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON, atomically (``write_atomic``: a temporary file, then renamed)."""
        if self.plan is None:
            return
        write_atomic(path, self.plan.to_json())
        self.status.setText(f"Saved the plan to {Path(path)}.")

    def load_plan(self, path: str | os.PathLike[str]) -> bool:
        """Read a plan JSON made for this model; a bad file is reported and changes nothing."""
        if self._info is None:
            return False
        try:
            # the one door: a FIFO or a device must not block the GUI thread, a huge file is refused
            data = read_untrusted(path, "plan", StudioError, kind="json")
            plan = Plan.from_json(data.decode("utf-8", errors="replace"), self._info)
        except StudioError as err:
            self._error(f"{Path(path).name}: {err}")
            return False
        self._push(plan, f"Load {Path(path).name}")
        return True

    # -- plan plumbing -----------------------------------------------------------------------------

    def _apply(self, verb: Any, text: str) -> None:
        """Push ``verb(plan)`` as one undoable change; a refusal from the core is shown, nothing changes."""
        try:
            new = verb(self.plan)
        except StudioError as err:
            self._error(str(err))
            return
        self._push(new, text)

    def _push(self, new: Plan, text: str) -> None:
        assert_gui_thread("PlanEditorPanel._push")
        old = self.plan
        if old is None:
            self._set_plan(new)
            return
        self.undo_stack.push(_PlanCommand(self, old, new, text))

    def _set_plan(self, plan: Plan) -> None:
        self.plan = plan
        self.model.set_plan(plan)
        self.status.setText("")
        self._refresh_estimate()
        self._updating = True
        try:
            self.state.set_plan(plan)
        finally:
            self._updating = False
        self.planEdited.emit(plan)

    def _refresh_estimate(self) -> None:
        if self.plan is None or self._info is None:
            self.summary = None
            self.size_label.setText("–")
            self.bpw_label.setText("–")
            self.verdict_label.setText("–")
            return
        self.summary = self.plan.summary(self._info)
        self.size_label.setText(
            f"{human_bytes(self.summary.total_bytes)} ({self.summary.total_bytes:,} bytes of tensors)"
        )
        self.bpw_label.setText(f"{self.summary.bpw:.3f}")
        self.estimate = _fit(
            self._info, self.plan, self.summary, self.state.hardware, self.state.context_length
        )
        self.verdict_label.setText(self.estimate.get("text", "–"))

    def _error(self, message: str) -> None:
        set_status(self.status, message, error=True)
        self.errorShown.emit(message)

    # -- slots ------------------------------------------------------------------------------------

    @Slot(object)
    def _on_model_opened(self, checkpoint: Any) -> None:
        info = checkpoint.info
        self._info = info
        self._roles = {t.name: t.role for t in info.tensors}
        try:
            lay = layout(info)
        except StudioError as err:
            self._info = None
            self.model.set_layout(_EmptyLayout(), {})
            self._error(f"This model cannot be planned for GGUF: {err}")
            self._update_enabled()
            return
        self._layout_by_name = lay.by_hf()
        self.model.set_layout(lay, self._roles)
        self.undo_stack.clear()
        self.plan = None
        current = self.state.plan
        if isinstance(current, Plan) and set(current.types) == set(self._layout_by_name):
            self._set_plan(current)
        else:
            self.apply_preset(DEFAULT_PRESET)
        self.table.resizeColumnsToContents()
        self._update_enabled()

    @Slot()
    def _on_model_closed(self) -> None:
        self._info = None
        self.plan = None
        self._layout_by_name = {}
        self.undo_stack.clear()
        self.model.set_layout(_EmptyLayout(), {})
        self.model.set_plan(None)
        self._refresh_estimate()
        self._update_enabled()

    @Slot(object)
    def _on_state_plan(self, plan: Any) -> None:
        if self._updating or plan is self.plan or not isinstance(plan, Plan) or self._info is None:
            return
        self._push(plan, f"Plan {plan.name}")

    @Slot(int, int, str)
    def _on_cell_edited(self, row: int, column: int, qtype: str) -> None:
        self.set_cells([(row, column)], qtype)

    def _update_enabled(self) -> None:
        on = self._info is not None
        for w in (
            self.preset_button,
            self.keep_button,
            self.set_button,
            self.regex_button,
            self.save_button,
            self.load_button,
            self.table,
        ):
            w.setEnabled(on)

    def _save_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save plan", str(Path(folders.start_in(self.state)) / "plan.json"), "Plan JSON (*.json)"
        )
        folders.remember(self.state, path)
        if path:
            try:
                self.save_plan(path)
            except OSError as err:
                self._error(f"Cannot write {path}: {err.strerror or err}.")

    def _load_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Load plan", folders.start_in(self.state), "Plan JSON (*.json)"
        )
        folders.remember(self.state, path)
        if path:
            self.load_plan(path)

    @property
    def undo_shortcuts(self) -> tuple[QAction, QAction]:
        """The undo and redo actions (Ctrl+Z, Ctrl+Shift+Z) living on this panel."""
        return self.undo_action, self.redo_action


class _EmptyLayout:
    tensors: tuple[Any, ...] = ()


def _fit(info: Any, plan: Plan, summary: Any, hw: Any, ctx_len: int) -> dict[str, Any]:
    """Memory and verdict of ``plan`` on ``hw`` through studio.core.plan.estimate (its preset formula)."""
    direct = getattr(est, "estimate_plan", None)
    if direct is not None and hw is not None:
        e = direct(info, plan, hw, ctx_len)
        return {
            "memory": e.memory_bytes,
            "verdict": e.verdict,
            "text": f"{e.verdict.value} ({human_bytes(e.memory_bytes)})",
        }
    n_layers = info.n_layers or 0
    kv = est.kv_cache_bytes(info.config, n_layers, ctx_len)
    vocab = info.config.get("vocab_size") if isinstance(info.config.get("vocab_size"), int) else 0
    overhead = overhead_bytes(summary.total_bytes, vocab)
    memory = summary.total_bytes + kv + overhead
    if hw is None:
        return {
            "memory": memory,
            "verdict": None,
            "text": f"needs {human_bytes(memory)} (hardware not detected yet)",
        }
    verdict = est.verdict_for(memory, hw)
    return {
        "memory": memory,
        "verdict": verdict,
        "text": f"{verdict.value} ({human_bytes(memory)} at {ctx_len} ctx)",
    }
