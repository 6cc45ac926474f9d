"""The panels' widget builders: each sets what its arguments say, and a combo's handler sees only the user's changes."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox, QWidget

from studio.qt import widgets


def test_spin_box_is_an_int_or_a_float_box_by_its_bounds(qtbot):
    parent = QWidget()
    qtbot.addWidget(parent)
    ints = widgets.spin_box(parent, 0, 100, 16, special="all", suffix=" tokens", tip="chunks")
    assert type(ints) is QSpinBox and (ints.minimum(), ints.maximum(), ints.value()) == (0, 100, 16)
    assert ints.specialValueText() == "all" and ints.suffix() == " tokens" and ints.toolTip() == "chunks"
    reals = widgets.spin_box(parent, 0.001, 5000.0, 2.5, decimals=3, step=0.5, prefix="> ")
    assert type(reals) is QDoubleSpinBox and reals.decimals() == 3 and reals.minimum() == 0.001
    assert (reals.value(), reals.singleStep(), reals.prefix()) == (2.5, 0.5, "> ")
    assert type(widgets.spin_box(parent, 0, 5, 1.5)) is QDoubleSpinBox  # a float value makes it real too


def test_combo_box_handler_follows_the_user_not_the_filling(qtbot):
    parent = QWidget()
    qtbot.addWidget(parent)
    seen: list[int] = []
    combo = widgets.combo_box(parent, [("F32", None), ("Q8_0", "q8_0")], tip="kv", on_change=seen.append)
    assert seen == []  # filling it is not a change
    assert [(combo.itemText(i), combo.itemData(i)) for i in range(combo.count())] == [
        ("F32", None),
        ("Q8_0", "q8_0"),
    ]
    combo.setCurrentIndex(1)
    assert seen == [1] and combo.toolTip() == "kv"


def test_button_line_edit_and_path_row(qtbot):
    parent = QWidget()
    qtbot.addWidget(parent)
    clicks: list[bool] = []
    b = widgets.button("Browse…", parent, lambda: clicks.append(True), tip="choose", default=True)
    qtbot.mouseClick(b, Qt.MouseButton.LeftButton)
    assert clicks == [True] and b.isDefault() and b.toolTip() == "choose" and b.text() == "Browse…"
    texts: list[str] = []
    edit = widgets.line_edit(parent, "a folder", texts.append)
    edit.setText("/tmp/x")
    assert edit.placeholderText() == "a folder" and texts == ["/tmp/x"]
    row = widgets.path_row(edit, b)
    assert row.itemAt(0).widget() is edit and row.stretch(0) == 1 and row.itemAt(1).widget() is b
