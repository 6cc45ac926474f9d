"""The central tab widget's pages after "Summary": each panel is built on first need, or one per
event-loop turn just after the window first shows, so the window appears before pyqtgraph and numba load.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import QApplication, QLabel, QTabWidget, QVBoxLayout, QWidget

from studio.core.jobs import JobCancelled, JobContext
from studio.qt.fit import fit_page, scrolled
from studio.qt.heap import settle_heap
from studio.qt.jobs import Job, JobManager
from studio.qt.state import StudioState
from studio.qt.theme import set_plot_defaults

log = logging.getLogger(__name__)

PAGE_BUILD_STEP_MS = 30  # between two panels built after start-up: the event loop runs in between
# Core modules the panels import lazily while they are built (numba-compiled quantizers: ~1 s), and
# those the job slots import on the GUI thread when a job starts or ends (the budget dialog's scan
# settings import the sensitivity scan: 1-4 s the first time): imported here, in the start-up worker,
# they cost the GUI thread a dictionary look-up. None of them imports torch, transformers or ray.
PRELOAD_MODULES = (
    "studio.core.quant.blocks",
    "studio.core.stats.tensor_stats",
    "studio.core.calib.sensitivity",
    "studio.core.calib.sensitivity_map",
    "studio.core.calib.analysis",
    "studio.core.plan.allocate",
    "studio.core.evaluate",
    "studio.core.export.job",
    "studio.core.cluster",
)

# Imported in a worker just after the panels are built, while the user looks at the new window. Importing
# torch holds the GIL for one long stretch (torch._C's initialisation: ~1 s, 2 s on a busy machine) even
# on a worker thread, and so do parts of transformers' model classes (1-2 s more), so the GUI thread
# would stall that long in the first job that needs them (opening a model loads its chat column,
# Calibrate, Evaluate's original); here it is paid once, before any work.
WARM_MODULES = (
    "torch",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
)


# the calibration's reductions (numba too): compiled in the same child, so a first Calibrate does not
CHILD_KERNELS = ("studio.core.calib._reduce_kernel:prepare_kernels",)


def _prepare_kernels(ctx: JobContext) -> None:
    """Compile the quantization kernels in a child process (once per install), then load them here.

    numba holds the GIL for up to a second at a time while it compiles, so a first scan or export that
    compiled here froze the window (``studio.core.quant.warm``); loading the compiled code from numba's
    cache is short, and here it is paid while the window starts, not in the first scan."""
    warm = importlib.import_module("studio.core.quant.warm")  # numba: imported in this worker, not at start
    try:
        if warm.ensure_compiled(ctx, also=CHILD_KERNELS):
            warm.warm_kernels(ctx)
            for name in CHILD_KERNELS:
                warm.call_named(name)
    except JobCancelled:
        raise
    except Exception:  # the first scan or export compiles them instead
        log.exception("preparing the quantization kernels failed")


@dataclass(frozen=True)
class PageSpec:
    """A page whose panel class ``cls`` in ``module`` (maybe heavy) is built as ``cls(state, jobs, parent)``."""

    key: str  # how the window names the page: its title in lower case
    title: str
    module: str
    cls: str


# In tab order; a page whose module is not installed is left out.
PAGES = (
    PageSpec("inspector", "Inspector", "studio.qt.panels.inspector", "InspectorPanel"),
    PageSpec("preview", "Preview", "studio.qt.panels.preview", "PreviewPanel"),
    PageSpec("overview", "Overview", "studio.qt.panels.overview", "OverviewPanel"),
    PageSpec("plan", "Plan", "studio.qt.panels.plan_editor", "PlanEditorPanel"),
    PageSpec("hub", "Hub", "studio.qt.panels.hub_panel", "HubPanel"),
    PageSpec("chat", "Chat", "studio.qt.panels.chat_panel", "ChatPanel"),
    PageSpec("evaluate", "Evaluate", "studio.qt.panels.eval_panel", "EvalPanel"),
    PageSpec("calibrate", "Calibrate", "studio.qt.panels.calibrate_panel", "CalibratePanel"),
    PageSpec("lab", "Lab", "studio.qt.panels.lab_panel", "LabPanel"),
)


# The window's dialogs, built on first open: (module, class). Their modules import pyqtgraph, the
# allocator and the export pipeline at their top, so they are imported here only then.
DIALOGS = {
    "budget": ("studio.qt.panels.budget_dialog", "BudgetDialog"),
    "export": ("studio.qt.panels.export_dialog", "ExportDialog"),
}


def dialog_class(key: str) -> type:
    """The class of the dialog ``DIALOGS[key]``, its module imported now."""
    module, cls = DIALOGS[key]
    return getattr(importlib.import_module(module), cls)


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


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
            fit_page(widget)  # readable plots at 1280×720; the page scrolls when it needs more room
            self._layout.addWidget(scrolled(widget, self))
            self._widget = widget
            self.built.emit(widget)
        return self._widget


class Pages(QObject):
    """The pages of ``tabs`` listed in ``PAGES``; ``panelBuilt(key, panel)`` announces each real panel."""

    panelBuilt = Signal(str, QWidget)
    allBuilt = Signal()

    def __init__(
        self, tabs: QTabWidget, state: StudioState, jobs: JobManager, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._tabs, self._state, self._jobs = tabs, state, jobs
        self._pages: dict[str, LazyPanel] = {}
        self._ready = False
        self._stopped = False
        for spec in PAGES:
            if _module_available(spec.module):
                page = LazyPanel(spec.title, lambda parent, spec=spec: self._make(spec, parent), tabs)
                self._pages[spec.key] = page
                tabs.addTab(page, spec.title)
        tabs.currentChanged.connect(self._on_page_changed)

    def _make(self, spec: PageSpec, parent: QWidget) -> QWidget:
        cls = getattr(importlib.import_module(spec.module), spec.cls)
        panel = cls(self._state, self._jobs, parent)
        self.panelBuilt.emit(spec.key, panel)
        return panel

    @property
    def ready(self) -> bool:
        """Whether every page's panel has been built (or has failed to)."""
        return self._ready

    def panel(self, key: str) -> QWidget | None:
        """The panel of page ``key``, built if needed; None if the page is absent or failed to build."""
        page = self._pages.get(key)
        return page.build() if page is not None else None

    def page(self, key: str) -> LazyPanel | None:
        """The tab page (the stand-in holding the panel) of ``key``."""
        return self._pages.get(key)

    def built_panels(self) -> Iterator[tuple[str, QWidget]]:
        """(title, panel) of every panel built so far."""
        for page in self._pages.values():
            if page.widget is not None:
                yield page.title, page.widget

    def preload(self) -> Job | None:
        """Import the pages' modules (pyqtgraph, numba: seconds) in a worker, then build the panels."""
        if self._ready or self._stopped:
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

        return self._jobs.submit(
            "Loading the panels",
            load,
            kind="startup",
            on_success=lambda _r: self._build_staged(),
            on_error=lambda _msg: self._build_staged(),
        )

    def _build_staged(self) -> None:
        # One panel per event-loop turn, so building them never blocks the GUI thread in one piece.
        if self._ready or self._stopped:
            return
        pending = [p for p in self._pages.values() if p.widget is None and not p.failed]
        if not pending:
            self.ensure()
            return
        pending[0].build()
        QTimer.singleShot(PAGE_BUILD_STEP_MS, self, self._build_staged)

    def ensure(self) -> None:
        """Build every page's panel now (they are otherwise built just after the window first shows)."""
        if self._ready or self._stopped:
            return
        self._ready = True
        set_plot_defaults(self._state.dark)
        QApplication.setOverrideCursor(Qt.CursorShape.BusyCursor)
        try:
            for page in self._pages.values():
                page.build()
        finally:
            QApplication.restoreOverrideCursor()
        self.allBuilt.emit()
        self._warm_up()

    def _warm_up(self) -> Job | None:
        """Import torch and transformers in a worker once the panels stand (see ``WARM_MODULES``)."""
        # find_spec of the top-level package only: a dotted name would import its parent here
        todo = [
            m
            for m in WARM_MODULES
            if m not in sys.modules and importlib.util.find_spec(m.split(".")[0]) is not None
        ]
        if not todo or self._stopped:
            return None

        imported = self._jobs.hold_for_imports()  # other jobs start once these imports are done

        def load(ctx: JobContext) -> None:
            try:
                for name in todo:
                    ctx.check_cancelled()
                    try:
                        importlib.import_module(name)
                    except Exception:  # the job that needs it reports the error in its place
                        log.exception("importing %s failed", name)
            finally:
                imported.set()
            _prepare_kernels(ctx)
            settle_heap()  # the start-up heap is done growing: no full collection walks it again

        job = self._jobs.submit("Preparing torch and transformers", load, kind="startup")
        # cancelled before it ran, or never run (the manager shut down): the other jobs go on anyway
        job.signals.finished.connect(lambda _job: imported.set())
        if not job.active:
            imported.set()
        return job

    def stop(self) -> None:
        """Build nothing more (the window is closing)."""
        self._stopped = True

    @Slot(int)
    def _on_page_changed(self, index: int) -> None:
        page = self._tabs.widget(index)
        if isinstance(page, LazyPanel):
            page.build()  # a page asked for before the deferred build still shows at once
