"""Pages that fit a laptop screen: every plot keeps a readable minimum size, splitters never squeeze a
pane to nothing, and a page taller than the window scrolls instead of shrinking its plots to slivers.

``fit_page`` is applied to each page's panel when it is built (``studio.qt.pages``); ``plot_heights``
is what the layout test and the screenshot script measure.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGraphicsView, QScrollArea, QSplitter, QWidget

__all__ = ["MIN_PLOT_HEIGHT", "MIN_PLOT_WIDTH", "fit_page", "plot_heights", "scrolled"]

MIN_PLOT_HEIGHT = 120  # px: below this a plot's axes leave no room for its data
MIN_PLOT_WIDTH = 160


def fit_page(panel: QWidget) -> None:
    """Give every plot of ``panel`` its minimum size and make its splitters keep every pane."""
    for view in panel.findChildren(QGraphicsView):  # pyqtgraph's plots are graphics views
        view.setMinimumHeight(max(view.minimumHeight(), MIN_PLOT_HEIGHT))
        view.setMinimumWidth(max(view.minimumWidth(), MIN_PLOT_WIDTH))
    for split in panel.findChildren(QSplitter):
        split.setChildrenCollapsible(False)


def scrolled(widget: QWidget, parent: QWidget | None = None) -> QScrollArea:
    """``widget`` in a frameless scroll area that scrolls only when the window is smaller than it needs."""
    area = QScrollArea(parent)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidgetResizable(True)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
    area.setWidget(widget)
    return area


def plot_heights(root: QWidget) -> list[tuple[str, int]]:
    """(name, height in px) of every plot of ``root`` that is on screen (visible, in the shown tab)."""
    out = []
    for view in root.findChildren(QGraphicsView):
        if view.isVisible():
            name = view.objectName() or _describe(view)
            out.append((name, view.height()))
    return out


def _describe(view: QWidget) -> str:
    """A plot's name for reports: its class and the attribute that holds it in its panel, if any."""
    parent = view.parentWidget()
    while parent is not None:
        for attr, value in vars(parent).items():
            if value is view:
                return f"{type(parent).__name__}.{attr}"
        parent = parent.parentWidget()
    return type(view).__name__
