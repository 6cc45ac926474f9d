"""The app's remembered choices: one typed view over its ``QSettings`` keys, the only place that names them."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QByteArray, QSettings

RECENT_KEY = "recent/models"
GEOMETRY_KEY = "window/geometry"
STATE_KEY = "window/state"
PAGE_KEY = "window/page"
THEME_KEY = "view/theme"
OUTPUT_DIR_KEY = "export/output_folder"
PRESET_KEY = "export/preset"
BACKEND_KEY = "export/backend"
DEVICE_KEY = "quantize/device"

MAX_RECENT = 10
THEMES = ("system", "light", "dark")


class AppSettings:
    """Typed properties over a ``QSettings`` (the user's, or an INI file for tests and screenshots).

    Setting a property writes it at once; ``sync`` flushes to disk.
    """

    def __init__(self, qsettings: QSettings | None = None) -> None:
        self.qsettings = qsettings if qsettings is not None else QSettings()

    @classmethod
    def from_file(cls, path: str) -> AppSettings:
        """Settings kept in the INI file ``path`` instead of the user's."""
        return cls(QSettings(path, QSettings.Format.IniFormat))

    def sync(self) -> None:
        """Write pending changes to disk."""
        self.qsettings.sync()

    def _text(self, key: str, default: str = "") -> str:
        return str(self.qsettings.value(key, default) or default)

    def _bytes(self, key: str) -> QByteArray | None:
        value = self.qsettings.value(key)
        return value if isinstance(value, QByteArray) and not value.isEmpty() else None

    def _set(self, key: str, value: Any) -> None:
        self.qsettings.setValue(key, value)

    # -- models ------------------------------------------------------------------------------------

    @property
    def recent_models(self) -> list[str]:
        """Paths of recently opened models, most recent first."""
        value = self.qsettings.value(RECENT_KEY, [])
        if isinstance(value, str):  # QSettings returns a bare string for a one-element list in INI files
            value = [value] if value else []
        return [str(v) for v in (value or [])]

    @recent_models.setter
    def recent_models(self, paths: list[str]) -> None:
        self._set(RECENT_KEY, list(paths)[:MAX_RECENT])

    # -- window ------------------------------------------------------------------------------------

    @property
    def window_geometry(self) -> QByteArray | None:
        """The main window's saved geometry, or None."""
        return self._bytes(GEOMETRY_KEY)

    @window_geometry.setter
    def window_geometry(self, value: QByteArray) -> None:
        self._set(GEOMETRY_KEY, value)

    @property
    def window_state(self) -> QByteArray | None:
        """The main window's saved dock layout, or None."""
        return self._bytes(STATE_KEY)

    @window_state.setter
    def window_state(self, value: QByteArray) -> None:
        self._set(STATE_KEY, value)

    @property
    def page(self) -> str:
        """Title of the page shown last, or ""."""
        return self._text(PAGE_KEY)

    @page.setter
    def page(self, title: str) -> None:
        self._set(PAGE_KEY, title)

    @property
    def theme(self) -> str:
        """ "system" (follow the desktop), "light" or "dark"."""
        mode = self._text(THEME_KEY, "system")
        return mode if mode in THEMES else "system"

    @theme.setter
    def theme(self, mode: str) -> None:
        self._set(THEME_KEY, mode)

    # -- export and devices ------------------------------------------------------------------------

    @property
    def export_folder(self) -> str:
        """The folder of the last export, or ""."""
        return self._text(OUTPUT_DIR_KEY)

    @export_folder.setter
    def export_folder(self, folder: str) -> None:
        self._set(OUTPUT_DIR_KEY, folder)

    @property
    def export_preset(self) -> str:
        """The preset of the last export, or ""."""
        return self._text(PRESET_KEY)

    @export_preset.setter
    def export_preset(self, name: str) -> None:
        self._set(PRESET_KEY, name)

    @property
    def export_backend(self) -> str:
        """The back end of the last export: "studio" or "llama.cpp"."""
        return self._text(BACKEND_KEY, "studio")

    @export_backend.setter
    def export_backend(self, backend: str) -> None:
        self._set(BACKEND_KEY, backend)

    @property
    def device(self) -> str:
        """The device last chosen for quantization ("cuda:0", "mps", "cpu"), or ""."""
        return self._text(DEVICE_KEY)

    @device.setter
    def device(self, device: str) -> None:
        self._set(DEVICE_KEY, device)
