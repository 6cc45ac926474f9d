"""Builders for the widgets every panel makes: buttons, spin boxes, combo boxes, line edits, path rows.

Each sets what its arguments say and nothing else, so a panel reads as the list of its controls.
Panels import the module (``from studio.qt import widgets``) and call ``widgets.button(...)``.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QHBoxLayout, QLineEdit, QPushButton, QSpinBox


def button(text: str, parent: Any, on_click: Any = None, *, tip: str = "", default: bool = False) -> Any:
    """A ``QPushButton`` with ``text`` whose click calls ``on_click`` (if given)."""
    b = QPushButton(text, parent)
    if default:
        b.setDefault(True)
    if tip:
        b.setToolTip(tip)
    if on_click is not None:
        b.clicked.connect(on_click)
    return b


def combo_box(parent: Any, items: Any = (), *, tip: str = "", on_change: Any = None) -> Any:
    """A ``QComboBox`` of ``(text, data)`` items; ``on_change`` follows its index once they are in."""
    combo = QComboBox(parent)
    for text, data in items:
        combo.addItem(text, data)
    if tip:
        combo.setToolTip(tip)
    if on_change is not None:
        combo.currentIndexChanged.connect(on_change)
    return combo


def line_edit(parent: Any, placeholder: str = "", on_change: Any = None) -> Any:
    """A ``QLineEdit`` showing ``placeholder`` while empty; every change of its text calls ``on_change``."""
    edit = QLineEdit(parent)
    if placeholder:
        edit.setPlaceholderText(placeholder)
    if on_change is not None:
        edit.textChanged.connect(on_change)
    return edit


def path_row(edit: Any, browse: Any) -> Any:
    """A row with a path field (stretching) and its browse button."""
    row = QHBoxLayout()
    row.addWidget(edit, 1)
    row.addWidget(browse)
    return row


def spin_box(
    parent: Any,
    lo: float,
    hi: float,
    value: float | None = None,
    *,
    decimals: int | None = None,
    step: float | None = None,
    prefix: str = "",
    suffix: str = "",
    special: str = "",
    tip: str = "",
) -> Any:
    """A spin box over ``[lo, hi]`` at ``value`` (default ``lo``): a ``QSpinBox`` for int bounds, a
    ``QDoubleSpinBox`` (showing ``decimals``) when a bound or the value is a float; ``special`` shows at ``lo``."""
    real = decimals is not None or any(isinstance(v, float) for v in (lo, hi, value))
    spin = QDoubleSpinBox(parent) if real else QSpinBox(parent)
    if decimals is not None:  # Qt shows (and rounds the range and value to) this many digits
        spin.setDecimals(decimals)
    if special:
        spin.setSpecialValueText(special)
    spin.setRange(lo, hi)
    if step is not None:
        spin.setSingleStep(step)
    if value is not None:
        spin.setValue(value)
    if prefix:
        spin.setPrefix(prefix)
    if suffix:
        spin.setSuffix(suffix)
    if tip:
        spin.setToolTip(tip)
    return spin
