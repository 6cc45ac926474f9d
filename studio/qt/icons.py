"""Icons of the app, read from its icons/ folder (SVG, see studio.paths), with the desktop theme as fallback."""

from __future__ import annotations

from functools import cache

from PySide6.QtGui import QIcon

from studio.paths import icon_path

# Freedesktop theme names used when our SVG is not installed (e.g. a wheel without the icons folder).
_THEME_FALLBACK = {
    "open-folder": "folder-open",
    "open-gguf": "document-open",
    "demo": "applications-science",
    "quit": "application-exit",
    "cancel": "process-stop",
    "export": "document-save-as",
}


@cache
def icon(name: str) -> QIcon:
    """The icon called ``name`` (file stem in icons/), or an empty icon when neither file nor theme has it."""
    path = icon_path(name)
    if path.is_file():
        return QIcon(str(path))
    return QIcon.fromTheme(_THEME_FALLBACK.get(name, name))


def app_icon() -> QIcon:
    """The application's icon."""
    return icon("quant-studio")
