"""Help → Keyboard shortcuts: every shortcut of the window's menus (and of its panels), in a table."""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QMenu,
    QMenuBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)


def shortcut_rows(
    menubar: QMenuBar, panel_actions: Iterable[tuple[str, QAction]] = ()
) -> list[tuple[str, str]]:
    """(action, key sequence) for every shortcut in ``menubar``'s menus, in menu order, then those of
    ``panel_actions`` ((panel name, action) pairs), each action once."""
    seen: set[int] = set()
    rows: list[tuple[str, str]] = []

    def add(act: QAction, where: str = "") -> None:
        if id(act) in seen or act.isSeparator():
            return
        seen.add(id(act))
        keys = [
            k.toString(QKeySequence.SequenceFormat.NativeText) for k in act.shortcuts() if not k.isEmpty()
        ]
        if keys:
            label = act.property("shortcutLabel") or act.text().replace("&", "").replace("…", "").strip()
            rows.append((f"{label} ({where})" if where else str(label), ", ".join(keys)))

    def walk(menu: QMenu) -> None:
        for act in menu.actions():
            if act.menu() is not None:
                walk(act.menu())
            else:
                add(act)

    for act in menubar.actions():
        if act.menu() is not None:
            walk(act.menu())
    for where, act in panel_actions:
        add(act, where)
    return rows


class ShortcutsDialog(QDialog):
    """A read-only table of (action, shortcut) rows; deletes itself when closed."""

    def __init__(self, rows: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ShortcutsDialog")
        self.setWindowTitle("Keyboard shortcuts")
        table = QTableWidget(len(rows), 2, self)
        table.setObjectName("ShortcutsTable")
        table.setHorizontalHeaderLabels(["Action", "Shortcut"])
        table.verticalHeader().setVisible(False)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setShowGrid(False)
        table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        for r, (text, keys) in enumerate(rows):
            table.setItem(r, 0, QTableWidgetItem(text))
            table.setItem(r, 1, QTableWidgetItem(keys))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(table)
        lay.addWidget(buttons)
        self.resize(460, 560)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
