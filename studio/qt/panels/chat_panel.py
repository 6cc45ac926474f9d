"""Side-by-side chat: one column per model (the original and its variants), the same prompt for all.

Every column streams its tokens at once (one thread per column inside one chat job), shows tokens/s
and time to first token, the probability of each token on hover, and the first token where it
departs from the first column. Stop ends every column within a token; a column whose model fails
(or whose llama.cpp process dies) shows its error while the others go on.
"""

from __future__ import annotations

import bisect
import html
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal, Slot
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSplitter,
    QTextEdit,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from studio.core.chat import session
from studio.core.chat import threads as chat_threads
from studio.core.chat.loading import forget as forget_load
from studio.core.chat.loading import load_seconds, load_timed
from studio.core.chat.session import ChatSession, ColumnOutcome, first_divergence
from studio.core.chat.types import Sampling, TokenEvent
from studio.core.errors import StudioError
from studio.qt import folders, theme, widgets
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread
from studio.qt.state import StudioState

if TYPE_CHECKING:
    from studio.core.export.job import ExportOutcome

__all__ = ["ChatColumn", "ChatPanel", "TokenView"]

DIVERGE_COLOR = QColor(theme.DIVERGE_COLOR)
USER_PREVIEW_CHARS = 2000  # a 5 MB paste is sent whole but shown shortened


class _TokenQueue(QObject):
    """Carries tokens from the column threads to the GUI thread, many per wake-up.

    A queued signal per token made the GUI thread render each token as its own event: with a fast
    model (hundreds of tokens a second per column) the window fell behind the children, and Stop
    waited for that backlog to be drawn one token at a time before the turn could end (0.66 s in CI).
    Here the column threads append to a list and wake the GUI thread only when the list was empty, so
    one wake-up takes every token that came in meanwhile and draws them in one edit of each column.
    """

    ready = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._items: list[tuple[int, int, TokenEvent]] = []

    def put(self, turn: int, column: int, ev: TokenEvent) -> None:
        """Queue one token (any thread)."""
        with self._lock:
            self._items.append((turn, column, ev))
            wake = len(self._items) == 1
        if wake:
            self.ready.emit()

    def take(self) -> list[tuple[int, int, TokenEvent]]:
        """Every token queued so far, in order (GUI thread)."""
        with self._lock:
            items, self._items = self._items, []
        return items


class TokenView(QTextEdit):
    """A read-only transcript that knows which characters belong to which token (for tooltips)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setAcceptRichText(False)
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, TokenEvent]] = []

    def clear_tokens(self) -> None:
        """Forget the token positions of the current reply (the text stays)."""
        self._starts.clear()
        self._spans.clear()

    def append_tokens(self, events: Sequence[TokenEvent]) -> list[tuple[int, int]]:
        """Insert several tokens at the end in one edit (one layout pass); returns their character spans."""
        cur = QTextCursor(self.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        plain = QTextCharFormat()
        spans = []
        cur.beginEditBlock()
        try:
            for ev in events:
                start = cur.position()
                cur.insertText(ev.text, plain)
                end = cur.position()
                self._starts.append(start)
                self._spans.append((start, end, ev))
                spans.append((start, end))
        finally:
            cur.endEditBlock()
        return spans

    def token_span(self, index: int) -> tuple[int, int] | None:
        """Character span of the reply's token ``index``."""
        for s, e, ev in self._spans:
            if ev.index == index:
                return s, e
        return None

    def token_at(self, char_pos: int) -> TokenEvent | None:
        """The token covering character ``char_pos`` of the document, if any."""
        i = bisect.bisect_right(self._starts, char_pos) - 1
        if i < 0:
            return None
        s, e, ev = self._spans[i]
        return ev if s <= char_pos < max(e, s + 1) else None

    def tooltip_for(self, char_pos: int) -> str | None:
        """The hover text for the token at ``char_pos``."""
        ev = self.token_at(char_pos)
        if ev is None:
            return None
        shown = ev.text.replace("\n", "\\n") or "∅"
        return f"{shown!r}  p = {ev.prob:.4f}  (token {ev.token_id}, #{ev.index + 1})"

    def highlight(self, index: int, color: QColor = DIVERGE_COLOR) -> bool:
        """Mark token ``index`` of the current reply (the first divergent token)."""
        span = self.token_span(index)
        if span is None:
            return False
        cur = QTextCursor(self.document())
        cur.setPosition(span[0])
        cur.setPosition(max(span[1], span[0] + 1), QTextCursor.MoveMode.KeepAnchor)
        fmt = QTextCharFormat()
        fmt.setBackground(color)
        fmt.setFontWeight(QFont.Weight.Bold)
        cur.mergeCharFormat(fmt)
        return True

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.ToolTip:
            pos = self.cursorForPosition(event.pos()).position()
            tip = self.tooltip_for(pos) or (self.tooltip_for(pos - 1) if pos > 0 else None)
            if tip:
                QToolTip.showText(event.globalPos(), tip, self)
            else:
                QToolTip.hideText()
                event.ignore()
            return True
        return super().viewportEvent(event)


class ChatColumn(QFrame):
    """One model's column: name, speed, transcript and errors."""

    removeRequested = Signal(object)

    def __init__(self, path: Path, label: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = path
        self.label = label
        self.tokens: list[TokenEvent] = []
        self.error: str | None = None
        self.notes: list[str] = []
        self.divergence: int | None = None
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel(f"<b>{html.escape(label)}</b>", self)
        self.title.setToolTip(str(path))
        self.remove_button = QToolButton(self)
        self.remove_button.setText("✕")
        self.remove_button.setToolTip("Remove this model from the comparison")
        self.remove_button.clicked.connect(lambda: self.removeRequested.emit(self))
        # the model's load (started when the column is added) and its share of the cores, apart from
        # the reply's first-token time below
        self.load_info = QLabel("not loaded", self)
        self.load_info.setObjectName("ChatColumnLoad")
        self.load_info.setWordWrap(True)
        self.threads_text = ""
        self.load_state = "not loaded"
        self.stats = QLabel("", self)
        self.stats.setObjectName("ChatColumnStats")
        self.view = TokenView(self)
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.remove_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.load_info)
        lay.addWidget(self.stats)
        lay.addWidget(self.view, 1)

    def set_threads(self, text: str) -> None:
        """Show the column's share of the cores (``1 thread of 2 cores …``) in its header."""
        self.threads_text = text
        self._show_load()

    def set_loading(self) -> None:
        """The model is loading (in the background, from the moment the column was added)."""
        self.load_state = "loading…"
        self._show_load()

    def set_loaded(self, seconds: float | None) -> None:
        """The model is ready: its load time, shown apart from every reply's first-token time."""
        self.load_state = "loaded" if seconds is None else f"loaded in {seconds:.1f} s"
        self._show_load()

    def set_load_failed(self, message: str) -> None:
        """Loading failed: the sentence in the header and the transcript."""
        self.load_state = "not loaded"
        self._show_load()
        self.fail(message)

    def _show_load(self) -> None:
        parts = [self.load_state] + ([self.threads_text] if self.threads_text else [])
        self.load_info.setText(" · ".join(parts))

    @property
    def text(self) -> str:
        """The current reply's text."""
        return "".join(t.text for t in self.tokens)

    def begin_turn(self, user_text: str) -> None:
        """Show the user's turn and get ready for the reply."""
        shown = (
            user_text
            if len(user_text) <= USER_PREVIEW_CHARS
            else (f"{user_text[:USER_PREVIEW_CHARS]}… ({len(user_text):,} characters)")
        )
        cur = QTextCursor(self.view.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        if not self.view.document().isEmpty():
            cur.insertBlock()
        bold = QTextCharFormat()
        bold.setFontWeight(QFont.Weight.Bold)
        cur.insertText("You: ", bold)
        cur.insertText(shown, QTextCharFormat())
        cur.insertBlock()
        cur.insertText(f"{self.label}: ", bold)
        cur.setCharFormat(QTextCharFormat())
        self.view.clear_tokens()
        self.tokens = []
        self.error = None
        self.divergence = None
        theme.set_status(self.stats, "working…")

    def add_tokens(self, events: Sequence[TokenEvent]) -> None:
        """Append streamed tokens (drawn in one edit)."""
        self.tokens.extend(events)
        self.view.append_tokens(events)
        self.stats.setText(f"{len(self.tokens)} tokens…")

    def finish(self, outcome: ColumnOutcome, stopped: bool = False) -> None:
        """Show the final speed, or the column's error, and what the back end told (a llama.cpp restart)."""
        for note in outcome.notes:
            self.show_note(note)
        if outcome.error is not None:
            self.fail(outcome.error)
            return
        r = outcome.result
        if r is None:
            return
        # replace streamed tokens by the final ones (same ids; they carry their timings)
        self.tokens = list(r.tokens)
        end = "stopped" if stopped or r.stop_reason.value == "stopped" else r.stop_reason.value
        warn = f" ⚠ {r.prompt.warning}" if r.prompt is not None and r.prompt.warning else ""
        self.stats.setText(
            f"{r.tokens_per_s:.1f} tokens/s · first token {r.ttft_s * 1000:.0f} ms after Send · "
            f"{len(r.tokens)} tokens · {end}{warn}"
        )
        if warn:
            self.stats.setToolTip(r.prompt.warning)

    def show_note(self, message: str) -> None:
        """Add a grey note line to the transcript (kept in ``notes``)."""
        self.notes.append(message)
        cur = QTextCursor(self.view.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setForeground(theme.note_colour(self.view))
        cur.insertBlock()
        cur.insertText(f"[{message}]", fmt)

    def fail(self, message: str) -> None:
        """Show an error in this column only."""
        self.error = message
        theme.set_status(self.stats, f"Error: {message}", error=True)
        self.stats.setWordWrap(True)
        cur = QTextCursor(self.view.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(theme.error_color(self.view)))
        cur.insertText(f"[{message}]", fmt)

    def mark_divergence(self, index: int) -> None:
        """Highlight the first token where this column departs from the first column."""
        if self.divergence is None or index < self.divergence:
            self.divergence = index
            self.view.highlight(index)


BackendFactory = Callable[[Path], Any]


def _set_torch_threads(n: int | None) -> None:
    """torch's threads for the transformers columns (process-wide, so the face sets it; on a job thread)."""
    if n:
        import torch

        torch.set_num_threads(n)


def _default_factory(n_ctx: int, kv_type: Callable[[], str | None] = lambda: None) -> BackendFactory:
    def make(path: Path) -> Any:
        return session.open_backend(path, n_ctx=n_ctx, kv_type=kv_type())  # on the module: tests replace it

    return make


class ChatPanel(JobPanel, QWidget):
    """Chat with several models at once; see the module docstring."""

    tokenShown = Signal(int, object)  # column, TokenEvent
    turnFinished = Signal(object)  # list[ColumnOutcome]
    stopped = Signal()
    columnsChanged = Signal()
    errorShown = Signal(str)  # a turn failed for every column

    n_ctx = 2048  # context of the models the default factory opens

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # A stopped turn still delivers its partial replies (to on_done, then on_cancel).
        self.init_task(state, jobs, "chat", keep_partial=True)
        self.backend_factory: BackendFactory = _default_factory(self.n_ctx, lambda: self.kv_type)
        self.columns: list[ChatColumn] = []
        self.thread_share: chat_threads.ThreadShare | None = None  # what the headers say
        self._backends: dict[str, Any] = {}
        self._session: ChatSession | None = None
        self._turn = 0
        self._stopping = False
        self._queue = _TokenQueue(self)
        self._queue.ready.connect(self._show_tokens)
        self._build()
        state.modelOpened.connect(self._on_model_opened)
        state.exported.connect(self._on_exported)
        self.update_controls()

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        self.add_gguf_button = widgets.button("Add GGUF…", self, self._choose_gguf)
        self.add_folder_button = widgets.button("Add model folder…", self, self._choose_folder)
        self.new_button = widgets.button("New conversation", self, self.new_conversation)
        self.max_tokens = widgets.spin_box(self, 1, 32768, 128, tip="Tokens to generate per reply")
        self.temperature = widgets.spin_box(
            self, 0.0, 5.0, 0.0, step=0.1, tip="0 is greedy: the most likely token every time"
        )
        self.seed = widgets.spin_box(self, 0, 2**31 - 1, tip="Random seed, the same for every column")
        self.kv_combo = widgets.combo_box(
            self,
            [("F32 (exact)", None), *((name.upper(), name) for name in ("f16", "q8_0", "q4_0"))],
            tip="llama.cpp's K/V cache type for the GGUF columns (flash attention when quantized); "
            "changing it reloads them and starts a new conversation",
            on_change=self._on_kv_changed,
        )
        self.truncate = QCheckBox("Truncate long prompts", self)
        self.truncate.setToolTip("Keep only the end of a prompt that does not fit in the context")
        # two rows, not one: in one row the buttons and settings need ~1140 px, wider than a 1280×720
        # window's page beside the model tree, and the page scrolled sideways over the right column
        bar = QHBoxLayout()
        for w in (self.add_gguf_button, self.add_folder_button, self.new_button):
            bar.addWidget(w)
        bar.addStretch(1)
        settings = QHBoxLayout()
        for label, w in (
            ("Max tokens", self.max_tokens),
            ("Temperature", self.temperature),
            ("Seed", self.seed),
            ("KV cache", self.kv_combo),
        ):
            settings.addWidget(QLabel(label, self))
            settings.addWidget(w)
        settings.addWidget(self.truncate)
        settings.addStretch(1)

        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.placeholder = QLabel(
            "Add two or more models (the original and its GGUF variants) to compare their answers.", self
        )
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)

        self.prompt = QPlainTextEdit(self)
        self.prompt.setPlaceholderText("Type a message; the same prompt goes to every model.")
        self.prompt.setMaximumHeight(110)
        self.send_button = widgets.button("Send", self, self.send, default=True)
        self.stop_button = widgets.button("Stop", self, self.stop)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        bottom = QHBoxLayout()
        bottom.addWidget(self.prompt, 1)
        bottom.addLayout(buttons)

        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addLayout(settings)
        lay.addWidget(self.placeholder)
        lay.addWidget(self.splitter, 1)
        lay.addLayout(bottom)

    # -- columns ----------------------------------------------------------------------------------

    def add_model(self, path: str | Path, label: str | None = None) -> ChatColumn | None:
        """Add a column for a GGUF file or a checkpoint folder (ignored if already present)."""
        assert_gui_thread("ChatPanel.add_model")
        p = Path(path)
        if any(c.path == p for c in self.columns):
            return None
        names = {c.label for c in self.columns}
        label = label or p.name
        while label in names:
            label += "′"
        col = ChatColumn(p, label, self)
        col.removeRequested.connect(self.remove_column)
        self.columns.append(col)
        self.splitter.addWidget(col)
        self._columns_changed()
        self._preload(col)
        return col

    def _backend_of(self, col: ChatColumn) -> Any:
        key = str(col.path)
        if key not in self._backends:
            self._backends[key] = self.backend_factory(col.path)
        b = self._backends[key]
        b.label = col.label
        return b

    def _share_threads(self) -> None:
        """Give every column an equal share of the cores and say so in each header."""
        backends = [self._backends[str(c.path)] for c in self.columns if str(c.path) in self._backends]
        self._show_share(chat_threads.apply(backends))

    def _show_share(self, share: chat_threads.ThreadShare) -> None:
        self.thread_share = share
        for col in self.columns:
            col.set_threads(share.describe())

    def _preload(self, col: ChatColumn) -> None:
        """Start loading the column's model now, so Send finds it ready (issue 26)."""
        try:
            b = self._backend_of(col)
        except StudioError as err:
            col.set_load_failed(str(err))
            return
        self._share_threads()
        if b.loaded:
            col.set_loaded(load_seconds(b))
            return
        col.set_loading()

        def done(seconds: float, col: ChatColumn = col, b: Any = b) -> None:
            if col in self.columns and self._backends.get(str(col.path)) is b:
                col.set_loaded(seconds)  # its notes reach the column with the first reply, as before

        def failed(message: str, col: ChatColumn = col, b: Any = b) -> None:
            if col in self.columns and self._backends.get(str(col.path)) is b:
                col.set_load_failed(message)

        def load(ctx: Any, b: Any = b) -> float:
            _set_torch_threads(chat_threads.torch_threads([b]))
            return load_timed(b, ctx)

        self.jobs.submit(
            f"Load {col.label}",
            load,
            kind="chat-load",
            on_success=done,
            on_error=failed,
        )

    def set_models(self, paths: Sequence[str | Path]) -> None:
        """Replace every column by one per path."""
        for col in list(self.columns):
            self.remove_column(col)
        for p in paths:
            self.add_model(p)

    @Slot(object)
    def remove_column(self, col: ChatColumn) -> None:
        """Remove a column (and close its model)."""
        if self.running or col not in self.columns:
            return
        self.columns.remove(col)
        b = self._backends.pop(str(col.path), None)
        if b is not None:
            forget_load(b)
            b.close()
        col.setParent(None)
        col.deleteLater()
        self._columns_changed()
        self._share_threads()  # the others get the freed cores

    def _columns_changed(self) -> None:
        # a new set of columns starts a new conversation (the models stay loaded)
        self._session = None
        self.placeholder.setVisible(not self.columns)
        self.update_controls()
        self.columnsChanged.emit()

    def _choose_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Add a GGUF model", folders.start_in(self.state), "GGUF models (*.gguf)"
        )
        if path:
            folders.remember(self.state, path)
            self.add_model(path)

    def _choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Add a model folder", folders.start_in(self.state))
        if path:
            folders.remember(self.state, path)
            self.add_model(path)

    @Slot(object)
    def _on_model_opened(self, checkpoint: Any) -> None:
        info = getattr(checkpoint, "info", None)
        path = getattr(info, "path", None)
        if path is not None and not self.columns:
            self.add_model(path)

    @Slot(object)
    def _on_exported(self, outcome: ExportOutcome) -> None:
        self.add_model(outcome.result.path)  # a finished export becomes a column to compare

    # -- a turn -----------------------------------------------------------------------------------

    def sampling(self) -> Sampling:
        """The sampling settings shown in the panel."""
        return Sampling(
            max_tokens=self.max_tokens.value(),
            temperature=round(self.temperature.value(), 4),
            seed=self.seed.value(),
        )

    def _ensure_session(self) -> ChatSession:
        if self._session is None:
            self._session = ChatSession(
                [self._backend_of(col) for col in self.columns], set_torch_threads=_set_torch_threads
            )
        return self._session

    @Slot()
    def send(self) -> bool:
        """Send the prompt to every column; False when there is nothing to do (or a turn runs)."""
        assert_gui_thread("ChatPanel.send")
        text = self.prompt.toPlainText()
        if self.running or not self.columns or not text.strip():
            return False
        session = self._ensure_session()
        sampling = self.sampling()
        truncate = self.truncate.isChecked()
        self._turn += 1
        turn = self._turn
        for col in self.columns:
            col.begin_turn(text)
        self.prompt.clear()
        self._stopping = False
        queue = self._queue

        def work(ctx: Any) -> list[ColumnOutcome]:
            return session.send(
                text,
                sampling,
                on_token=lambda column, ev: queue.put(turn, column, ev),
                truncate=truncate,
                ctx=ctx,
            )

        self.task.start("Chat", work)
        self.update_controls()
        return True

    @Slot()
    def stop(self) -> None:
        """Stop every column before its next token."""
        if not self.running:
            return
        self._stopping = True
        self.task.cancel()
        if self._session is not None:
            self._session.request_stop()

    @Slot()
    def _show_tokens(self) -> None:
        """Draw every token the columns made since the last call (a turn's stale ones are dropped)."""
        by_column: dict[int, list[TokenEvent]] = {}
        for turn, column, ev in self._queue.take():
            if turn == self._turn and column < len(self.columns):
                by_column.setdefault(column, []).append(ev)
        if not by_column:
            return
        for column, events in by_column.items():
            self.columns[column].add_tokens(events)
        for column, events in by_column.items():
            for ev in events:
                self.tokenShown.emit(column, ev)
        self._update_divergence()

    def _update_divergence(self) -> None:
        if len(self.columns) < 2:
            return
        ref = self.columns[0]
        for col in self.columns[1:]:
            n = min(len(ref.tokens), len(col.tokens))
            if n == 0:
                continue
            i = first_divergence(ref.tokens[:n], col.tokens[:n])
            if i is not None:
                col.mark_divergence(i)
                ref.mark_divergence(i)

    def on_done(self, outcomes: list[ColumnOutcome]) -> None:
        self._show_tokens()  # the last tokens, if their wake-up is still queued behind this call
        stopped = self._stopping
        for out in outcomes:
            if out.column < len(self.columns):
                col = self.columns[out.column]
                b = self._backends.get(str(col.path))
                if b is not None and b.loaded and not col.load_state.startswith("loaded"):
                    col.set_loaded(load_seconds(b))  # loaded by this Send (an earlier load had failed)
                col.finish(out, stopped)
        if self._session is not None and self._session.share != self.thread_share:
            self._show_share(self._session.share)  # the share this turn ran with (the load moved)
        self._update_divergence()
        self.update_controls()
        self.turnFinished.emit(outcomes)

    def on_error(self, message: str) -> None:
        for col in self.columns:
            col.fail(message)
        self.update_controls()
        self.errorShown.emit(message)

    def on_cancel(self) -> None:
        self.update_controls()
        self.stopped.emit()

    @Slot()
    def new_conversation(self) -> None:
        """Clear every transcript and start over (the models stay loaded)."""
        if self.running:
            return
        if self._session is not None:
            self._session.reset()
        for col in self.columns:
            col.view.clear()
            col.view.clear_tokens()
            col.tokens = []
            col.stats.setText("")

    @property
    def kv_type(self) -> str | None:
        """The KV-cache type the GGUF columns load with (None: llama.cpp's exact F32 default)."""
        return self.kv_combo.currentData()

    @Slot()
    def _on_kv_changed(self, *_args: Any) -> None:
        # The cache type is fixed when llama.cpp creates its context: reload the GGUF columns.
        self._close_backends(gguf_only=True)
        self.new_conversation()
        for col in self.columns:
            if col.path.suffix.lower() == ".gguf":
                self._preload(col)

    def update_controls(self) -> None:
        busy = self.running
        self.kv_combo.setEnabled(not busy)
        self.send_button.setEnabled(not busy and bool(self.columns))
        self.stop_button.setEnabled(busy)
        for w in (self.add_gguf_button, self.add_folder_button, self.new_button):
            w.setEnabled(not busy)
        for col in self.columns:
            col.remove_button.setEnabled(not busy)

    def shutdown(self) -> None:
        """Stop a running turn and close every model (call when the window closes)."""
        self.stop()
        self._close_backends()

    def _close_backends(self, *, gguf_only: bool = False) -> None:
        for key in [k for k in self._backends if not gguf_only or k.lower().endswith(".gguf")]:
            try:
                b = self._backends.pop(key)
                forget_load(b)
                b.close()
            except Exception:  # noqa: BLE001 - closing goes on for the others
                pass
        self._session = None
