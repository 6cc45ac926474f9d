"""The studio window's panels: summary, model tree, tensor details, inspector, preview, overview, plan
editor, Hub, chat, evaluation, calibration, jobs, device selector, and the Export dialog.

Each panel is a self-contained widget built the same way, ``Panel(state, jobs, parent)``, from the
shared ``StudioState`` and the window's ``JobManager``; what tests and scripts swap in (a shared
statistics cache, the chat's back-end factory, the Hub's token prompt) is an attribute set afterwards.
Panels talk only through the state's signals. Computation runs in ``studio.core`` inside jobs, which a
panel starts through ``studio.qt.panel_job``; results come back to the GUI thread through the job
manager's queued signals.

The panel classes are imported lazily (pyqtgraph costs ~0.2 s) so that importing this package is free.
"""

from __future__ import annotations

import importlib
from typing import Any

from PySide6.QtCore import QCoreApplication, Qt, QThread
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QVBoxLayout,
)

_LAZY = {
    "CalibratePanel": "studio.qt.panels.calibrate_panel",
    "ChatPanel": "studio.qt.panels.chat_panel",
    "DeviceSelector": "studio.qt.panels.device_selector",
    "EvalPanel": "studio.qt.panels.eval_panel",
    "ExportDialog": "studio.qt.panels.export_dialog",
    "HubPanel": "studio.qt.panels.hub_panel",
    "InspectorPanel": "studio.qt.panels.inspector",
    "JobsPanel": "studio.qt.panels.jobs_panel",
    "LabPanel": "studio.qt.panels.lab_panel",
    "MemoryPanel": "studio.qt.panels.memory_panel",
    "ModelTreePanel": "studio.qt.panels.model_tree",
    "OverviewPanel": "studio.qt.panels.overview",
    "PlanEditorPanel": "studio.qt.panels.plan_editor",
    "PreviewPanel": "studio.qt.panels.preview",
    "QatPanel": "studio.qt.panels.qat_panel",
    "SummaryPanel": "studio.qt.panels.summary",
    "SweepPanel": "studio.qt.panels.sweep_panel",
    "TensorPanel": "studio.qt.panels.tensor_panel",
    "make_array_feed": "studio.qt.panels.array_feed",  # numpy: not at start-up
}

__all__ = [
    *_LAZY,
    "ask_yes_no",
    "assert_gui_thread",
    "choose",
    "labelled_row",
    "make_array_feed",
    "page_layout",
    "read_only_table",
    "run_controls",
    "show_job_progress",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)


def assert_gui_thread(what: str = "A UI method") -> None:
    """Raise RuntimeError unless called on the application's GUI thread, the only one that may touch
    widgets (tests/qt/panels/test_inspector.py::test_ui_methods_refuse_worker_threads)."""
    app = QCoreApplication.instance()
    if app is not None and QThread.currentThread() is not app.thread():
        raise RuntimeError(
            f"{what} was called from a worker thread; results must reach widgets through signals."
        )


def ask_yes_no(parent: Any, title: str, text: str) -> bool:
    """Ask a Yes/No question in a modal box (No is the default button); True when the answer is Yes."""
    answer = QMessageBox.question(
        parent,
        title,
        text,
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        QMessageBox.StandardButton.No,
    )
    return answer == QMessageBox.StandardButton.Yes


def choose(combo: Any, value: str, *, by_text: bool = False) -> bool:
    """Select the item of ``combo`` whose data (or text) is ``value``; False when none is."""
    i = combo.findText(value) if by_text else combo.findData(value)
    if i >= 0:
        combo.setCurrentIndex(i)
    return i >= 0


def labelled_row(parent: Any, pairs: Any, *, stretch: bool = True) -> Any:
    """A row of (label text, widget) pairs, each widget after its label, ending in a stretch."""
    row = QHBoxLayout()
    for text, widget in pairs:
        row.addWidget(QLabel(text, parent))
        row.addWidget(widget)
    if stretch:
        row.addStretch(1)
    return row


def read_only_table(parent: Any, columns: Any) -> Any:
    """An empty ``QTableWidget`` with ``columns`` as its header, no row numbers, and cells not editable."""
    table = QTableWidget(0, len(columns), parent)
    table.setHorizontalHeaderLabels(list(columns))
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    return table


def run_controls(panel: Any, run_text: str) -> tuple[Any, Any, Any, Any]:
    """A job panel's Run and Cancel buttons (wired to ``panel.start`` / ``panel.cancel``), its hidden
    progress bar and its status line."""
    run = QPushButton(run_text, panel)
    run.clicked.connect(panel.start)
    cancel = QPushButton("Cancel", panel)
    cancel.clicked.connect(panel.cancel)
    progress = QProgressBar(panel)
    progress.setTextVisible(True)
    progress.hide()
    status = QLabel("", panel)
    status.setWordWrap(True)
    return run, cancel, progress, status


def show_job_progress(bar: Any, job: Any) -> None:
    """Show a job's progress (``done`` of ``total``, its message) in ``bar``; a job without a total is ignored."""
    if job.total > 0:
        bar.setRange(0, job.total)
        bar.setValue(job.done)
        bar.setFormat(f"%p% · {job.message}")


def page_layout(panel: Any, top: Any, status: Any, main: Any, side: Any, stretch: int) -> None:
    """A page's layout: a row of controls, a status line, then ``main`` and ``side`` at ``stretch``:1."""
    split = QSplitter(Qt.Orientation.Horizontal, panel)
    split.addWidget(main)
    split.addWidget(side)
    split.setStretchFactor(0, stretch)
    split.setStretchFactor(1, 1)
    lay = QVBoxLayout(panel)
    lay.addLayout(top)
    lay.addWidget(status)
    lay.addWidget(split, 1)
