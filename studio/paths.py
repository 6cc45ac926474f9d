"""Where the app's data (``resources/``, ``icons/``) is, in every way Quant Studio is run.

Both top-level folders of the repository are packages of their own, shipped inside ``studio`` as
``studio._resources`` and ``studio._icons`` (pyproject.toml maps them with ``package-dir``). So:

* installed wheel, editable install, PyInstaller bundle: ``importlib.resources`` finds them;
* a source checkout run with ``PYTHONPATH`` (tests, development): the checkout's own folders, which
  also wins over an editable install of *another* checkout in the same virtual environment.

A new file anywhere under ``resources/`` or ``icons/`` ships without further edits. Callers get a
path whether or not it exists, so they can show a clear error.
"""

from __future__ import annotations

import importlib.resources
from functools import cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
"""The imported ``studio`` package folder."""

SOURCE_ROOT = PACKAGE_DIR.parent
"""The repository root when running from a checkout (it holds ``pyproject.toml``)."""

DATA_PACKAGES = {"resources": "studio._resources", "icons": "studio._icons"}
"""Top-level data folder -> the package it is shipped as."""


@cache
def data_dir(kind: str) -> Path:
    """The folder ``kind`` ("resources" or "icons") as a real directory."""
    package = DATA_PACKAGES[kind]
    checkout = SOURCE_ROOT / kind
    if (SOURCE_ROOT / "pyproject.toml").is_file() and (checkout / "__init__.py").is_file():
        return checkout
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        return PACKAGE_DIR / f"_{kind}"  # absent: callers report the missing file
    # Wheels and bundles install plain files, so the Traversable is a pathlib.Path already.
    return Path(str(root))


def resource_path(*parts: str) -> Path:
    """A path inside ``resources/``, e.g. ``resource_path("text", "multilingual.txt")``."""
    return data_dir("resources").joinpath(*parts)


def icon_path(name: str) -> Path:
    """The icon file ``name`` in ``icons/``; a bare stem such as ``"quant-studio"`` means its ``.svg``."""
    return data_dir("icons") / (name if Path(name).suffix else f"{name}.svg")


__all__ = ["DATA_PACKAGES", "PACKAGE_DIR", "SOURCE_ROOT", "data_dir", "icon_path", "resource_path"]
