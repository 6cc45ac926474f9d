"""Upload to the Hub, the step after an export: repository, visibility, the card to be written, progress.

The upload itself is ``studio.core.hub.upload.upload_gguf`` in a background job; this dialog only
collects the repository id, shows the model card generated from the file (and its last evaluation)
before anything is sent, and reports the outcome in one sentence. The token comes from the keyring,
HF_TOKEN or ``hf auth login``; when there is none, or the Hub refuses it, the dialog asks for one
(hidden input) and keeps it for this session only.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from studio.core.evaluate.record import last_evaluation
from studio.core.hub import auth
from studio.core.hub.model_card import card_facts, render_card
from studio.core.hub.upload import upload_gguf
from studio.core.jobs import JobContext
from studio.qt import widgets
from studio.qt.jobs import Job
from studio.qt.settings import AppSettings
from studio.qt.theme import set_status

PROGRESS_STEPS = 1000

__all__ = ["UploadDialog", "open_upload_dialog"]


def _ask_token(parent: QWidget, message: str) -> str | None:
    text, ok = QInputDialog.getText(
        parent,
        "Hugging Face token",
        f"{message}\n\nPaste a write token from huggingface.co/settings/tokens (kept for this session only):",
        QLineEdit.EchoMode.Password,
    )
    return text.strip() if ok and text.strip() else None


class UploadDialog(QDialog):
    """Upload one GGUF file with a generated model card."""

    def __init__(
        self,
        gguf: str | Path,
        jobs: Any,
        parent: QWidget | None = None,
        *,
        settings: AppSettings | None = None,
        ask_token: Any = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("UploadDialog")
        self.setWindowTitle("Upload to the Hugging Face Hub")
        self.path = Path(gguf)
        self.jobs = jobs
        self.settings = settings if settings is not None else AppSettings()
        self.ask_token = ask_token or _ask_token
        self._token: str | None = None  # typed in this dialog; never stored in the settings
        self.job: Job | None = None
        self.result: Any = None
        self._build()
        self._preview()

    def _build(self) -> None:
        self.file_label = QLabel(self.path.name, self)
        self.file_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.repo_edit = QLineEdit(self)
        namespace = self.settings.upload_namespace
        stem = self.path.stem
        self.repo_edit.setText(f"{namespace}/{stem}" if namespace else "")
        self.repo_edit.setPlaceholderText(f"USER/{stem}")
        self.repo_edit.textChanged.connect(self._update_buttons)
        self.private_check = QCheckBox("Private repository (when it is created now)", self)
        self.card_view = QPlainTextEdit(self)
        self.card_view.setObjectName("UploadCard")
        self.card_view.setReadOnly(True)
        self.card_view.setMinimumHeight(220)
        form = QFormLayout()
        form.addRow("File:", self.file_label)
        form.addRow("Repository:", self.repo_edit)
        form.addRow("", self.private_check)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, PROGRESS_STEPS)
        self.status = QLabel("", self)
        self.status.setObjectName("UploadStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.status.setOpenExternalLinks(True)
        self.upload_button = widgets.button("Upload", self, self.start, default=True)
        self.cancel_button = widgets.button("Cancel upload", self, self.cancel)
        self.close_button = widgets.button("Close", self, self.close)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        for b in (self.upload_button, self.cancel_button, self.close_button):
            buttons.addWidget(b)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(QLabel("Model card (README.md) to be written:", self))
        lay.addWidget(self.card_view, 1)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addLayout(buttons)
        self.setMinimumWidth(640)
        self._update_buttons()

    def _preview(self) -> None:
        path = self.path

        def task(_ctx: JobContext) -> str:
            return render_card(card_facts(path, evaluation=last_evaluation(path)))

        self.jobs.submit(
            f"Writing the model card of {path.name}",
            task,
            kind="upload-card",
            on_success=self.card_view.setPlainText,
            on_error=lambda msg: self._set_status(msg, error=True),
        )

    @property
    def running(self) -> bool:
        """Whether an upload started here is still running."""
        return self.job is not None and self.job.active

    def token(self) -> str | None:
        """The token typed here, else the keyring, HF_TOKEN or huggingface_hub's login."""
        if self._token:
            return self._token

        return auth.get_token()[0]  # on the module: tests replace it

    @Slot()
    def start(self) -> Job | None:
        """Start the upload; None (with a sentence) when the repository id or a token is missing."""
        if self.running:
            return None
        repo = self.repo_edit.text().strip()
        if "/" not in repo:
            self._set_status("Give the repository as USER/NAME.", error=True)
            return None
        token = self.token()
        if not token:
            token = self._token = self.ask_token(
                self, "Uploading needs a Hugging Face token with write access."
            )
            if not token:
                return None
        self.settings.upload_namespace = repo.split("/")[0]
        path, private = self.path, self.private_check.isChecked()

        def task(ctx: JobContext) -> Any:
            return upload_gguf(path, repo, token=token, private=private, ctx=ctx)

        self.result = None
        self.progress.setValue(0)
        self._set_status(f"Uploading {path.name} to {repo}…")
        self.job = self.jobs.submit(
            f"Uploading {path.name} to {repo}",
            task,
            kind="upload",
            on_success=self._on_success,
            on_error=self._on_error,
            on_cancel=self._on_cancel,
            confirm_on_quit=True,
        )
        self.job.signals.progress.connect(self._on_progress)
        self._update_buttons()
        return self.job

    @Slot()
    def cancel(self) -> None:
        """Stop the upload; a repository it created is deleted again."""
        if self.running and self.job is not None:
            self.job.cancel()
            self._set_status("Cancelling…")

    @Slot(object, object, object, str)
    def _on_progress(self, job: Any, done: int, total: int, msg: str) -> None:
        if job is self.job and job.active and total > 0:
            self.progress.setValue(int(PROGRESS_STEPS * min(1.0, done / total)))
            self.status.setText(msg)

    def _on_success(self, result: Any) -> None:
        self.result = result
        self._update_buttons()
        self.progress.setValue(PROGRESS_STEPS)
        self.card_view.setPlainText(result.card)
        notes = html.escape(" ".join(result.notes))
        card = " with its model card" if result.card_written else ""
        self._set_status(
            f'Uploaded to <a href="{html.escape(result.url)}">{html.escape(result.repo_id)}</a>: '
            f"{html.escape(result.file_name)}{card}. {notes}".strip()
        )

    def _on_error(self, message: str) -> None:
        self._update_buttons()
        self._set_status(message, error=True)
        exc = getattr(self.job, "exception", None)
        if getattr(exc, "kind", None) == "auth":
            self._token = self.ask_token(self, message)

    def _on_cancel(self) -> None:
        self._update_buttons()
        self.progress.setValue(0)
        self._set_status("Upload cancelled; a repository created by it is deleted again.")

    def _set_status(self, text: str, *, error: bool = False) -> None:
        self.status.setTextFormat(Qt.TextFormat.PlainText if error else Qt.TextFormat.RichText)
        set_status(self.status, text, error=error)

    def _update_buttons(self, *_args: Any) -> None:
        running = self.running
        self.upload_button.setEnabled(not running and "/" in self.repo_edit.text())
        self.cancel_button.setEnabled(running)
        self.repo_edit.setEnabled(not running)
        self.private_check.setEnabled(not running)

    def closeEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        """Closing while uploading cancels the upload (the Hub is left as it was)."""
        self.cancel()
        super().closeEvent(event)


def open_upload_dialog(parent: QWidget, outcome: Any, jobs: Any) -> UploadDialog | None:
    """Show the upload dialog for a finished export (``ExportOutcome``); None when there is none."""
    path = getattr(getattr(outcome, "result", None), "path", None)
    if path is None:
        return None
    dlg = UploadDialog(path, jobs, parent, settings=getattr(parent, "settings", None))
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.show()
    return dlg
