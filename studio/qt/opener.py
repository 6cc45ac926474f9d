"""Opening models: folders, GGUF files, Hub snapshots and the demo, in the background, into the state.

``ModelOpener`` runs ``Services.open_model`` in a job, asks before opening pickle weights, reports a
failure as one sentence in a dialog, and remembers what was opened for File → Open recent
(``RecentMenu``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QFileDialog, QMenu, QMessageBox, QWidget

from studio.core.errors import UnsafeFileError
from studio.core.jobs import JobCancelled, JobContext
from studio.qt.demo_screen import show_first_screen
from studio.qt.fmt import model_display_name
from studio.qt.jobs import Job, JobManager
from studio.qt.services import Services
from studio.qt.settings import AppSettings
from studio.qt.state import StudioState

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
DEMO_NAME = "SmolLM2-135M-Instruct (demo)"
STATUS_MS = 8000


def _close_checkpoint(result: Any) -> None:
    """Release a checkpoint (or a (path, checkpoint) pair) that arrived after its job was cancelled."""
    ckpt = result[1] if isinstance(result, tuple) else result
    close = getattr(ckpt, "close", None)
    if close is not None:
        close()


def _looks_like_pickle(path: Path) -> bool:
    """Whether ``path`` is, or is a folder holding only, pickle weights (so an opt-in makes sense)."""
    if path.is_file():
        return path.suffix.lower() in PICKLE_SUFFIXES
    if path.is_dir():
        names = [p.suffix.lower() for p in path.iterdir()]
        return any(s in PICKLE_SUFFIXES for s in names) and ".safetensors" not in names
    return False


class ModelOpener(QObject):
    """Opens one model at a time in the background and makes it the state's model.

    ``before_announce`` runs just before the model is announced (the window builds its panels then,
    so they are listening).
    """

    statusMessage = Signal(str, int)  # text for the status bar, milliseconds
    recentChanged = Signal()

    def __init__(
        self,
        services: Services,
        state: StudioState,
        jobs: JobManager,
        settings: AppSettings,
        window: QWidget,
        *,
        before_announce: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(window)
        self._services, self._state, self._jobs, self._settings = services, state, jobs, settings
        self._window = window
        self._before_announce = before_announce
        self._model_path: Path | None = None

    @property
    def model_path(self) -> Path | None:
        """Where the open model really is (a Hub id resolved to its snapshot), or None."""
        return self._model_path if self._state.checkpoint is not None else None

    # -- asking ------------------------------------------------------------------------------------

    @Slot()
    def ask_open_folder(self) -> None:
        """Ask for a model folder and open it."""
        folder = QFileDialog.getExistingDirectory(self._window, "Open a model folder", self.last_dir())
        if folder:
            self._state.last_folder = str(Path(folder).parent)
            self.open_path(folder)

    @Slot()
    def ask_open_gguf(self) -> None:
        """Ask for a GGUF file and open it."""
        path, _ = QFileDialog.getOpenFileName(
            self._window, "Open a GGUF file", self.last_dir(), "GGUF files (*.gguf);;All files (*)"
        )
        if path:
            self._state.last_folder = str(Path(path).parent)
            self.open_path(path)

    def last_dir(self) -> str:
        """Where the file dialogs start: where the user last was, beside the most recent model, or home."""
        last = getattr(self._state, "last_folder", "")
        if last and Path(last).is_dir():
            return last
        recent = self._settings.recent_models
        return str(Path(recent[0]).parent) if recent else str(Path.home())

    # -- opening -----------------------------------------------------------------------------------

    def _busy(self) -> bool:
        if self._jobs.active_jobs("open"):
            self.statusMessage.emit("A model is being opened already; wait for it or cancel it.", 5000)
            return True
        return False

    def open_path(self, path: str | Path, *, allow_pickle: bool = False) -> Job | None:
        """Open a model folder, GGUF file or Hub cache snapshot in the background; None if one is opening."""
        if self._busy():
            return None
        target = Path(path).expanduser()
        open_model = self._services.open_model  # the worker must not touch the window

        def task(ctx: JobContext) -> Any:
            ctx.report(0, 1, f"Reading {target.name}")
            ckpt = open_model(target, ctx, allow_pickle)
            if ctx.cancelled:
                ckpt.close()
                raise JobCancelled()
            return ckpt

        job = self._jobs.submit(
            f"Opening {model_display_name(target)}",
            task,
            kind="open",
            on_success=lambda ckpt: self._opened(target, ckpt),
            on_error=lambda msg: self._open_failed(target, msg, allow_pickle, job.exception),
            discard=_close_checkpoint,
        )
        return job

    @Slot()
    def open_demo(self) -> Job | None:
        """Prepare (once) or reuse the demo model (SmolLM2-135M-Instruct) in the background, then open it."""
        if self._busy():
            return None
        services = self._services

        def task(ctx: JobContext) -> tuple[Path, Any]:
            ctx.report(0, 1, "Preparing the demo model")
            path = Path(services.demo_model_path(ctx))
            ctx.check_cancelled()
            ckpt = services.open_model(path, ctx, False)
            if ctx.cancelled:
                ckpt.close()
                raise JobCancelled()
            return path, ckpt

        return self._jobs.submit(
            "Opening the demo model",
            task,
            kind="open",
            on_success=lambda result: self._demo_opened(*result),
            on_error=lambda msg: self._show_error("Cannot open the demo model", msg),
            discard=_close_checkpoint,
        )

    def _demo_opened(self, path: Path, checkpoint: Any) -> None:
        self._opened(path, checkpoint, DEMO_NAME)
        show_first_screen(self._window)

    def _opened(self, path: Path, checkpoint: Any, name: str = "") -> None:
        # The checkpoint knows where it really is (a Hub id resolves to its cache snapshot).
        where = Path(getattr(checkpoint.info, "path", path) or path)
        self._model_path = where
        name = name or model_display_name(where)
        self._before_announce()
        self._state.set_checkpoint(checkpoint, name)
        self.remember(where)
        self.statusMessage.emit(f"Opened {name}: {len(checkpoint.info.tensors)} tensors.", STATUS_MS)

    def _open_failed(self, path: Path, message: str, allowed_pickle: bool, exc: BaseException | None) -> None:
        if not allowed_pickle and isinstance(exc, UnsafeFileError) and _looks_like_pickle(path):
            answer = QMessageBox.question(
                self._window,
                "Open pickle weights?",
                f"{message}\n\nOpen it anyway? Only plain tensors are loaded (torch.load with "
                "weights_only=True); no code from the file is run.",
                QMessageBox.StandardButton.Open | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )
            if answer == QMessageBox.StandardButton.Open:
                self.open_path(path, allow_pickle=True)
            return
        self._show_error("Cannot open model", message)

    def _show_error(self, title: str, message: str) -> None:
        self.statusMessage.emit(message, 10000)
        QMessageBox.warning(self._window, title, message)

    # -- recent models -----------------------------------------------------------------------------

    def recent_models(self) -> list[str]:
        """Remembered model paths, most recent first."""
        return self._settings.recent_models

    def remember(self, path: Path) -> None:
        """Put ``path`` first in the recent models."""
        key = str(path.resolve()) if path.exists() else str(path)
        self._settings.recent_models = [key, *(p for p in self.recent_models() if p != key)]
        self._settings.sync()
        self.recentChanged.emit()


class RecentMenu(QMenu):
    """File → Open recent: the remembered models that still exist, and "Clear list"."""

    def __init__(self, opener: ModelOpener, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__("Open &recent", parent)
        self._opener, self._settings = opener, settings
        self.aboutToShow.connect(self.refill)
        opener.recentChanged.connect(self.refill)
        self.refill()

    @Slot()
    def refill(self) -> None:
        """List the remembered models again, forgetting those that were moved or deleted."""
        recent = self._settings.recent_models
        existing = [p for p in recent if Path(p).exists()]
        if existing != recent:
            self._settings.recent_models = existing
        self.clear()
        for i, p in enumerate(existing):
            label = f"&{i + 1}  {model_display_name(p)}" if i < 9 else model_display_name(p)
            act = self.addAction(label)
            act.setToolTip(p)
            act.setStatusTip(p)
            act.setData(p)
            act.triggered.connect(lambda _checked=False, p=p: self._opener.open_path(p))
        if not existing:
            self.addAction("No recent models").setEnabled(False)
        else:
            self.addSeparator()
            self.addAction("Clear list", self._clear)

    def _clear(self) -> None:
        self._settings.recent_models = []
        self.refill()
