"""A plot with nothing to show says why ("Run Calibrate to see activations") instead of drawing an empty
pair of axes with a meaningless ±400 range."""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg

__all__ = ["placeholder_text", "set_placeholder"]

_ATTR = "_qs_placeholder"


def set_placeholder(widget: Any, text: str | None) -> None:
    """Show ``text`` in the middle of the ``PlotWidget`` ``widget`` with its axes hidden; None or "" brings
    the axes back and lets the plot range follow its data again."""
    item = widget.getPlotItem()
    label = getattr(widget, _ATTR, None)
    if text:
        if label is None:
            label = pg.TextItem("", anchor=(0.5, 0.5))
            label.setZValue(100)
            setattr(widget, _ATTR, label)
        if label.scene() is None:
            item.addItem(label, ignoreBounds=True)
        fg = item.getAxis("left").textPen().color()
        label.setColor(fg)
        label.setText(text)
        vb = item.getViewBox()
        x0, x1 = (-1.0, 1.0)
        vb.setRange(xRange=(x0, x1), yRange=(x0, x1), padding=0)
        label.setPos(0.0, 0.0)
        for name in ("left", "bottom"):
            item.hideAxis(name)
        return
    if label is not None and label.scene() is not None:
        item.removeItem(label)
        for name in ("left", "bottom"):
            item.showAxis(name)
        item.getViewBox().enableAutoRange()


def placeholder_text(widget: Any) -> str:
    """The placeholder ``widget`` shows, or "" when it shows its data."""
    label = getattr(widget, _ATTR, None)
    return label.textItem.toPlainText() if label is not None and label.scene() is not None else ""
