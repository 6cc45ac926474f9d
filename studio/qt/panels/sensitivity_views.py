"""Two views of a sensitivity scan: a heat map of KL over layers × roles, and the most sensitive tensors
as a ranked bar chart. A click on a cell or a bar announces that tensor (``tensorClicked``).

Thin faces over ``studio.core.calib.sensitivity_map`` (the grid and the ranking).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from studio.qt.state import StudioState
from studio.qt.theme import HEAT_COLORMAP, follow_theme, plot_colors, role_color, style_plot

__all__ = ["RankedBars", "SensitivityHeatMap", "short_role"]

KL_FLOOR = 1e-9  # a KL of 0 (a float type) is drawn at this level: the map shows log10(KL)
BAR_HEIGHT = 0.7
# Column labels of the map: the roles' usual short names, so that nine columns fit side by side.
_SHORT_ROLES = {
    "token_embd": "embd",
    "attn_q": "q",
    "attn_k": "k",
    "attn_v": "v",
    "attn_qkv": "qkv",
    "attn_output": "attn_out",
    "ffn_gate": "gate",
    "ffn_up": "up",
    "ffn_gate_up": "gate_up",
    "ffn_down": "down",
    "ffn_gate_inp": "router",
    "output": "head",
}


def short_role(role: str) -> str:
    """The map's column label of ``role``."""
    return _SHORT_ROLES.get(role, role)


def _log_kl(kl: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(kl), np.nan, np.log10(np.maximum(kl, KL_FLOOR)))


class _ClickPlot(QWidget):
    """A plot whose left clicks arrive as data coordinates at ``clicked_at`` (x, y)."""

    tensorClicked = Signal(str)

    def __init__(self, state: StudioState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot = pg.PlotWidget(self)
        self.plot.setMenuEnabled(False)
        self.plot.getPlotItem().invertY(True)  # the first row at the top
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)
        self.plot.scene().sigMouseClicked.connect(self._scene_clicked)
        follow_theme(state, self._apply_theme)

    def _apply_theme(self, dark: bool) -> None:
        style_plot(self.plot, dark)

    def _scene_clicked(self, ev: Any) -> None:
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        vb = self.plot.getPlotItem().getViewBox()
        if not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        p = vb.mapSceneToView(ev.scenePos())
        name = self.tensor_at(p.x(), p.y())
        if name:
            self.tensorClicked.emit(name)

    def tensor_at(self, x: float, y: float) -> str | None:
        """The tensor drawn at data coordinates (``x``, ``y``), or None."""
        raise NotImplementedError

    def scene_pos_of(self, x: float, y: float) -> Any:
        """Where data point (``x``, ``y``) is on the plot widget (for clicks in tests and tools)."""
        vb = self.plot.getPlotItem().getViewBox()
        return self.plot.mapFromScene(vb.mapViewToScene(pg.Point(x, y)))


class SensitivityHeatMap(_ClickPlot):
    """log10 KL of every tensor in its (layer, role) cell; empty cells are transparent."""

    def __init__(self, state: StudioState, parent: QWidget | None = None) -> None:
        super().__init__(state, parent)
        self.grid: Any = None
        item = self.plot.getPlotItem()
        item.setLabel("bottom", "role")
        item.setLabel("left", "layer")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get(HEAT_COLORMAP))
        item.addItem(self.image)
        self.colorbar = pg.ColorBarItem(
            colorMap=pg.colormap.get(HEAT_COLORMAP), label="log10 KL", interactive=False
        )
        self.colorbar.setImageItem(self.image, insert_in=item)

    def set_grid(self, grid: Any) -> None:
        """Draw ``grid`` (a ``SensitivityGrid``), or clear the map with None."""
        self.grid = grid
        item = self.plot.getPlotItem()
        if grid is None or not grid.layers or not grid.roles:
            self.image.clear()
            return
        values = _log_kl(grid.kl)
        self.image.setImage(values, autoLevels=False)
        finite = values[np.isfinite(values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if hi - lo < 1e-6:
            lo, hi = lo - 0.5, hi + 0.5
        self.colorbar.setLevels((lo, hi))
        self.image.setRect(0, 0, len(grid.roles), len(grid.layers))
        item.getAxis("bottom").setTicks([[(j + 0.5, short_role(r)) for j, r in enumerate(grid.roles)]])
        rows = [(i + 0.5, "other" if layer is None else str(layer)) for i, layer in enumerate(grid.layers)]
        step = max(1, math.ceil(len(rows) / 32))  # a 40-layer model keeps readable labels
        item.getAxis("left").setTicks([rows[::step], rows])
        item.getViewBox().autoRange(padding=0)
        self.image.setToolTip("Click a cell to open that tensor in the inspector")

    def tensor_at(self, x: float, y: float) -> str | None:
        """The tensor of the cell under (``x`` = role column, ``y`` = layer row)."""
        if self.grid is None or x < 0 or y < 0:
            return None
        return self.grid.name_at(int(y), int(x))

    def cell_centre(self, row: int, col: int) -> Any:
        """The widget position of cell (``row``, ``col``)'s centre."""
        return self.scene_pos_of(col + 0.5, row + 0.5)


class RankedBars(_ClickPlot):
    """The most sensitive tensors as horizontal bars of KL, most sensitive on top, coloured by role."""

    def __init__(self, state: StudioState, parent: QWidget | None = None) -> None:
        super().__init__(state, parent)
        self.rows: tuple[tuple[str, str, float], ...] = ()
        self.bars: Any = None
        self._labels: Mapping[str, str] = {}
        self._roles: Mapping[str, str] = {}
        item = self.plot.getPlotItem()
        item.setLabel("bottom", "KL (this tensor alone)")  # short: the names take the width
        item.getAxis("bottom").enableAutoSIPrefix(False)

    def set_rows(
        self, rows: tuple[tuple[str, str, float], ...], labels: Mapping[str, str], roles: Mapping[str, str]
    ) -> None:
        """Draw ``rows`` (``(name, qtype, kl)``, most sensitive first) labelled ``labels[name]`` and
        coloured by ``roles[name]``."""
        item = self.plot.getPlotItem()
        if self.bars is not None:
            item.removeItem(self.bars)
            self.bars = None
        self.rows, self._labels, self._roles = tuple(rows), dict(labels), dict(roles)
        if not self.rows:
            item.getAxis("left").setTicks([[]])
            return
        brushes = [pg.mkBrush(role_color(self._roles.get(n, ""))) for n, _, _ in self.rows]
        self.bars = pg.BarGraphItem(
            x0=0.0,
            y=np.arange(len(self.rows), dtype=float),
            width=[kl for _, _, kl in self.rows],
            height=BAR_HEIGHT,
            brushes=brushes,
            pens=[pg.mkPen(None)] * len(self.rows),
        )
        item.addItem(self.bars)
        item.getAxis("left").setTicks(
            [[(i, f"{self._labels.get(n, n)} @ {q}") for i, (n, q, _) in enumerate(self.rows)]]
        )
        item.getViewBox().autoRange()

    def _apply_theme(self, dark: bool) -> None:
        super()._apply_theme(dark)
        self.plot.getPlotItem().getAxis("left").setTextPen(pg.mkPen(plot_colors(dark)["fg"]))

    def tensor_at(self, x: float, y: float) -> str | None:
        """The tensor of the bar row under ``y`` (anywhere along the row, so that tiny bars can be hit)."""
        i = round(y)
        if not self.rows or x < 0 or abs(y - i) > BAR_HEIGHT / 2 or not 0 <= i < len(self.rows):
            return None
        return self.rows[i][0]

    def bar_centre(self, i: int) -> Any:
        """The widget position of bar ``i``'s middle."""
        return self.scene_pos_of(self.rows[i][2] / 2, i)
