"""Jobs panel: every background job with its progress, ETA, a cancel button and its log; and the
status bar's summary of the running job."""

from __future__ import annotations

import math
from typing import Any

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStatusBar,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.qt import widgets
from studio.qt.jobs import JobManager
from studio.qt.panels import assert_gui_thread
from studio.qt.state import StudioState

__all__ = ["JobsPanel", "format_eta"]

COL_TITLE, COL_STATE, COL_PROGRESS, COL_ETA, COL_CANCEL = range(5)
# Rows of ended jobs kept (the newest). Each row holds a progress bar and a button, which the tree lays
# out again on every insert: at 320 rows a job's row cost the GUI thread 14 ms, and a session of budget
# edits and tensor clicks starts thousands of jobs.
MAX_ROWS = 100


def format_eta(seconds: float | None) -> str:
    """``"1:05"`` / ``"1:02:03"``; "–" while unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class JobsPanel(QWidget):
    """Lists the ``JobManager``'s jobs, newest first; the selected job's log shows below."""

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self._items: dict[int, QTreeWidgetItem] = {}
        self._bars: dict[int, QProgressBar] = {}
        self._buttons: dict[int, QPushButton] = {}
        self._jobs: dict[int, Any] = {}
        self._log_shown = (0, 0)  # (job id, lines shown)
        self._build()
        jobs.jobAdded.connect(self._on_added)
        jobs.jobChanged.connect(self._on_changed)
        jobs.jobFinished.connect(self._on_changed)
        for job in jobs.history():
            self._on_added(job)

    def _build(self) -> None:
        self.tree = QTreeWidget(self)
        self.tree.setColumnCount(5)
        self.tree.setHeaderLabels(["Job", "State", "Progress", "ETA", ""])
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(COL_TITLE, QHeaderView.ResizeMode.Stretch)
        for col in (COL_STATE, COL_PROGRESS, COL_ETA, COL_CANCEL):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.currentItemChanged.connect(lambda *_: self._show_log())
        self.log_view = QPlainTextEdit(self)
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(5000)
        self.clear_button = widgets.button("Clear finished", self, self.clear_finished)
        self.cancel_all_button = widgets.button("Cancel all", self, self.jobs.cancel_all)
        self.summary = QLabel("No jobs.", self)
        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(self.cancel_all_button)
        top.addWidget(self.clear_button)
        split = QSplitter(Qt.Orientation.Vertical, self)
        split.addWidget(self.tree)
        split.addWidget(self.log_view)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(split, 1)

    # -- public -----------------------------------------------------------------------------------

    def row_of(self, job: Any) -> QTreeWidgetItem:
        """The tree row showing ``job``."""
        return self._items[job.id]

    def progress_bar(self, job: Any) -> QProgressBar:
        """The progress bar of ``job``'s row."""
        return self._bars[job.id]

    def cancel_button(self, job: Any) -> QPushButton:
        """The cancel button of ``job``'s row."""
        return self._buttons[job.id]

    @Slot()
    def clear_finished(self) -> None:
        """Remove the rows of jobs that ended."""
        self._drop_finished(keep=0)
        self._update_summary()

    def _drop_finished(self, keep: int) -> None:
        """Remove the rows of all but the ``keep`` newest jobs that ended."""
        ended = [jid for jid, job in self._jobs.items() if not job.active]  # oldest first
        for jid in ended[: max(0, len(ended) - keep)]:
            item = self._items.pop(jid)
            self.tree.takeTopLevelItem(self.tree.indexOfTopLevelItem(item))
            self._bars.pop(jid, None)
            self._buttons.pop(jid, None)
            del self._jobs[jid]

    # -- slots ------------------------------------------------------------------------------------

    @Slot(object)
    def _on_added(self, job: Any) -> None:
        assert_gui_thread("JobsPanel._on_added")
        if job.id in self._items:
            return
        item = QTreeWidgetItem([job.title, job.state.value, "", "–", ""])
        item.setToolTip(COL_TITLE, job.title)
        self.tree.insertTopLevelItem(0, item)
        bar = QProgressBar(self.tree)
        bar.setRange(0, 0)  # busy until the first report
        bar.setMaximumHeight(18)
        bar.setMinimumWidth(120)
        self.tree.setItemWidget(item, COL_PROGRESS, bar)
        button = QPushButton("Cancel", self.tree)
        button.setToolTip(f"Stop {job.title}")
        button.clicked.connect(job.cancel)
        button.clicked.connect(lambda _=False, b=button: (b.setEnabled(False), b.setText("Cancelling…")))
        self.tree.setItemWidget(item, COL_CANCEL, button)
        self._items[job.id], self._bars[job.id], self._buttons[job.id] = item, bar, button
        self._jobs[job.id] = job
        if len(self._jobs) > MAX_ROWS + 20:  # in batches: the prune itself walks the rows
            self._drop_finished(keep=MAX_ROWS)
        self._on_changed(job)

    @Slot(object)
    def _on_changed(self, job: Any) -> None:
        item = self._items.get(job.id)
        if item is None:
            return
        bar, button = self._bars[job.id], self._buttons[job.id]
        item.setText(COL_STATE, job.state.value)
        if job.total > 0:
            bar.setRange(0, 1000)
            bar.setValue(int(1000 * min(1.0, job.done / job.total)))
            bar.setFormat("%p%")
            bar.setToolTip(job.message)
            if job.message:
                item.setToolTip(COL_PROGRESS, job.message)
        if not job.active:
            if job.state.value == "done":
                bar.setRange(0, 1000)
                bar.setValue(1000)
            elif bar.maximum() == 0:
                bar.setRange(0, 1000)
                bar.setValue(0)
            button.setEnabled(False)
            button.setText(
                {"done": "Done", "failed": "Failed", "cancelled": "Cancelled"}.get(job.state.value, "—")
            )
            if job.error:
                item.setToolTip(COL_STATE, job.error)
            item.setText(COL_ETA, "")
        else:
            item.setText(COL_ETA, format_eta(job.eta_seconds()))
        cur = self.tree.currentItem()
        if cur is item:
            self._show_log()
        self._update_summary()

    def _show_log(self) -> None:
        cur = self.tree.currentItem()
        job = next((self._jobs[j] for j, it in self._items.items() if it is cur), None)
        if job is None:
            self.log_view.clear()
            self._log_shown = (0, 0)
            return
        shown_id, n = self._log_shown
        lines = list(job.log_lines)
        if shown_id != job.id or n > len(lines):
            self.log_view.setPlainText("\n".join(lines))
        else:
            for line in lines[n:]:
                self.log_view.appendPlainText(line)
        self._log_shown = (job.id, len(lines))

    def _update_summary(self) -> None:
        active = sum(1 for j in self._jobs.values() if j.active)
        total = len(self._jobs)
        self.summary.setText("No jobs." if not total else f"{active} running, {total - active} finished")


class JobStatus(QObject):
    """The status bar's part for jobs: the newest active job's message, its progress and a cancel button.

    Hardware detection and the start-up import are left out: they are not the user's jobs.
    """

    QUIET_KINDS = ("hardware", "startup")

    def __init__(self, jobs: JobManager, bar: QStatusBar, cancel: QAction) -> None:
        super().__init__(bar)
        self._jobs = jobs
        self.label = QLabel(bar)
        self.progress = QProgressBar(bar)
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(True)
        self.cancel = QToolButton(bar)
        self.cancel.setDefaultAction(cancel)
        self.cancel.setAutoRaise(True)
        for w in (self.label, self.progress, self.cancel):
            bar.addPermanentWidget(w)
            w.hide()
        jobs.jobChanged.connect(self.refresh)
        jobs.busyChanged.connect(self.refresh)

    @Slot()
    def refresh(self, *_args: Any) -> None:
        """Show the newest active job, or hide when there is none."""
        active = [j for j in self._jobs.active_jobs() if j.kind not in self.QUIET_KINDS]
        widgets = (self.label, self.progress, self.cancel)
        if not active:
            for w in widgets:
                w.hide()
            return
        job = active[-1]
        more = f" (+{len(active) - 1} more)" if len(active) > 1 else ""
        self.label.setText(f"{job.message or job.title}{more}")
        if job.total > 0:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * min(1.0, job.done / job.total)))
        else:
            self.progress.setRange(0, 0)  # busy indicator until the total is known
        for w in widgets:
            w.show()
