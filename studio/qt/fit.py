"""Pages that fit a laptop screen: every plot keeps a readable minimum size, splitters never squeeze a
pane to nothing, and a page taller than the window scrolls instead of shrinking its plots to slivers.

``fit_page`` is applied to each page's panel when it is built (``studio.qt.pages``); ``plot_heights``
is what the layout test and the screenshot script measure.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QGraphicsView, QScrollArea, QSplitter, QWidget

__all__ = [
    "MIN_PLOT_HEIGHT",
    "MIN_PLOT_WIDTH",
    "fit_page",
    "fit_window",
    "keep_on_screen",
    "plot_heights",
    "scrolled",
]

MIN_PLOT_HEIGHT = 120  # px: below this a plot's axes leave no room for its data
MIN_PLOT_WIDTH = 160


FRAME_ALLOWANCE = (16, 40)  # px around a window's client area: its borders and title bar


def fit_window(window: QWidget, width: int, height: int) -> None:
    """Size ``window`` ``width``×``height``, or smaller so that it, frame included, fits its screen's
    available area (a 1280×720 laptop showed only part of the 1400×860 default), centred there."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    if screen is None:  # no screen at all (a bare test platform): the size as asked
        window.resize(width, height)
        return
    area = screen.availableGeometry()
    fw, fh = FRAME_ALLOWANCE
    w = max(1, min(width, area.width() - fw))
    h = max(1, min(height, area.height() - fh))
    window.resize(w, h)
    # ``move`` places the frame's corner: centred, never above or left of the available area
    window.move(
        area.x() + max(0, (area.width() - w - fw) // 2), area.y() + max(0, (area.height() - h - fh) // 2)
    )


def keep_on_screen(window: QWidget) -> None:
    """Shrink ``window`` to fit its screen when it is too big for it (a geometry remembered from a
    bigger screen, which Qt restores to the screen's size with the frame past its edges)."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    if screen is None:
        return
    area = screen.availableGeometry()
    fw, fh = FRAME_ALLOWANCE
    if window.width() > area.width() - fw or window.height() > area.height() - fh:
        fit_window(window, window.width(), window.height())


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
