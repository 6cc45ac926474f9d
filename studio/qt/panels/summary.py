"""The summary panel: what the open model is, and which presets fit this machine at a context length."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QAction, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QBoxLayout,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.qt.fmt import (
    describe_hardware,
    enum_text,
    home_relative,
    human_bytes,
    human_count,
    model_display_name,
    role_text,
)
from studio.qt.icons import app_icon
from studio.qt.jobs import JobManager
from studio.qt.origin import origin_text
from studio.qt.panels import read_only_table
from studio.qt.state import StudioState
from studio.qt.theme import verdict_colour, warning_box_style

ESTIMATE_COLUMNS = ("Preset", "File size", "Bits/weight", "Memory", "Verdict")
ROLE_COLUMNS = ("Role", "Tensors", "Parameters")
CTX_MIN, CTX_MAX = 128, 1 << 20
STACK_BELOW_PX = 1100  # the two columns stack in a narrower panel


def _cell(text: str, *, right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
    if right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _table(columns: Sequence[str], parent: QWidget) -> QTableWidget:
    table = read_only_table(parent, columns)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setAlternatingRowColors(False)
    table.setShowGrid(False)
    table.setWordWrap(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setStretchLastSection(True)
    table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    table.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
    _fit_height(table)
    return table


def _fit_height(table: QTableWidget) -> None:
    """Make a short table exactly as tall as its rows, so the panel scrolls instead of the table."""
    table.resizeRowsToContents()
    rows = sum(table.rowHeight(r) for r in range(table.rowCount()))
    height = table.horizontalHeader().sizeHint().height() + rows + 2 * table.frameWidth()
    table.setFixedHeight(height)
    # Never narrower than its columns: the panel's scroll area scrolls instead of cutting them.
    table.setMinimumWidth(
        sum(table.columnWidth(c) for c in range(table.columnCount())) + 2 * table.frameWidth()
    )


class SummaryPanel(QWidget):
    """Facts about the open model, its tensors per role, and the estimate table with verdicts.

    Before a model is open it shows a welcome page, with buttons for the window's open actions
    (``set_welcome_actions``).
    """

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("SummaryPanel")
        self._state = state
        self.stack = QStackedWidget(self)
        self.stack.addWidget(self._build_welcome())
        self.stack.addWidget(self._build_summary())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.stack)

        state.modelOpened.connect(self._on_model_opened)
        state.modelClosed.connect(self._on_model_closed)
        state.estimatesChanged.connect(self._on_estimates)
        state.hardwareChanged.connect(self._on_hardware)
        state.contextLengthChanged.connect(self._on_context_length)

    # -- construction -----------------------------------------------------------------------------

    def set_welcome_actions(self, actions: Sequence[QAction]) -> None:
        """Show a button for each of ``actions`` on the welcome page."""
        for action in actions:
            button = QPushButton(action.icon(), action.text().replace("&", ""), self)
            button.clicked.connect(action.trigger)
            button.setMinimumHeight(32)
            self._welcome_row.insertWidget(self._welcome_row.count() - 1, button)
            self.welcome_buttons.append(button)

    def _build_welcome(self) -> QWidget:
        page = QWidget(self)
        outer = QVBoxLayout(page)
        outer.addStretch(2)
        title = QLabel("Quant Studio", page)
        font = QFont(title.font())
        font.setPointSizeF(font.pointSizeF() * 2.0)
        font.setBold(True)
        title.setFont(font)
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        text = QLabel(
            "Open a Hugging Face model folder or a GGUF file to see its tensors, their roles and which "
            "quantization presets fit this machine.\nNo model at hand? Open the demo model, SmolLM2-135M-Instruct, a real "
            "chat model that works offline once installed.",
            page,
        )
        text.setWordWrap(True)
        text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        text.setFixedWidth(560)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addStretch(1)
        self._welcome_row = buttons
        self.welcome_buttons: list[QPushButton] = []
        logo = QLabel(page)
        logo.setPixmap(app_icon().pixmap(96, 96))
        logo.setAlignment(Qt.AlignmentFlag.AlignCenter)
        outer.addWidget(logo)
        outer.addWidget(title)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(text)
        row.addStretch(1)
        outer.addLayout(row)
        outer.addSpacing(12)
        outer.addLayout(buttons)
        outer.addStretch(3)
        return page

    def _build_summary(self) -> QWidget:
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        page = QWidget(scroll)
        scroll.setWidget(page)
        outer = QVBoxLayout(page)
        outer.setContentsMargins(12, 10, 12, 10)

        self.title_label = QLabel(page)
        font = QFont(self.title_label.font())
        font.setPointSizeF(font.pointSizeF() * 1.5)
        font.setBold(True)
        self.title_label.setFont(font)
        self.title_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.path_label = QLabel(page)
        self.path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.path_label.setForegroundRole(self.path_label.foregroundRole())
        self.path_label.setWordWrap(True)
        outer.addWidget(self.title_label)
        outer.addWidget(self.path_label)

        self.warnings_label = QLabel(page)
        self.warnings_label.setWordWrap(True)
        self.warnings_label.setObjectName("WarningsLabel")
        self.warnings_label.setStyleSheet(warning_box_style("WarningsLabel"))
        self.warnings_label.hide()
        outer.addWidget(self.warnings_label)

        # Where the weights came from (a folder made from a GGUF, the demo's case) and what that means
        self.origin_label = QLabel(page)
        self.origin_label.setWordWrap(True)
        self.origin_label.setObjectName("OriginLabel")
        self.origin_label.setStyleSheet(warning_box_style("OriginLabel"))
        self.origin_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.origin_label.hide()
        outer.addWidget(self.origin_label)

        columns = QHBoxLayout()
        self._columns = columns  # side by side when wide, stacked when narrow (resizeEvent)
        outer.addLayout(columns, 1)

        # Left column: facts and tensors per role.
        left = QVBoxLayout()
        facts_box = QGroupBox("Model", page)
        self.facts = QFormLayout(facts_box)
        self.facts.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        self.fact_labels: dict[str, QLabel] = {}
        for key in (
            "Architecture",
            "Model type",
            "Format",
            "Layers",
            "Parameters",
            "Tensors",
            "Weights",
            "Dtypes",
        ):
            value = QLabel("–", facts_box)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.facts.addRow(f"{key}:", value)
            self.fact_labels[key] = value
        left.addWidget(facts_box)
        roles_box = QGroupBox("Tensors by role", page)
        roles_layout = QVBoxLayout(roles_box)
        self.roles_table = _table(ROLE_COLUMNS, roles_box)
        roles_layout.addWidget(self.roles_table)
        left.addWidget(roles_box)
        left.addStretch(1)
        columns.addLayout(left, 2)

        # Right column: estimates for this machine.
        right = QVBoxLayout()
        est_box = QGroupBox("Presets on this machine", page)
        est_layout = QVBoxLayout(est_box)
        self.hardware_label = QLabel("Detecting hardware…", est_box)
        self.hardware_label.setWordWrap(True)
        est_layout.addWidget(self.hardware_label)
        ctx_row = QHBoxLayout()
        ctx_label = QLabel("Context length:", est_box)
        self.ctx_spin = QSpinBox(est_box)
        self.ctx_spin.setRange(CTX_MIN, CTX_MAX)
        self.ctx_spin.setSingleStep(1024)
        self.ctx_spin.setGroupSeparatorShown(True)
        self.ctx_spin.setSuffix(" tokens")
        self.ctx_spin.setKeyboardTracking(False)  # recompute once per typed number, not per digit
        self.ctx_spin.setValue(self._state.context_length)
        self.ctx_spin.setToolTip("The KV cache for this many tokens is added to the memory estimate.")
        self.ctx_spin.valueChanged.connect(self._state.set_context_length)
        ctx_label.setBuddy(self.ctx_spin)
        ctx_row.addWidget(ctx_label)
        ctx_row.addWidget(self.ctx_spin)
        ctx_row.addStretch(1)
        est_layout.addLayout(ctx_row)
        self.estimate_table = _table(ESTIMATE_COLUMNS, est_box)
        est_layout.addWidget(self.estimate_table)
        self.estimate_note = QLabel("", est_box)
        self.estimate_note.setWordWrap(True)
        est_layout.addWidget(self.estimate_note)
        right.addWidget(est_box)
        right.addStretch(1)
        columns.addLayout(right, 3)
        return scroll

    def resizeEvent(self, event: Any) -> None:
        # two columns need about 1000 px; narrower (a laptop with the tree open) they stack, so no
        # text is cut off at the right edge
        wide = event.size().width() >= STACK_BELOW_PX
        want = QBoxLayout.Direction.LeftToRight if wide else QBoxLayout.Direction.TopToBottom
        if self._columns.direction() != want:
            self._columns.setDirection(want)
        super().resizeEvent(event)

    # -- state slots ------------------------------------------------------------------------------

    @Slot(object)
    def _on_model_opened(self, checkpoint: Any) -> None:
        info = checkpoint.info
        self.title_label.setText(self._state.model_name or model_display_name(info.path))
        self.path_label.setText(home_relative(info.path))
        self.path_label.setToolTip(str(info.path))
        fmt = info.format
        f = self.fact_labels
        f["Architecture"].setText(info.architecture)
        f["Model type"].setText(info.model_type or "–")
        f["Format"].setText(enum_text(fmt))
        f["Layers"].setText(str(info.n_layers))
        f["Parameters"].setText(f"{human_count(info.parameters)}  ({info.parameters:,})")
        f["Tensors"].setText(f"{len(info.tensors):,}")
        f["Weights"].setText(f"{human_bytes(info.weight_bytes)}  ({info.weight_bytes:,} bytes)")
        f["Dtypes"].setText(self._dtype_text(info))
        self._show_warnings(info.warnings)
        self._show_origin(info)
        self._fill_roles(info)
        self.estimate_table.setRowCount(0)
        _fit_height(self.estimate_table)
        self.estimate_note.setText(
            "Computing estimates…" if self._state.hardware is not None else "Waiting for hardware detection…"
        )
        self.stack.setCurrentIndex(1)

    @Slot()
    def _on_model_closed(self) -> None:
        self.stack.setCurrentIndex(0)
        self.estimate_table.setRowCount(0)
        self.roles_table.setRowCount(0)

    @Slot(object)
    def _on_hardware(self, hw: Any) -> None:
        self.hardware_label.setText(f"This machine: {describe_hardware(hw)}")

    @Slot(int)
    def _on_context_length(self, n: int) -> None:
        if self.ctx_spin.value() != n:
            self.ctx_spin.setValue(n)

    @Slot(object)
    def _on_estimates(self, estimates: tuple[Any, ...]) -> None:
        table = self.estimate_table
        table.setRowCount(len(estimates))
        for row, est in enumerate(estimates):
            table.setItem(row, 0, _cell(str(est.preset)))
            size = _cell(human_bytes(est.file_bytes), right=True)
            if est.n_fallbacks:
                size.setToolTip(
                    f"{est.n_fallbacks} tensor(s) get another type: their rows do not fit the block size."
                )
            table.setItem(row, 1, size)
            table.setItem(row, 2, _cell(f"{est.bits_per_weight:.2f}", right=True))
            memory = _cell(human_bytes(est.memory_bytes), right=True)
            memory.setToolTip(
                f"weights {human_bytes(est.tensor_bytes)} + KV cache {human_bytes(est.kv_bytes)}"
                f" + overhead {human_bytes(est.overhead_bytes)}"
            )
            table.setItem(row, 3, memory)
            verdict = _cell(str(getattr(est.verdict, "value", est.verdict)))
            verdict.setBackground(verdict_colour(est.verdict))
            verdict.setToolTip(f"llama.cpp n_gpu_layers suggestion: {est.gpu_layers}")
            table.setItem(row, 4, verdict)
        header = table.horizontalHeaderItem(3)
        if header is not None:
            header.setText(f"Memory @ {self._state.context_length:,} ctx")
        table.resizeColumnsToContents()
        _fit_height(table)
        note = "Memory = weights + KV cache for the context length + run-time overhead." if estimates else ""
        note += self._fallback_note(estimates)
        moe = estimates[0] if estimates and getattr(estimates[0], "n_experts", 0) else None
        if moe is not None:  # mixture of experts: every expert is stored, a few run per token
            note += (
                f" Mixture of experts: {moe.n_experts} per layer, {moe.n_experts_used} used per token; "
                f"{human_count(moe.n_active_params)} of {human_count(moe.n_params)} weights active per token."
            )
        self.estimate_note.setText(note)

    # -- helpers ----------------------------------------------------------------------------------

    def _show_origin(self, info: Any) -> None:
        text = origin_text(info)
        self.origin_label.setText(text)
        self.origin_label.setVisible(bool(text))

    def _fallback_note(self, estimates: Sequence[Any]) -> str:
        """Why a preset's bits per weight exceed its name's: rows its blocks do not divide."""
        info = self._state.info
        hit = [e for e in estimates if getattr(e, "n_fallbacks", 0)]
        if info is None or not hit:
            return ""
        widths = sorted({int(t.shape[-1]) for t in info.tensors if len(t.shape) == 2 and t.shape[-1] % 256})
        shown = ", ".join(str(w) for w in widths[:4]) or "some"
        worst = max(hit, key=lambda e: e.n_fallbacks)
        return (
            f" Bits per weight are after fallbacks: rows {shown} wide are not a multiple of 256 (a K-quant "
            f"block), so those tensors get another type ({worst.n_fallbacks} in {worst.preset}); hover a size "
            "to see how many."
        )

    def _show_warnings(self, warnings: Sequence[str]) -> None:
        if warnings:
            self.warnings_label.setText("⚠ " + "\n⚠ ".join(warnings))
            self.warnings_label.show()
        else:
            self.warnings_label.clear()
            self.warnings_label.hide()

    @staticmethod
    def _dtype_text(info: Any) -> str:
        by_dtype: Counter[str] = Counter()
        for t in info.tensors:
            by_dtype[str(t.dtype)] += t.nbytes
        total = sum(by_dtype.values()) or 1
        return ", ".join(f"{d} ({100 * b / total:.0f}%)" for d, b in by_dtype.most_common())

    def _fill_roles(self, info: Any) -> None:
        counts: Counter[str] = Counter()
        params: Counter[str] = Counter()
        for t in info.tensors:
            key = role_text(t.role)
            counts[key] += 1
            params[key] += t.n_elements
        table = self.roles_table
        table.setRowCount(len(counts))
        for row, (role, n) in enumerate(sorted(counts.items(), key=lambda kv: -params[kv[0]])):
            table.setItem(row, 0, _cell(role))
            table.setItem(row, 1, _cell(str(n), right=True))
            table.setItem(row, 2, _cell(human_count(params[role]), right=True))
        table.resizeColumnsToContents()
        _fit_height(table)
