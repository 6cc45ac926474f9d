"""The app's remembered choices: one typed view over its ``QSettings`` keys, the only place that names them."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

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
CALIB_SOURCE_KEY = "calibrate/source"
CALIB_FILE_KEY = "calibrate/file"
CALIB_CTX_KEY = "calibrate/ctx"
CALIB_CHUNKS_KEY = "calibrate/chunks"
CALIB_SOURCES = ("builtin", "text", "chat")
LLAMA_EXTRA_BUFFERS_KEY = "llama/extra_buffers"
UPLOAD_NAMESPACE_KEY = "hub/upload_namespace"
LAST_FOLDER_KEY = "dialogs/last_folder"

MAX_RECENT = 10
THEMES = ("system", "light", "dark")

T = TypeVar("T")


class _Setting(Generic[T]):
    """One key of the settings as a typed attribute of ``AppSettings``: reading decodes, writing stores."""

    def __init__(self, key: str, doc: str) -> None:
        self.key = key
        self.__doc__ = doc

    def decode(self, raw: Any) -> T:
        raise NotImplementedError

    @overload
    def __get__(self, obj: None, owner: type) -> _Setting[T]: ...
    @overload
    def __get__(self, obj: AppSettings, owner: type) -> T: ...
    def __get__(self, obj: AppSettings | None, owner: type) -> Any:
        return self if obj is None else self.decode(obj.qsettings.value(self.key))

    def __set__(self, obj: AppSettings, value: T) -> None:
        obj.qsettings.setValue(self.key, value)


class _Text(_Setting[str]):
    def __init__(self, key: str, doc: str, default: str = "", choices: tuple[str, ...] = ()) -> None:
        super().__init__(key, doc)
        self.default, self.choices = default, choices

    def decode(self, raw: Any) -> str:
        text = str(raw or self.default)
        return text if not self.choices or text in self.choices else self.default


class _Int(_Setting[int]):
    def __init__(self, key: str, doc: str, default: int, lo: int, hi: int) -> None:
        super().__init__(key, doc)
        self.default, self.lo, self.hi = default, lo, hi

    def decode(self, raw: Any) -> int:
        try:
            v = int(raw)
        except (TypeError, ValueError):
            return self.default
        return v if self.lo <= v <= self.hi else self.default


class _Bytes(_Setting["QByteArray | None"]):
    def decode(self, raw: Any) -> QByteArray | None:
        return raw if isinstance(raw, QByteArray) and not raw.isEmpty() else None


class _Paths(_Setting["list[str]"]):
    def decode(self, raw: Any) -> list[str]:
        if isinstance(raw, str):  # QSettings returns a bare string for a one-element list in INI files
            raw = [raw] if raw else []
        return [str(v) for v in (raw or [])]

    def __set__(self, obj: AppSettings, value: list[str]) -> None:
        super().__set__(obj, list(value)[:MAX_RECENT])


class AppSettings:
    """Typed attributes over a ``QSettings`` (the user's, or an INI file for tests and screenshots).

    Setting an attribute writes it at once; ``sync`` flushes to disk.
    """

    recent_models = _Paths(RECENT_KEY, f"Recently opened models, most recent first (at most {MAX_RECENT}).")
    window_geometry = _Bytes(GEOMETRY_KEY, "The main window's saved geometry, or None.")
    window_state = _Bytes(STATE_KEY, "The main window's saved dock layout, or None.")
    page = _Text(PAGE_KEY, 'Title of the page shown last, or "".')
    theme = _Text(THEME_KEY, '"system" (follow the desktop), "light" or "dark".', "system", THEMES)
    export_folder = _Text(OUTPUT_DIR_KEY, 'The folder of the last export, or "".')
    export_preset = _Text(PRESET_KEY, 'The preset of the last export, or "".')
    export_backend = _Text(BACKEND_KEY, 'The back end of the last export: "studio" or "llama.cpp".', "studio")
    device = _Text(DEVICE_KEY, 'The device last chosen for quantization ("cuda:0", "mps", "cpu"), or "".')
    calib_source = _Text(
        CALIB_SOURCE_KEY,
        'Calibration text: "builtin", "text" (a file) or "chat" (JSONL).',
        "builtin",
        CALIB_SOURCES,
    )
    calib_file = _Text(CALIB_FILE_KEY, 'The calibration file last chosen, or "".')
    calib_ctx = _Int(CALIB_CTX_KEY, "Tokens per calibration chunk.", 512, 16, 1 << 20)
    calib_chunks = _Int(CALIB_CHUNKS_KEY, "Calibration chunks to use (0: all).", 0, 0, 1 << 20)
    llama_extra_buffers = _Text(
        LLAMA_EXTRA_BUFFERS_KEY,
        'Whether llama.cpp loads use its extra buffer types: "auto", "on" or "off".',
        "auto",
        ("auto", "on", "off"),
    )
    upload_namespace = _Text(UPLOAD_NAMESPACE_KEY, 'The user or organisation of the last Hub upload, or "".')
    last_folder = _Text(
        LAST_FOLDER_KEY, 'The folder the last file dialog ended in (the next starts there), or "".'
    )

    def __init__(self, qsettings: QSettings | None = None) -> None:
        self.qsettings = qsettings if qsettings is not None else QSettings()

    @classmethod
    def from_file(cls, path: str) -> AppSettings:
        """Settings kept in the INI file ``path`` instead of the user's."""
        return cls(QSettings(path, QSettings.Format.IniFormat))

    def sync(self) -> None:
        """Write pending changes to disk."""
        self.qsettings.sync()
