"""A dismissable banner above the pages: a hint that stays until the user closes it (a status-bar message
is cut off at the window's width and gone on the first hover)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

__all__ = ["Banner"]


class Banner(QFrame):
    """One word-wrapped line of text and a close button; hidden until ``show_text``."""

    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Banner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(
            "#Banner { background: palette(alternate-base); border: 1px solid palette(mid); border-radius: 4px; }"
        )
        self.label = QLabel(self)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.close_button = QToolButton(self)
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.dismiss)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 4, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def text(self) -> str:
        """What the banner says ("" when nothing was shown)."""
        return self.label.text()

    def show_text(self, text: str) -> None:
        """Show ``text`` until dismissed."""
        self.label.setText(text)
        self.show()

    def dismiss(self) -> None:
        """Hide the banner (the close button)."""
        self.hide()
        self.dismissed.emit()
