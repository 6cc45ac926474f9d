"""Every colour of the window: the light and dark palettes, plot colours, status and verdict colours,
and the switch between the light, dark and system themes.

Panels take their colours from here and never spell one themselves, so a theme change is one edit.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QLabel, QWidget

from studio.qt.settings import THEMES, AppSettings
from studio.qt.state import StudioState

# -- plots -----------------------------------------------------------------------------------------

_PLOT_DARK = {"bg": "#1e1e1e", "fg": "#d0d0d0", "main": "#4ea3ff", "second": "#ffb454", "outlier": "#ff4d4d"}
_PLOT_LIGHT = {"bg": "#ffffff", "fg": "#303030", "main": "#1f6fd0", "second": "#e07b00", "outlier": "#d00000"}
MAIN_FILL_ALPHA = 80  # a histogram's area under its line
ERROR_FILL_ALPHA = 70  # the error histogram's area
SECOND_FILL_ALPHA = 60  # a second histogram (activations) under its line
HEAT_COLORMAP = "viridis"  # heat maps (the sensitivity map): perceptually uniform, reads on light and dark


def plot_colors(dark: bool) -> dict[str, Any]:
    """Colours of plots for a light or dark window: bg, fg, main, second and outlier."""
    return dict(_PLOT_DARK if dark else _PLOT_LIGHT)


def fill_color(color: str, alpha: int) -> QColor:
    """``color`` made translucent, for the area under a histogram."""
    c = QColor(color)
    c.setAlpha(alpha)
    return c


def style_plot(widget: Any, dark: bool) -> None:
    """Apply the light/dark background and axis colours to a pyqtgraph ``PlotWidget``."""
    c = plot_colors(dark)
    widget.setBackground(c["bg"])
    item = widget.getPlotItem()
    for name in ("left", "bottom"):
        ax = item.getAxis(name)
        ax.setPen(c["fg"])  # the axis makes the pen (pyqtgraph's mkPen): pyqtgraph is not imported here
        ax.setTextPen(c["fg"])


def follow_theme(state: StudioState, restyle: Callable[[bool], None]) -> None:
    """Call ``restyle(dark)`` now and whenever the window turns light or dark."""
    state.themeChanged.connect(restyle)
    restyle(state.dark)


def set_plot_defaults(dark: bool) -> None:
    """pyqtgraph's default colours for plots made from now on (the panels restyle their own plots)."""
    if "pyqtgraph" not in sys.modules:
        return  # never imported here just for this: it costs ~0.2 s
    # Not sys.modules[...]: while the start-up job still imports pyqtgraph on a worker thread the entry
    # is a half-initialised module; import_module waits for that import to finish.
    pg = importlib.import_module("pyqtgraph")
    c = plot_colors(dark)
    pg.setConfigOptions(background=c["bg"], foreground=c["fg"])


# By role value (studio.core.modelinfo.Role), so that this module imports nothing of the core.
_ROLE_COLORS = {
    "token_embd": "#7f7f7f",
    "attn_q": "#1f77b4",
    "attn_k": "#17becf",
    "attn_v": "#2ca02c",
    "attn_qkv": "#1f77b4",
    "attn_output": "#9467bd",
    "ffn_gate": "#ff7f0e",
    "ffn_up": "#bcbd22",
    "ffn_gate_up": "#ff7f0e",
    "ffn_down": "#d62728",
    "output": "#8c564b",
}
_OTHER_ROLE_COLOR = "#e377c2"


def role_color(role: Any) -> str:
    """The colour of a tensor role's points in plots (a ``Role`` or its value)."""
    return _ROLE_COLORS.get(str(getattr(role, "value", role)), _OTHER_ROLE_COLOR)


# -- status lines, marks and verdicts ----------------------------------------------------------------

ERROR_COLOR = {False: "#c62828", True: "#ff6b6b"}  # on a light / dark window
DIVERGE_COLOR = "#ffd54f"  # the first token where a chat column departs from the first one
FALLBACK_RGBA = (255, 190, 90, 150)  # a plan cell whose tensors took a fallback type
WARNING_RGB = (230, 160, 0)
_VERDICT_RGB = {
    "FITS_GPU": (40, 170, 70),  # green
    "PARTIAL_OFFLOAD": WARNING_RGB,  # amber
    "CPU_ONLY": (38, 139, 210),  # blue
    "DOES_NOT_FIT": (220, 50, 47),  # red
}
_UNKNOWN_RGB = (128, 128, 128)


def is_dark(palette: QPalette) -> bool:
    """Whether ``palette`` is a dark one (its window colour is dark)."""
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def error_color(widget: QWidget) -> str:
    """The error colour that reads on ``widget``'s (light or dark) background."""
    return ERROR_COLOR[is_dark(widget.palette())]


def note_colour(widget: QWidget) -> QColor:
    """The muted colour for side notes in a transcript: the palette's placeholder text colour."""
    return widget.palette().color(QPalette.ColorRole.PlaceholderText)


def set_status(label: QLabel, text: str, *, error: bool = False) -> None:
    """Show ``text`` in a panel's status line, in the theme's error colour when ``error``."""
    label.setText(text)
    label.setStyleSheet(f"color: {error_color(label)};" if error else "")


def verdict_colour(verdict: Any) -> QColor:
    """A translucent background for a fit verdict that reads on light and dark palettes alike."""
    rgb = _VERDICT_RGB.get(getattr(verdict, "name", str(verdict)), _UNKNOWN_RGB)
    return QColor(*rgb, 90)


# The lab's perplexity verdicts (studio.core.evaluate.verdict.Verdict values), by their text.
_QUALITY_RGB = {
    "excellent": (40, 170, 70),
    "good": (120, 175, 40),
    "acceptable": WARNING_RGB,
    "something went wrong": (220, 50, 47),
}
# Lines of one chart told apart by colour (tab10), and the parts of a memory bar.
_SERIES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_MEMORY_PARTS = {"weights": "#1f77b4", "kv": "#ff7f0e", "overhead": "#9a9a9a"}


def quality_colour(verdict: Any) -> QColor:
    """A translucent badge background for a ΔPPL verdict (a ``Verdict`` or its text)."""
    rgb = _QUALITY_RGB.get(str(getattr(verdict, "value", verdict)), _UNKNOWN_RGB)
    return QColor(*rgb, 110)


def set_badge(label: QLabel, verdict: Any, text: str | None = None) -> None:
    """Draw ``label`` as a verdict badge: the verdict's words on its translucent colour."""
    c = quality_colour(verdict)
    label.setText(text if text is not None else str(getattr(verdict, "value", verdict)))
    label.setStyleSheet(
        f"background: rgba({c.red()},{c.green()},{c.blue()},{c.alpha()}); border-radius: 4px; padding: 2px 6px;"
    )


def series_color(i: int) -> str:
    """The colour of the ``i``-th line of a chart with several."""
    return _SERIES[i % len(_SERIES)]


def memory_part_color(part: str) -> str:
    """The colour of one part of a memory bar: ``weights``, ``kv`` or ``overhead``."""
    return _MEMORY_PARTS[part]


def warning_box_style(object_name: str) -> str:
    """A style sheet that draws the label called ``object_name`` as an amber warning box."""
    r, g, b = WARNING_RGB
    return (
        f"QLabel#{object_name} {{ background: rgba({r},{g},{b},60); border: 1px solid rgba({r},{g},{b},160);"
        " border-radius: 4px; padding: 6px; }"
    )


# -- palettes and the theme switch -------------------------------------------------------------------


def dark_palette() -> QPalette:
    """A dark palette for the Fusion style, used when the platform cannot switch colour schemes itself."""
    p = QPalette()
    base, window, text = QColor(30, 30, 30), QColor(45, 45, 45), QColor(220, 220, 220)
    disabled = QColor(127, 127, 127)
    for role, colour in (
        (QPalette.ColorRole.Window, window),
        (QPalette.ColorRole.WindowText, text),
        (QPalette.ColorRole.Base, base),
        (QPalette.ColorRole.AlternateBase, QColor(40, 40, 40)),
        (QPalette.ColorRole.ToolTipBase, window),
        (QPalette.ColorRole.ToolTipText, text),
        (QPalette.ColorRole.PlaceholderText, disabled),
        (QPalette.ColorRole.Text, text),
        (QPalette.ColorRole.Button, window),
        (QPalette.ColorRole.ButtonText, text),
        (QPalette.ColorRole.BrightText, QColor(255, 80, 80)),
        (QPalette.ColorRole.Link, QColor(90, 160, 255)),
        (QPalette.ColorRole.Highlight, QColor(42, 110, 200)),
        (QPalette.ColorRole.HighlightedText, QColor(255, 255, 255)),
        (QPalette.ColorRole.Light, QColor(70, 70, 70)),
        (QPalette.ColorRole.Midlight, QColor(60, 60, 60)),
        (QPalette.ColorRole.Mid, QColor(50, 50, 50)),
        (QPalette.ColorRole.Dark, QColor(20, 20, 20)),
        (QPalette.ColorRole.Shadow, QColor(0, 0, 0)),
    ):
        p.setColor(role, colour)
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def light_palette() -> QPalette:
    """The light palette of the current style."""
    app = QApplication.instance()
    style = app.style() if isinstance(app, QApplication) else None
    return style.standardPalette() if style is not None else QPalette()


class ThemeSwitch(QObject):
    """Applies the remembered theme ("system", "light" or "dark") and keeps ``state.dark`` true to the palette."""

    def __init__(self, state: StudioState, settings: AppSettings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._state = state
        self._settings = settings
        self._own_palette = False  # whether the app palette is ours rather than the platform's
        state.themeChanged.connect(set_plot_defaults)

    @property
    def mode(self) -> str:
        """The remembered theme."""
        return self._settings.theme

    def apply(self, mode: str, *, remember: bool = True, window: QWidget | None = None) -> None:
        """Use the light or dark palette, or follow the system's colour scheme ("system")."""
        if mode not in THEMES:
            raise ValueError(f"unknown theme {mode!r}")
        if remember:
            self._settings.theme = mode
        app = QApplication.instance()
        hints = QGuiApplication.styleHints()
        scheme = {"light": Qt.ColorScheme.Light, "dark": Qt.ColorScheme.Dark}.get(mode)
        # Qt ≥ 6.8 switches the palette itself where the platform supports it; elsewhere we set one.
        if hasattr(hints, "setColorScheme"):
            if scheme is None:
                hints.unsetColorScheme()
            else:
                hints.setColorScheme(scheme)
        if isinstance(app, QApplication):
            dark = is_dark(app.palette())
            if mode == "dark" and not dark:
                app.setPalette(dark_palette())
                self._own_palette = True
            elif mode == "light" and dark:
                app.setPalette(light_palette())
                self._own_palette = True
            elif mode == "system" and self._own_palette:
                app.setPalette(QPalette())  # back to the platform's palette
                self._own_palette = False
            # The widgets' palettes follow by (posted) change events; the plots follow now.
            self._state.set_dark(is_dark(app.palette()))
        elif window is not None:
            self.follow(window)

    def follow(self, window: QWidget) -> None:
        """Record whether ``window``'s palette is dark (after a palette or colour scheme change)."""
        self._state.set_dark(is_dark(window.palette()))
