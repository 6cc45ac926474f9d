"""The Hub panel: search the Hugging Face Hub, read a model's card and files, download it.

A page of the main window. Every network call runs as a job on the window's ``JobManager``, one
``PanelJob`` per kind (search, details, fit badges, download, cache), so a newer search drops the
older one's results; download progress crosses to the GUI thread through a queued signal, throttled
by the core, so the GUI thread never waits on the network. A finished download emits
``modelDownloaded(path)`` for the window to open it.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QSizePolicy,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core.hub import api, auth
from studio.core.hub.auth import keyring_available, store_token
from studio.core.hub.cache import delete_cached, find_leftovers, list_cached, remove_leftovers
from studio.core.hub.download import download_snapshot
from studio.core.hub.errors import AuthRequired
from studio.core.hub.fit import fit_for_repo
from studio.core.jobs import JobContext
from studio.core.untrusted import short, terminal_safe
from studio.qt import widgets
from studio.qt.fmt import human_bytes, human_count
from studio.qt.jobs import Job, JobManager
from studio.qt.panel_job import PanelJob
from studio.qt.panels import read_only_table
from studio.qt.safe_text import SafeTextBrowser
from studio.qt.state import StudioState
from studio.qt.theme import set_status

TASKS = (
    "",
    "text-generation",
    "text2text-generation",
    "feature-extraction",
    "fill-mask",
    "image-text-to-text",
)
SORTS = (("Downloads", "downloads"), ("Likes", "likes"), ("Recently updated", "last_modified"))
RESULT_COLUMNS = ("Model", "Downloads", "Likes", "Parameters", "Fit")
FILE_COLUMNS = ("File", "Size", "Quant", "Progress")
CACHE_COLUMNS = ("Model", "Size", "Revisions", "Last used")


class _SortItem(QTableWidgetItem):
    """A table cell that shows text but sorts by a number."""

    def __init__(self, text: str, key: float) -> None:
        super().__init__(text)
        self.key = key
        self.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    def __lt__(self, other: QTableWidgetItem) -> bool:
        return self.key < getattr(other, "key", 0)


class _Relay(QObject):
    """Lives on the GUI thread; workers emit on it, the slot runs on the GUI thread (queued)."""

    progress = Signal(object)  # DownloadProgress
    badge = Signal(str, object)  # repo id, FitBadge | None


class TokenDialog(QDialog):
    """Asks for a Hugging Face token (hidden input), optionally remembered in the OS keyring."""

    def __init__(self, message: str, keyring_ok: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Hugging Face token needed")
        layout = QVBoxLayout(self)
        text = QLabel(message + "\n\nPaste a read token from huggingface.co/settings/tokens:")
        text.setWordWrap(True)
        layout.addWidget(text)
        self.edit = QLineEdit(self)
        self.edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.edit.setPlaceholderText("hf_…")
        layout.addWidget(self.edit)
        self.remember = QCheckBox("Remember in the system keyring", self)
        self.remember.setEnabled(keyring_ok)
        self.remember.setChecked(keyring_ok)
        if not keyring_ok:
            self.remember.setToolTip(
                "No system keyring is available; the token is kept for this session only."
            )
        layout.addWidget(self.remember)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)


def _hub_table(parent: QWidget, columns: Sequence[str], *, single_row: bool) -> QTableWidget:
    """A read-only table whose first column stretches; ``single_row``: clicks select one whole row."""
    table = read_only_table(parent, columns)
    if single_row:
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return table


def _ask_token_dialog(parent: QWidget, message: str) -> tuple[str | None, bool]:
    dlg = TokenDialog(message, keyring_available(), parent)
    if dlg.exec() != QDialog.DialogCode.Accepted or not dlg.edit.text().strip():
        return None, False
    return dlg.edit.text().strip(), dlg.remember.isChecked()


class HubPanel(QWidget):
    """Search box, results table, detail pane (card and files) and a resumable Download."""

    modelDownloaded = Signal(str)  # local snapshot folder (or the single GGUF file downloaded)
    statusMessage = Signal(str)  # what the panel's status line says (progress, counts)
    errorShown = Signal(str)  # a Hub call failed: one sentence

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("HubPanel")
        self.state, self.jobs = state, jobs
        self.hardware = state.hardware
        self.cache_dir: Path | None = None  # None: the Hugging Face cache
        # (parent, reason) -> (token or None, remember it): a dialog, or a test's stand-in.
        self.ask_token: Callable[[QWidget, str], tuple[str | None, bool]] = _ask_token_dialog
        self._session_token: str | None = None  # typed this session and not stored (never in settings)
        self._results: list[Any] = []
        self._cached: list[Any] = []
        self._details: Any = None
        self._detail_repo = ""
        self._searching = PanelJob(
            jobs, "hub-search", self, on_done=self._on_results, on_error=self.show_error
        )
        self._detailing = PanelJob(
            jobs, "hub-details", self, on_done=self._on_details, on_error=self._detail_failed
        )
        self._badging = PanelJob(jobs, "hub-fit", self)
        self._downloading = PanelJob(
            jobs,
            "hub-download",
            self,
            on_done=self._on_downloaded,
            on_error=self._on_download_failed,
            on_cancel=self._on_download_stopped,
        )
        self._listing = PanelJob(
            jobs, "hub-cache", self, on_done=self._on_cache_listed, on_error=self.cache_label_error
        )
        self._download_repo: str | None = None
        self._download_include: list[str] | None = None
        self._pausing = False
        self._relay = _Relay(self)
        self._relay.progress.connect(self._on_progress)
        self._relay.badge.connect(self._on_badge)
        self._build()
        state.hardwareChanged.connect(self.set_hardware)

    # -- construction -----------------------------------------------------------------------------

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.tabs = QTabWidget(self)
        outer.addWidget(self.tabs)
        search_page = QWidget(self)
        root = QVBoxLayout(search_page)
        bar = QHBoxLayout()
        self.search_edit = QLineEdit(self)
        self.search_edit.setPlaceholderText("Search models on the Hugging Face Hub…")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.returnPressed.connect(self.search)
        self.task_combo = widgets.combo_box(self, [(task or "any task", task) for task in TASKS])
        self.sort_combo = widgets.combo_box(self, SORTS)
        self.search_button = widgets.button("Search", self, self.search)
        bar.addWidget(self.search_edit, 1)
        bar.addWidget(self.task_combo)
        bar.addWidget(self.sort_combo)
        bar.addWidget(self.search_button)
        root.addLayout(bar)

        split = QSplitter(Qt.Orientation.Vertical, self)
        self.results = _hub_table(self, RESULT_COLUMNS, single_row=True)
        self.results.itemSelectionChanged.connect(self._on_result_selected)
        split.addWidget(self.results)

        detail = QWidget(self)
        dl = QVBoxLayout(detail)
        dl.setContentsMargins(0, 0, 0, 0)
        self.title_label = QLabel("Select a model to see its card and files.", detail)
        self.title_label.setWordWrap(True)
        self.title_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        dl.addWidget(self.title_label)
        inner = QSplitter(Qt.Orientation.Horizontal, detail)
        self.card = SafeTextBrowser(detail)  # cards are untrusted: bounded layout, links asked for
        self.card.linkRefused.connect(self.show_error)
        inner.addWidget(self.card)
        self.files = _hub_table(detail, FILE_COLUMNS, single_row=False)
        self.files.itemChanged.connect(self._update_buttons)
        inner.addWidget(self.files)
        dl.addWidget(inner, 1)

        row = QHBoxLayout()
        self.download_button = widgets.button("Download", detail, self.start_download)
        self.pause_button = widgets.button("Pause", detail, self.pause_download)
        self.cancel_button = widgets.button("Cancel", detail, self.cancel_download)
        self.progress = QProgressBar(detail)
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.status = QLabel("", detail)
        self.status.setObjectName("HubStatus")
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # messages may quote the server
        # A long message must not widen (and re-lay out) the whole window: the label takes the width it gets.
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        row.addWidget(self.download_button)
        row.addWidget(self.pause_button)
        row.addWidget(self.cancel_button)
        row.addWidget(self.progress, 1)
        dl.addLayout(row)
        dl.addWidget(self.status)
        split.addWidget(detail)
        split.setStretchFactor(1, 2)
        root.addWidget(split, 1)
        self.tabs.addTab(search_page, "Search")
        self.tabs.addTab(self._build_cache_page(), "Downloaded")
        self.tabs.currentChanged.connect(lambda i: self.refresh_cache() if i == 1 else None)
        self._update_buttons()

    def _build_cache_page(self) -> QWidget:
        page = QWidget(self)
        layout = QVBoxLayout(page)
        self.cache_table = _hub_table(page, CACHE_COLUMNS, single_row=True)
        self.cache_table.itemSelectionChanged.connect(self._update_cache_buttons)
        self.cache_table.itemDoubleClicked.connect(lambda _item: self.open_cached())
        layout.addWidget(self.cache_table, 1)
        row = QHBoxLayout()
        self.cache_open_button = widgets.button("Open", page, self.open_cached)
        self.cache_delete_button = widgets.button("Delete…", page, self.delete_cached)
        self.cache_refresh_button = widgets.button("Refresh", page, self.refresh_cache)
        self.cache_label = QLabel("", page)
        self.cache_label.setTextFormat(Qt.TextFormat.PlainText)
        row.addWidget(self.cache_open_button)
        row.addWidget(self.cache_delete_button)
        row.addWidget(self.cache_refresh_button)
        row.addWidget(self.cache_label, 1)
        layout.addLayout(row)
        self._update_cache_buttons()
        return page

    # -- public API -------------------------------------------------------------------------------

    def set_hardware(self, hw: Any) -> None:
        """Use ``hw`` (a ``HardwareInfo``) for fit badges; recomputes the badges of the shown results."""
        self.hardware = hw
        if self._results:
            self._start_badges()

    def token(self) -> str | None:
        """The token for Hub calls: typed this session, else keyring/env/login (never from settings)."""
        if self._session_token:
            return self._session_token

        return auth.get_token()[0]  # on the module: tests replace it

    @property
    def downloading(self) -> bool:
        """Whether a download is running."""
        return self._downloading.running

    def shutdown(self) -> None:
        """Cancel the panel's jobs (the window waits for them)."""
        for task in (self._searching, self._detailing, self._badging, self._downloading, self._listing):
            task.cancel()

    # -- search -----------------------------------------------------------------------------------

    @Slot()
    def search(self) -> Job:
        """Search with the box's text, task and sort; results replace the table when they arrive."""
        query = self.search_edit.text().strip()
        task = self.task_combo.currentData() or None
        sort = self.sort_combo.currentData()
        token = self.token()
        self._set_status(f"Searching for “{query}”…" if query else "Searching…")

        def task_fn(ctx: JobContext) -> list[Any]:
            return api.search(query, task=task, sort=sort, limit=30, token=token, ctx=ctx)

        return self._searching.start(f"Hub search “{query}”", task_fn)

    def _on_results(self, results: list[Any]) -> None:
        self._results = list(results)
        table = self.results
        table.setSortingEnabled(False)
        table.setRowCount(len(results))
        for r, m in enumerate(results):
            name = QTableWidgetItem(m.id + ("  🔒" if m.gated else ""))
            name.setData(Qt.ItemDataRole.UserRole, m.id)
            name.setToolTip(", ".join(m.tags[:12]))
            table.setItem(r, 0, name)
            table.setItem(r, 1, _SortItem(human_count(m.downloads), m.downloads))
            table.setItem(r, 2, _SortItem(human_count(m.likes), m.likes))
            table.setItem(r, 3, _SortItem(human_count(m.params) if m.params else "–", m.params or 0))
            table.setItem(r, 4, QTableWidgetItem("…" if (m.params and self.hardware is not None) else "–"))
        # Keep the Hub's order (the chosen sort) until the user clicks a column header.
        table.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.DescendingOrder)
        table.setSortingEnabled(True)
        self._set_status(f"{len(results)} model(s) found" if results else "No models found.")
        if results and self.hardware is not None:
            self._start_badges()

    def _start_badges(self) -> None:
        hw, token, relay = self.hardware, self.token(), self._relay
        todo = [(m.id, m.params) for m in self._results if m.params]

        def task_fn(ctx: JobContext) -> None:
            for i, (repo_id, params) in enumerate(todo):
                ctx.check_cancelled()
                ctx.report(i, len(todo), f"fit of {repo_id}")
                try:
                    badge = fit_for_repo(repo_id, params, hw, token=token, ctx=ctx)
                except Exception:  # a badge is a hint; one failing repo must not stop the others
                    badge = None
                relay.badge.emit(repo_id, badge)

        self._badging.start("Fit badges", task_fn)

    @Slot(str, object)
    def _on_badge(self, repo_id: str, badge: Any) -> None:
        for r in range(self.results.rowCount()):
            item = self.results.item(r, 0)
            if item is not None and item.data(Qt.ItemDataRole.UserRole) == repo_id:
                cell = QTableWidgetItem(badge.label if badge is not None else "–")
                if badge is not None:
                    best = f"; best that fits: {badge.best_preset}" if badge.best_preset else ""
                    cell.setToolTip(f"{badge.preset} needs about {human_bytes(badge.memory_bytes)}{best}")
                self.results.setItem(r, 4, cell)

    # -- details ----------------------------------------------------------------------------------

    def selected_repo(self) -> str | None:
        """The repository id of the selected result, or None."""
        rows = self.results.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.results.item(rows[0].row(), 0)
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    @Slot()
    def _on_result_selected(self) -> None:
        repo_id = self.selected_repo()
        if repo_id:
            self.show_details(repo_id)

    def show_details(self, repo_id: str) -> Job:
        """Load and show the card and files of ``repo_id``."""
        token = self.token()
        self._detail_repo = repo_id
        self.title_label.setText(f"<b>{html.escape(repo_id)}</b> — loading…")

        def task_fn(ctx: JobContext) -> Any:
            return api.model_details(repo_id, token=token, ctx=ctx)

        return self._detailing.start(f"Hub details {repo_id}", task_fn)

    def _detail_failed(self, msg: str) -> None:
        self.title_label.setText(f"<b>{html.escape(self._detail_repo)}</b>")
        self.show_error(msg)

    def _on_details(self, d: Any) -> None:
        self._details = d
        bits = [
            f"<b>{html.escape(d.id)}</b>",
            f"{human_count(d.params)} parameters" if d.params else "parameters unknown",
            f"license: {html.escape(terminal_safe(short(d.license or '–', 80)))}",
            f"{human_bytes(d.total_size)} in {len(d.files)} files",
        ]
        if d.gated:
            bits.append("gated: a token is needed")
        if d.last_modified is not None:
            bits.append(f"updated {d.last_modified:%Y-%m-%d}")
        self.title_label.setText(" · ".join(bits))
        self.card.show_untrusted_markdown(d.card or "*This model has no card.*")
        self.files.blockSignals(True)
        self.files.setRowCount(len(d.files))
        for r, f in enumerate(d.files):
            name = QTableWidgetItem(f.name)
            name.setFlags(name.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            name.setCheckState(Qt.CheckState.Unchecked)
            name.setToolTip(f"sha256 {f.sha256}" if f.sha256 else (f"git {f.blob_id}" if f.blob_id else ""))
            self.files.setItem(r, 0, name)
            self.files.setItem(r, 1, _SortItem(human_bytes(f.size), f.size or 0))
            self.files.setItem(r, 2, QTableWidgetItem(f.quant_type or ""))
            self.files.setItem(r, 3, QTableWidgetItem(""))
        self.files.blockSignals(False)
        self._update_buttons()

    # -- download ---------------------------------------------------------------------------------

    def checked_files(self) -> list[str]:
        """Names of the files ticked in the file table (empty: download everything)."""
        out = []
        for r in range(self.files.rowCount()):
            item = self.files.item(r, 0)
            if item is not None and item.checkState() == Qt.CheckState.Checked:
                out.append(item.text())
        return out

    @Slot()
    def start_download(self) -> Job | None:
        """Download (or resume) the shown model, or only its ticked files."""
        if self._details is None or self.downloading:
            return None
        include = self.checked_files() or None
        return self._download(self._details.id, self._details.sha, include)

    def _download(self, repo_id: str, revision: str | None, include: list[str] | None) -> Job:
        token = self.token()
        cache_dir = self.cache_dir
        relay = self._relay
        self._download_repo, self._download_include = repo_id, include
        self._pausing = False

        def task_fn(ctx: JobContext) -> Any:
            return download_snapshot(
                repo_id, revision, include, cache_dir, ctx, token, on_progress=relay.progress.emit
            )

        job = self._downloading.start(f"Downloading {repo_id}", task_fn, confirm_on_quit=True)
        self._set_status(f"Starting the download of {repo_id}…")
        self._update_buttons()
        return job

    @Slot()
    def pause_download(self) -> None:
        """Stop the download but keep the partial files; Download resumes from there."""
        if self.downloading:
            self._pausing = True
            self._downloading.cancel()

    @Slot()
    def cancel_download(self) -> None:
        """Stop the download and remove its partial files."""
        if self.downloading:
            self._pausing = False
            self._downloading.cancel()
        else:
            self._remove_partials()

    @Slot(object)
    def _on_progress(self, p: Any) -> None:
        if not self.downloading:
            return
        self.progress.setValue(int(1000 * p.done / p.total) if p.total else 0)
        self._set_status(p.message)
        if self._details is None or self._details.id != p.repo_id:
            return
        for r in range(self.files.rowCount()):
            item = self.files.item(r, 0)
            if item is not None and item.text() == p.file:
                pct = 100 * p.file_done / p.file_total if p.file_total else 100
                self.files.item(r, 3).setText(f"{pct:.0f} %")
                break

    def _on_downloaded(self, res: Any) -> None:
        self.progress.setValue(1000)
        note = f" ({res.note})" if res.note else ""
        self._set_status(f"Downloaded {res.repo_id} to {res.path}{note}")
        self._update_buttons()
        target = res.path
        # A single GGUF file is what llama.cpp opens, not the folder around it.
        if len(res.files) == 1 and res.files[0].lower().endswith(".gguf"):
            target = res.path / res.files[0]
        self.modelDownloaded.emit(str(target))

    def _on_download_failed(self, msg: str) -> None:
        self._update_buttons()
        job = self._downloading.job
        err = job.exception if job is not None else None
        if isinstance(err, AuthRequired):
            token, remember = self.ask_token(self, str(err))
            if token:
                self._session_token = token
                if remember:
                    store_token(token)
                self._download(self._download_repo or err.repo_id, None, self._download_include)
                return
        self.show_error(msg)

    def _on_download_stopped(self) -> None:
        if self._pausing:
            self._set_status("Paused; press Download to resume where it stopped.")
        else:
            self._remove_partials()
            self.progress.setValue(0)
            self._set_status("Download cancelled.")
        self._pausing = False
        self._update_buttons()

    def _remove_partials(self) -> None:
        repo_id = self._download_repo
        if not repo_id:
            return

        cache_dir = self.cache_dir

        def task_fn(ctx: JobContext) -> int:
            items = [x for x in find_leftovers(cache_dir) if x.repo_id == repo_id and x.kind == "partial"]
            return remove_leftovers(items)

        self.jobs.submit(f"Removing partial files of {repo_id}", task_fn, kind="hub-cleanup")

    # -- the cache ----------------------------------------------------------------------------------

    @Slot()
    def refresh_cache(self) -> Job:
        """List the downloaded models (scanning the cache runs in the background)."""
        cache_dir = self.cache_dir
        set_status(self.cache_label, "Scanning the cache…")
        return self._listing.start("Scanning the Hub cache", lambda ctx: list_cached(cache_dir))

    def _on_cache_listed(self, models: list[Any]) -> None:
        self._cached = list(models)
        table = self.cache_table
        table.setRowCount(len(models))
        for r, m in enumerate(models):
            name = QTableWidgetItem(m.repo_id)
            name.setToolTip(str(m.path))
            table.setItem(r, 0, name)
            table.setItem(r, 1, _SortItem(human_bytes(m.size_on_disk), m.size_on_disk))
            refs = ", ".join(ref for rev in m.revisions for ref in rev.refs) or "–"
            table.setItem(r, 2, QTableWidgetItem(f"{len(m.revisions)} ({refs})"))
            table.setItem(
                r, 3, QTableWidgetItem(time.strftime("%Y-%m-%d %H:%M", time.localtime(m.last_accessed)))
            )
        total = sum(m.size_on_disk for m in models)
        partial = sum(m.partial_bytes for m in models)
        extra = f", plus {human_bytes(partial)} of paused downloads" if partial else ""
        set_status(self.cache_label, f"{len(models)} model(s), {human_bytes(total)}{extra}")
        self._update_cache_buttons()

    def selected_cached(self) -> Any:
        """The selected ``CachedModel`` of the Downloaded tab, or None."""
        rows = self.cache_table.selectionModel().selectedRows()
        if not rows or rows[0].row() >= len(self._cached):
            return None
        return self._cached[rows[0].row()]

    @Slot()
    def open_cached(self) -> None:
        """Open the newest snapshot of the selected cached model (emits ``modelDownloaded``)."""
        m = self.selected_cached()
        if m is not None and m.revisions:
            self.modelDownloaded.emit(str(m.revisions[0].path))

    @Slot()
    def delete_cached(self) -> Job | None:
        """Delete the selected cached model after a confirmation."""
        m = self.selected_cached()
        if m is None:
            return None
        answer = QMessageBox.question(
            self,
            "Delete downloaded model",
            f"Delete {m.repo_id} ({human_bytes(m.size_on_disk)}) from the Hugging Face cache?",
        )
        if answer != QMessageBox.StandardButton.Yes:
            return None
        cache_dir = self.cache_dir
        return self.jobs.submit(
            f"Deleting {m.repo_id}",
            lambda ctx: delete_cached(m.repo_id, None, cache_dir),
            kind="hub-cache",
            on_success=lambda freed: (self.refresh_cache(), None)[1],
            on_error=self.cache_label_error,
        )

    def _update_cache_buttons(self) -> None:
        has = self.selected_cached() is not None
        self.cache_open_button.setEnabled(has)
        self.cache_delete_button.setEnabled(has)

    # -- helpers ----------------------------------------------------------------------------------

    def _set_status(self, text: str) -> None:
        set_status(self.status, text)
        self.statusMessage.emit(text)

    def show_error(self, message: str) -> None:
        """Show a failed call's sentence in the status line (in the theme's error colour)."""
        set_status(self.status, message, error=True)
        self.errorShown.emit(message)

    def cache_label_error(self, message: str) -> None:
        """Show a failed cache scan or deletion under the Downloaded table."""
        set_status(self.cache_label, message, error=True)
        self.errorShown.emit(message)

    @Slot()
    def _update_buttons(self, *_args: Any) -> None:
        busy = self.downloading
        self.download_button.setEnabled(self._details is not None and not busy)
        n = len(self.checked_files())
        self.download_button.setText(f"Download {n} file(s)" if n else "Download")
        self.pause_button.setEnabled(busy)
        self.cancel_button.setEnabled(busy)
