"""The main window: menus, docks for the panels, status bar, and the controller that runs core calls in jobs.

Panels get the shared ``StudioState`` and nothing else; this window is the only place that starts
background work (through ``JobManager``) and turns its results into state changes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, QTimer, Slot
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QIcon,
    QKeySequence,
    QPalette,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QTabWidget,
    QToolButton,
    QWidget,
)

from studio.core.errors import StudioError, UnsafeFileError
from studio.core.jobs import JobCancelled, JobContext
from studio.qt.fmt import describe_hardware, model_display_name
from studio.qt.icons import app_icon, icon
from studio.qt.jobs import Job, JobManager, JobState
from studio.qt.model_tree import ModelTreePanel
from studio.qt.services import Services
from studio.qt.state import StudioState
from studio.qt.summary import SummaryPanel
from studio.qt.tensor_panel import TensorPanel

log = logging.getLogger(__name__)

APP_TITLE = "Quant Studio"
RECENT_KEY = "recent/models"
MAX_RECENT = 10
GEOMETRY_KEY = "window/geometry"
STATE_KEY = "window/state"
LAYOUT_VERSION = 1  # bump when docks change incompatibly, so an old saved layout is ignored
SHUTDOWN_WAIT_MS = 5000
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
DEMO_NAME = "Demo model"


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


class MainWindow(QMainWindow):
    """Quant Studio's main window; later panels slot in through ``add_dock`` and ``add_tab``."""

    def __init__(
        self,
        services: Services,
        *,
        settings: QSettings | None = None,
        state: StudioState | None = None,
        jobs: JobManager | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("MainWindow")
        self.services = services
        self.settings = settings if settings is not None else QSettings()
        self.state = state if state is not None else StudioState(self)
        self.jobs = jobs if jobs is not None else JobManager(parent=self)
        self._model_path: Path | None = None
        self._started = False
        self._shut_down = False
        self._docks: dict[str, QDockWidget] = {}

        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self.setDockOptions(
            QMainWindow.DockOption.AnimatedDocks
            | QMainWindow.DockOption.AllowTabbedDocks
            | QMainWindow.DockOption.AllowNestedDocks
        )
        self._build_actions()
        self._build_menus()
        self._build_panels()
        self._build_status_bar()

        # Connected after the panels so they reset before the controller fills them again.
        self.state.modelOpened.connect(self._on_model_opened)
        self.state.modelClosed.connect(self._update_title)
        self.state.modelOpened.connect(self._recompute_estimates)
        self.state.hardwareChanged.connect(self._recompute_estimates)
        self.state.contextLengthChanged.connect(self._recompute_estimates)
        self.state.hardwareChanged.connect(self._on_hardware)
        self.jobs.jobChanged.connect(self._on_job_changed)
        self.jobs.busyChanged.connect(self._on_busy_changed)

        self.resize(1400, 860)
        self._restore_layout()
        self._update_title()
        self._update_theme()

    # -- construction -----------------------------------------------------------------------------

    def _action(
        self, text: str, slot: Any, *, shortcut: Any = None, icon_name: str = "", tip: str = ""
    ) -> QAction:
        act = QAction(icon(icon_name) if icon_name else QIcon(), text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
        if tip:
            act.setStatusTip(tip)
            act.setToolTip(tip)
        act.triggered.connect(slot)
        return act

    def _build_actions(self) -> None:
        self.act_open_folder = self._action(
            "Open &folder…",
            self.ask_open_folder,
            shortcut="Ctrl+O",
            icon_name="open-folder",
            tip="Open a Hugging Face model folder (config.json + safetensors)",
        )
        self.act_open_gguf = self._action(
            "Open &GGUF…",
            self.ask_open_gguf,
            shortcut="Ctrl+Shift+O",
            icon_name="open-gguf",
            tip="Open a GGUF file read-only for inspection",
        )
        self.act_open_demo = self._action(
            "Open &demo model",
            self.open_demo,
            icon_name="demo",
            tip="Build a small demo model locally (no network) and open it",
        )
        self.act_close_model = self._action(
            "&Close model", self.state.close_model, shortcut=QKeySequence.StandardKey.Close
        )
        self.act_close_model.setEnabled(False)
        self.act_quit = self._action("&Quit", self.close, shortcut="Ctrl+Q", icon_name="quit")
        self.act_quit.setMenuRole(QAction.MenuRole.QuitRole)
        self.act_cancel_jobs = self._action("Cancel running &jobs", self.jobs.cancel_all, icon_name="cancel")
        self.act_cancel_jobs.setEnabled(False)
        self.act_reset_layout = self._action("&Reset layout", self.reset_layout)
        self.act_about = self._action("&About Quant Studio", self._about)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        self.file_menu = bar.addMenu("&File")
        self.file_menu.addAction(self.act_open_folder)
        self.file_menu.addAction(self.act_open_gguf)
        self.file_menu.addAction(self.act_open_demo)
        self.recent_menu = QMenu("Open &recent", self)
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        self.file_menu.addMenu(self.recent_menu)
        self.file_menu.addSeparator()
        self.file_menu.addAction(self.act_close_model)
        self.file_menu.addSeparator()
        self.file_menu.addAction(self.act_quit)
        self._fill_recent_menu()

        self.view_menu = bar.addMenu("&View")
        self._view_docks_anchor = self.view_menu.addSeparator()
        self.view_menu.addAction(self.act_reset_layout)

        self.jobs_menu = bar.addMenu("&Jobs")
        self.jobs_menu.addAction(self.act_cancel_jobs)

        help_menu = bar.addMenu("&Help")
        help_menu.addAction(self.act_about)

    def _build_panels(self) -> None:
        self.tabs = QTabWidget(self)
        self.tabs.setObjectName("CentralTabs")
        self.tabs.setDocumentMode(True)
        self.summary = SummaryPanel(
            self.state, (self.act_open_folder, self.act_open_gguf, self.act_open_demo), self
        )
        self.add_tab(self.summary, "Summary")
        self.setCentralWidget(self.tabs)

        self.model_tree = ModelTreePanel(self.state, self)
        tree_dock = self.add_dock(
            self.model_tree, "Model", "ModelTreeDock", Qt.DockWidgetArea.LeftDockWidgetArea
        )
        self.tensor_panel = TensorPanel(self.state, self)
        tensor_dock = self.add_dock(
            self.tensor_panel, "Tensor", "TensorDock", Qt.DockWidgetArea.BottomDockWidgetArea
        )
        # The tree runs the full height; bottom docks (tensor, later jobs) sit under the central area.
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.setCorner(Qt.Corner.BottomRightCorner, Qt.DockWidgetArea.RightDockWidgetArea)
        self.resizeDocks([tree_dock], [580], Qt.Orientation.Horizontal)
        self.resizeDocks([tensor_dock], [300], Qt.Orientation.Vertical)
        self._default_state = QByteArray()  # captured on first show, for "Reset layout"

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.job_label = QLabel(self)
        self.job_progress = QProgressBar(self)
        self.job_progress.setMaximumWidth(220)
        self.job_progress.setTextVisible(True)
        self.job_cancel = QToolButton(self)
        self.job_cancel.setDefaultAction(self.act_cancel_jobs)
        self.job_cancel.setAutoRaise(True)
        self.hardware_status = QLabel("Detecting hardware…", self)
        self.hardware_status.setObjectName("HardwareStatus")
        for w in (self.job_label, self.job_progress, self.job_cancel):
            bar.addPermanentWidget(w)
            w.hide()
        bar.addPermanentWidget(self.hardware_status)

    # -- public API for panels-to-come and tests ---------------------------------------------------

    def add_dock(
        self,
        widget: QWidget,
        title: str,
        object_name: str,
        area: Qt.DockWidgetArea = Qt.DockWidgetArea.RightDockWidgetArea,
        *,
        tabify_with: str | None = None,
    ) -> QDockWidget:
        """Put ``widget`` in a dock (named for saved layouts) and list it in the View menu."""
        dock = QDockWidget(title, self)
        dock.setObjectName(object_name)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        if tabify_with and tabify_with in self._docks:
            self.tabifyDockWidget(self._docks[tabify_with], dock)
        self._docks[object_name] = dock
        self.view_menu.insertAction(self._view_docks_anchor, dock.toggleViewAction())
        return dock

    def add_tab(self, widget: QWidget, title: str) -> int:
        """Add a page to the central tab widget; returns its index."""
        return self.tabs.addTab(widget, title)

    def dock(self, object_name: str) -> QDockWidget:
        """The dock called ``object_name``."""
        return self._docks[object_name]

    @property
    def model_path(self) -> Path | None:
        """Path of the open model, or None."""
        return self._model_path if self.state.checkpoint is not None else None

    def recent_models(self) -> list[str]:
        """Remembered model paths, most recent first."""
        value = self.settings.value(RECENT_KEY, [])
        if isinstance(value, str):  # QSettings returns a bare string for a one-element list in INI files
            value = [value] if value else []
        return [str(v) for v in (value or [])]

    # -- opening ----------------------------------------------------------------------------------

    @Slot()
    def ask_open_folder(self) -> None:
        """Ask for a model folder and open it."""
        folder = QFileDialog.getExistingDirectory(self, "Open a model folder", self._last_dir())
        if folder:
            self.open_path(folder)

    @Slot()
    def ask_open_gguf(self) -> None:
        """Ask for a GGUF file and open it."""
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a GGUF file", self._last_dir(), "GGUF files (*.gguf);;All files (*)"
        )
        if path:
            self.open_path(path)

    def open_path(self, path: str | Path, *, allow_pickle: bool = False) -> Job | None:
        """Open a model folder, GGUF file or Hub cache snapshot in the background; None if one is opening."""
        if self.jobs.active_jobs("open"):
            self.statusBar().showMessage("A model is being opened already; wait for it or cancel it.", 5000)
            return None
        target = Path(path).expanduser()
        open_model = self.services.open_model  # the worker must not touch the window

        def task(ctx: JobContext) -> Any:
            ctx.report(0, 1, f"Reading {target.name}")
            ckpt = open_model(target, ctx, allow_pickle)
            if ctx.cancelled:
                ckpt.close()
                raise JobCancelled()
            return ckpt

        job = self.jobs.submit(
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
        """Build (or reuse) the local demo checkpoint in the background, then open it."""
        if self.jobs.active_jobs("open"):
            self.statusBar().showMessage("A model is being opened already; wait for it or cancel it.", 5000)
            return None
        services = self.services

        def task(ctx: JobContext) -> tuple[Path, Any]:
            ctx.report(0, 1, "Building the demo model")
            path = Path(services.demo_model_path(ctx))
            ctx.check_cancelled()
            ckpt = services.open_model(path, ctx, False)
            if ctx.cancelled:
                ckpt.close()
                raise JobCancelled()
            return path, ckpt

        return self.jobs.submit(
            "Opening the demo model",
            task,
            kind="open",
            on_success=lambda result: self._opened(*result, DEMO_NAME),
            on_error=lambda msg: self._show_error("Cannot open the demo model", msg),
            discard=_close_checkpoint,
        )

    def _opened(self, path: Path, checkpoint: Any, name: str = "") -> None:
        # The checkpoint knows where it really is (a Hub id resolves to its cache snapshot).
        where = Path(getattr(checkpoint.info, "path", path) or path)
        self._model_path = where
        name = name or model_display_name(where)
        self.state.set_checkpoint(checkpoint, name)
        self._remember(where)
        info = checkpoint.info
        self.statusBar().showMessage(f"Opened {name}: {len(info.tensors)} tensors.", 8000)

    def _open_failed(self, path: Path, message: str, allowed_pickle: bool, exc: BaseException | None) -> None:
        if not allowed_pickle and isinstance(exc, UnsafeFileError) and _looks_like_pickle(path):
            answer = QMessageBox.question(
                self,
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
        self.statusBar().showMessage(message, 10000)
        QMessageBox.warning(self, title, message)

    # -- recent models ------------------------------------------------------------------------------

    def _remember(self, path: Path) -> None:
        key = str(path.resolve()) if path.exists() else str(path)
        recent = [p for p in self.recent_models() if p != key]
        recent.insert(0, key)
        self.settings.setValue(RECENT_KEY, recent[:MAX_RECENT])
        self.settings.sync()
        self._fill_recent_menu()

    @Slot()
    def _fill_recent_menu(self) -> None:
        recent = self.recent_models()
        existing = [p for p in recent if Path(p).exists()]
        if existing != recent:  # forget models that were moved or deleted
            self.settings.setValue(RECENT_KEY, existing)
        self.recent_menu.clear()
        for i, p in enumerate(existing):
            label = f"&{i + 1}  {model_display_name(p)}" if i < 9 else model_display_name(p)
            act = self.recent_menu.addAction(label)
            act.setToolTip(p)
            act.setStatusTip(p)
            act.setData(p)
            act.triggered.connect(lambda _checked=False, p=p: self.open_path(p))
        if not existing:
            self.recent_menu.addAction("No recent models").setEnabled(False)
        else:
            self.recent_menu.addSeparator()
            self.recent_menu.addAction("Clear list", self._clear_recent)

    def _clear_recent(self) -> None:
        self.settings.setValue(RECENT_KEY, [])
        self._fill_recent_menu()

    def _last_dir(self) -> str:
        recent = self.recent_models()
        return str(Path(recent[0]).parent) if recent else str(Path.home())

    # -- hardware and estimates -----------------------------------------------------------------------

    def detect_hardware(self) -> Job | None:
        """Detect CUDA/MPS/CPU in the background and record it in the state."""
        if self._shut_down:
            return None
        return self.jobs.submit(
            "Detecting hardware",
            lambda _ctx: self.services.detect_hardware(),
            kind="hardware",
            on_success=self.state.set_hardware,
            on_error=lambda msg: self.hardware_status.setText(f"Hardware unknown: {msg}"),
        )

    @Slot(object)
    def _on_hardware(self, hw: Any) -> None:
        self.hardware_status.setText(describe_hardware(hw, short=True))
        self.hardware_status.setToolTip(describe_hardware(hw))

    @Slot()
    def _recompute_estimates(self, *_args: Any) -> None:
        info, hw = self.state.info, self.state.hardware
        if info is None or hw is None:
            if self.state.estimates:
                self.state.set_estimates(())
            return
        try:
            estimates = self.services.estimate_presets(info, hw, self.state.context_length)
        except StudioError as err:
            self.statusBar().showMessage(str(err), 10000)
            estimates = ()
        except Exception as err:
            log.exception("estimating presets failed")
            self.statusBar().showMessage(
                f"Estimating the presets failed ({type(err).__name__}: {err}).", 10000
            )
            estimates = ()
        self.state.set_estimates(tuple(estimates))

    # -- state and job feedback ---------------------------------------------------------------------

    @Slot(object)
    def _on_model_opened(self, _checkpoint: Any) -> None:
        self._update_title()

    @Slot()
    def _update_title(self) -> None:
        ckpt = self.state.checkpoint
        self.act_close_model.setEnabled(ckpt is not None)
        if ckpt is None:
            self.setWindowTitle(APP_TITLE)
        else:
            self.setWindowTitle(f"{self.state.model_name} — {APP_TITLE}")

    @Slot(object)
    def _on_job_changed(self, _job: Job) -> None:
        active = [j for j in self.jobs.active_jobs() if j.kind != "hardware"]
        if not active:
            for w in (self.job_label, self.job_progress, self.job_cancel):
                w.hide()
            return
        job = active[-1]
        more = f" (+{len(active) - 1} more)" if len(active) > 1 else ""
        self.job_label.setText(f"{job.message or job.title}{more}")
        if job.total > 0:
            self.job_progress.setRange(0, 1000)
            self.job_progress.setValue(int(1000 * min(1.0, job.done / job.total)))
        else:
            self.job_progress.setRange(0, 0)  # busy indicator until the total is known
        for w in (self.job_label, self.job_progress, self.job_cancel):
            w.show()

    @Slot(bool)
    def _on_busy_changed(self, busy: bool) -> None:
        self.act_cancel_jobs.setEnabled(busy)
        self._on_job_changed(None)  # type: ignore[arg-type]

    # -- layout, theme, life cycle --------------------------------------------------------------------

    def _restore_layout(self) -> None:
        geometry = self.settings.value(GEOMETRY_KEY)
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        self._default_state = self.saveState(LAYOUT_VERSION)
        state = self.settings.value(STATE_KEY)
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.restoreState(state, LAYOUT_VERSION)

    def save_layout(self) -> None:
        """Remember the window geometry and dock layout."""
        self.settings.setValue(GEOMETRY_KEY, self.saveGeometry())
        self.settings.setValue(STATE_KEY, self.saveState(LAYOUT_VERSION))
        self.settings.sync()

    @Slot()
    def reset_layout(self) -> None:
        """Put every dock back where it starts."""
        for dock in self._docks.values():
            dock.setFloating(False)
            dock.show()
        if not self._default_state.isEmpty():
            self.restoreState(self._default_state, LAYOUT_VERSION)

    def _update_theme(self) -> None:
        self.state.set_dark(self.palette().color(QPalette.ColorRole.Window).lightness() < 128)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (
            QEvent.Type.PaletteChange,
            QEvent.Type.ApplicationPaletteChange,
            QEvent.Type.ThemeChange,
        ):
            self._update_theme()
        super().changeEvent(event)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._started:
            self._started = True
            # After the first paint: nothing slow may delay the window appearing.
            QTimer.singleShot(0, self.detect_hardware)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile():
            self.open_path(urls[0].toLocalFile())
            event.acceptProposedAction()

    def _about(self) -> None:
        from studio import __version__

        QMessageBox.about(
            self,
            f"About {APP_TITLE}",
            f"<b>{APP_TITLE}</b> {__version__}<br>Inspect, plan, quantize and export LLMs as GGUF on your own PC.",
        )

    def _confirm_quit(self, jobs: list[Job]) -> bool:
        names = "\n".join(f"• {j.title}" for j in jobs[:5])
        answer = QMessageBox.question(
            self,
            "Quit while jobs run?",
            f"These jobs are still running:\n{names}\n\nCancel them and quit?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    def shutdown(self) -> None:
        """Save the layout, cancel all jobs, wait for them (bounded) and close the model. Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        self.save_layout()
        if not self.jobs.shutdown(SHUTDOWN_WAIT_MS):
            log.warning("some jobs did not stop within %d ms", SHUTDOWN_WAIT_MS)
        self.state.close_model()

    def closeEvent(self, event: QCloseEvent) -> None:
        important = [
            j for j in self.jobs.active_jobs() if j.confirm_on_quit and j.state is not JobState.CANCELLED
        ]
        if important and not self._shut_down and not self._confirm_quit(important):
            event.ignore()
            return
        self.shutdown()
        super().closeEvent(event)
