"""Where the app's data folders (``resources/``, ``icons/``) are, in every way Quant Studio is run.

* Installed wheel or PyInstaller bundle: the build copies them into the package as ``studio/_data/``.
* Source checkout or editable install: they are the top-level folders next to ``studio/``.

Callers get a path whether or not it exists, so they can show a clear error or fall back.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
"""The installed ``studio`` package folder."""

BUNDLED_DATA = PACKAGE_DIR / "_data"
"""Where wheels and the PyInstaller bundle put ``resources/`` and ``icons/``."""

SOURCE_ROOT = PACKAGE_DIR.parent
"""The repository root when running from a checkout (it holds ``pyproject.toml``)."""


def data_dir(kind: str) -> Path:
    """The folder ``kind`` ("resources" or "icons"): the bundled copy if present, else the checkout's."""
    bundled = BUNDLED_DATA / kind
    if bundled.is_dir():
        return bundled
    # Only trust the parent folder when it really is our checkout: in site-packages a stray
    # top-level "resources" from another distribution must not be picked up.
    if (SOURCE_ROOT / "pyproject.toml").is_file() and (SOURCE_ROOT / kind).is_dir():
        return SOURCE_ROOT / kind
    return bundled


def resource_path(*parts: str) -> Path:
    """A path inside ``resources/``, e.g. ``resource_path("text", "multilingual.txt")``."""
    return data_dir("resources").joinpath(*parts)


def icon_path(name: str) -> Path:
    """The icon file ``name`` in ``icons/``; a bare stem such as ``"quant-studio"`` means its ``.svg``."""
    return data_dir("icons") / (name if Path(name).suffix else f"{name}.svg")


__all__ = ["BUNDLED_DATA", "PACKAGE_DIR", "SOURCE_ROOT", "data_dir", "icon_path", "resource_path"]
