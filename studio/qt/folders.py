"""Files where people find them: exports go to a visible folder (the last one used, or
``~/Documents/Quant Studio``), every file dialog starts where the user last was, and a finished file can
be shown in the desktop's file manager."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QStandardPaths, QUrl
from PySide6.QtGui import QDesktopServices

from studio.qt.state import StudioState

__all__ = ["documents_folder", "is_hidden", "remember", "show_in_folder", "start_in", "visible_export_folder"]


def documents_folder() -> Path:
    """``~/Documents/Quant Studio`` (``$QUANT_STUDIO_DOCUMENTS`` when set): where exports go by default."""
    env = os.environ.get("QUANT_STUDIO_DOCUMENTS")
    if env:
        return Path(env).expanduser()

    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    return Path(docs or Path.home() / "Documents") / "Quant Studio"


def is_hidden(folder: Path) -> bool:
    """Whether ``folder`` is somewhere a file manager hides (a dot folder such as ``~/.cache``)."""
    return any(part.startswith(".") and part not in (".", "..") for part in Path(folder).expanduser().parts)


def visible_export_folder(last: str, model_path: Path | None) -> Path:
    """The folder an export goes to: ``last`` when it exists, else the model's folder unless it is
    hidden (the demo lives in a cache), else the documents folder (created)."""
    if last and last != "." and Path(last).is_dir():
        return Path(last)
    if model_path is not None:
        parent = Path(model_path).parent
        if parent.is_dir() and not is_hidden(parent):
            return parent
    folder = documents_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Path.home()
    return folder


def start_in(state: StudioState, fallback: str | Path = "") -> str:
    """Where a file dialog opens: the folder the user was last in, else ``fallback``, else home."""
    last = getattr(state, "last_folder", "")
    if last and Path(last).is_dir():
        return str(last)
    return str(fallback or Path.home())


def remember(state: StudioState, chosen: str | Path) -> None:
    """Keep the folder of ``chosen`` (a file or a folder) as where the next file dialog opens."""
    if not chosen:
        return
    p = Path(chosen).expanduser()
    state.last_folder = str(p if p.is_dir() else p.parent)


def show_in_folder(path: str | Path) -> bool:
    """Open the folder holding ``path`` in the desktop's file manager; False when none could."""
    p = Path(path)
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(p if p.is_dir() else p.parent)))
