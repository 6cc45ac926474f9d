"""The memory calculator: weights, KV cache and overhead of every precision for a model, context and
KV-cache type, as a table and a stacked bar against the chosen card, with the formulas beside them.

The numbers are ``studio.core.lab.memory.memory_report``; the panel only shows them (a cell's data is
its exact byte count, its tooltip the same in words) and writes the formulas out with the selected
row's numbers filled in (``MemoryReport.worked``).
"""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.lab.memory import (
    CONTEXTS,
    FORMULAS,
    GIB,
    GPU_RESERVE_BYTES,
    GPU_SIZES_GB,
    ModelShape,
    memory_report,
    shape_from_info,
)
from studio.core.llamacpp.kvcache import KV_TYPES
from studio.core.plan.estimate import Verdict
from studio.core.units import format_memory
from studio.qt import widgets
from studio.qt.jobs import JobManager
from studio.qt.panels import assert_gui_thread, choose, labelled_row, read_only_table
from studio.qt.state import StudioState
from studio.qt.theme import (
    follow_theme,
    memory_part_color,
    plot_colors,
    set_status,
    style_plot,
    verdict_colour,
)

__all__ = ["COLUMNS", "MemoryPanel"]

BYTES_ROLE = Qt.ItemDataRole.UserRole
COLUMNS = (
    "Precision",
    "Bits/weight",
    "Weights",
    "KV cache",
    "Overhead",
    "Total",
    *(f"{g} GB" for g in GPU_SIZES_GB),
    "This machine",
)
FIRST_FIT_COLUMN = 6
# A shape to start from when no model is open: Llama-3-8B.
DEFAULT_SHAPE = {"params": 8.03, "layers": 32, "kv_heads": 8, "head_dim": 128, "vocab": 128256}


def gib_text(n: int) -> str:
    """Bytes in GB with two decimals (MB below one GB, decimal units as everywhere), as the table shows them."""
    return format_memory(n)


def _ctx_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


class MemoryPanel(QWidget):
    """Pick the open model or a shape, a context and a KV type; see every precision's memory and fit."""

    reportShown = Signal(object)  # the MemoryReport just drawn
    errorShown = Signal(str)

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state, self.jobs = state, jobs
        self.report: Any = None
        self._bars: list[Any] = []
        self.plot_unit = 10**9  # bytes per unit of the bars' axis (decimal GB or MB)
        self._build()
        self._stale = False  # the model changed while the page was hidden
        self._stale_report = False  # the hardware changed while the page was hidden
        state.modelOpened.connect(self._on_model)
        state.modelClosed.connect(self._on_model)
        state.hardwareChanged.connect(self._on_hardware)
        follow_theme(state, self._apply_theme)
        self._on_model()

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        self.source_combo = widgets.combo_box(
            self,
            [("The open model", "model"), ("A shape (parameters, layers, heads)", "shape")],
            on_change=self._on_source,
        )
        self.params_spin = widgets.spin_box(
            self, 0.001, 5000.0, decimals=3, suffix=" B", tip="Parameters, in billions"
        )
        self.layers_spin = widgets.spin_box(self, 1, 1000, tip="Transformer layers")
        self.kv_heads_spin = widgets.spin_box(
            self, 1, 1024, tip="Key/value heads (fewer than attention heads with GQA)"
        )
        self.head_dim_spin = widgets.spin_box(self, 1, 4096, tip="Values per attention head")
        self.vocab_spin = widgets.spin_box(
            self, 0, 10_000_000, tip="Vocabulary size (the logits' share of the overhead)"
        )
        self._spins = (
            self.params_spin,
            self.layers_spin,
            self.kv_heads_spin,
            self.head_dim_spin,
            self.vocab_spin,
        )
        self.params_spin.setValue(DEFAULT_SHAPE["params"])
        for spin, key in (
            (self.layers_spin, "layers"),
            (self.kv_heads_spin, "kv_heads"),
            (self.head_dim_spin, "head_dim"),
            (self.vocab_spin, "vocab"),
        ):
            spin.setValue(DEFAULT_SHAPE[key])
        for spin in self._spins:
            spin.valueChanged.connect(self.recompute)

        self.ctx_combo = widgets.combo_box(self, [(_ctx_label(n), n) for n in CONTEXTS])
        choose(self.ctx_combo, 8192)
        self.kv_combo = widgets.combo_box(self, [(t.upper(), t) for t in KV_TYPES])
        choose(self.kv_combo, "f16")
        self.gpu_combo = widgets.combo_box(self, [(f"{g} GB card", g) for g in GPU_SIZES_GB])
        choose(self.gpu_combo, 24)
        for combo in (self.ctx_combo, self.kv_combo, self.gpu_combo):
            combo.currentIndexChanged.connect(self.recompute)

        shape_box = QGroupBox("Model", self)
        sf = QFormLayout(shape_box)
        sf.addRow("From:", self.source_combo)
        names = ("Parameters", "Layers", "KV heads", "Head dim", "Vocabulary")
        sf.addRow(labelled_row(shape_box, zip(names, self._spins, strict=True), stretch=False))
        sf.addRow(
            labelled_row(
                self, (("Context:", self.ctx_combo), ("KV cache:", self.kv_combo), ("Card:", self.gpu_combo))
            )
        )

        self.headline = QLabel("", self)
        self.headline.setWordWrap(True)
        font = self.headline.font()
        font.setBold(True)
        self.headline.setFont(font)
        self.status = QLabel("", self)
        self.status.setWordWrap(True)

        self.table = read_only_table(self, COLUMNS)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._show_worked)

        self.plot = pg.PlotWidget(self)
        self.plot.setLabel("left", "memory (GB)")
        self.plot.showGrid(x=False, y=True, alpha=0.3)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.addLegend(offset=(-10, 10))
        self.card_line = pg.InfiniteLine(angle=0, movable=False)
        self.card_line.label = pg.InfLineLabel(self.card_line, "", position=0.02, anchors=[(0, 1), (0, 1)])
        self.plot.addItem(self.card_line)

        mono = QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        self.formulas = QLabel(FORMULAS, self)
        self.formulas.setFont(mono)
        self.formulas.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.worked = QLabel("", self)
        self.worked.setFont(mono)
        self.worked.setWordWrap(True)
        self.worked.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        formula_box = QGroupBox("How the numbers are computed", self)
        fl = QVBoxLayout(formula_box)
        fl.addWidget(self.formulas)
        fl.addWidget(self.worked)
        fl.addStretch(1)

        bottom = QSplitter(Qt.Orientation.Horizontal, self)
        bottom.addWidget(self.plot)
        bottom.addWidget(formula_box)
        bottom.setSizes([600, 500])
        split = QSplitter(Qt.Orientation.Vertical, self)
        split.addWidget(self.table)
        split.addWidget(bottom)
        lay = QVBoxLayout(self)
        lay.addWidget(shape_box)
        lay.addWidget(self.headline)
        lay.addWidget(self.status)
        lay.addWidget(split, 1)

    # -- inputs -----------------------------------------------------------------------------------

    def set_shape(self, params: float, layers: int, kv_heads: int, head_dim: int, vocab: int = 0) -> None:
        """Calculate for a model of this shape (``params`` in parameters, not billions)."""
        choose(self.source_combo, "shape")
        self._show_shape(params, layers, kv_heads, head_dim, vocab)
        self.recompute()

    def _show_shape(self, params: float, layers: int, kv_heads: int, head_dim: int, vocab: int) -> None:
        spins = self._spins
        for spin in spins:
            spin.blockSignals(True)
        self.params_spin.setValue(params / 1e9)
        self.layers_spin.setValue(layers)
        self.kv_heads_spin.setValue(kv_heads)
        self.head_dim_spin.setValue(head_dim)
        self.vocab_spin.setValue(vocab)
        for spin in spins:
            spin.blockSignals(False)

    def set_context(self, n: int) -> None:
        """Calculate at a context of ``n`` tokens (added to the choices when it is not one)."""
        if not choose(self.ctx_combo, n):
            self.ctx_combo.addItem(_ctx_label(n), n)
            choose(self.ctx_combo, n)

    def set_kv_type(self, name: str) -> None:
        """Calculate for a KV cache of type ``name`` (``f16``, ``q8_0``, ``q4_0``)."""
        choose(self.kv_combo, name.lower())

    def set_card(self, gb: int) -> None:
        """Draw the line of a ``gb`` GB card."""
        choose(self.gpu_combo, gb)

    def shape(self) -> ModelShape:
        """The shape calculated for: the open model's, or the one typed in."""
        if self.source_combo.currentData() == "model" and self.state.info is not None:
            return shape_from_info(self.state.info)
        return ModelShape(
            "typed shape",
            int(round(self.params_spin.value() * 1e9)),
            self.layers_spin.value(),
            self.kv_heads_spin.value(),
            self.head_dim_spin.value(),
            self.vocab_spin.value(),
        )

    @Slot()
    def _on_model(self, *_args: Any) -> None:
        if not self.isVisible():
            # the report of every precision (~50-150 ms on the GUI thread) waits until the page shows:
            # opening a model must not pay for a page nobody looks at
            self._stale = True
            return
        self._stale = False
        has_model = self.state.info is not None
        self.source_combo.model().item(0).setEnabled(has_model)  # type: ignore[attr-defined]
        # the combo's own signal would compute (and draw) the report once more before the call below
        self.source_combo.blockSignals(True)
        choose(self.source_combo, "model" if has_model else "shape")
        self.source_combo.blockSignals(False)
        self._on_source()

    @Slot()
    def _on_source(self, *_args: Any) -> None:
        typed = self.source_combo.currentData() == "shape"
        for spin in self._spins:
            spin.setEnabled(typed)
        self.recompute()

    @Slot()
    def _on_hardware(self, *_args: Any) -> None:
        if self.isVisible():
            self.recompute()
        else:
            self._stale_report = True

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        """Catch up with a model opened (or closed), or the hardware found, while the page was hidden."""
        super().showEvent(event)
        if self._stale:
            self._on_model()
        elif self._stale_report:
            self.recompute()

    # -- results ----------------------------------------------------------------------------------

    @Slot()
    def recompute(self, *_args: Any) -> None:
        """Compute the report for the current inputs and show it (milliseconds: no job needed)."""
        assert_gui_thread("MemoryPanel.recompute")
        self._stale_report = False
        try:
            shape = self.shape()
            if shape.info is not None:  # the open model's shape, shown in the (disabled) fields
                self._show_shape(shape.params, shape.layers, shape.kv_heads, shape.head_dim, shape.vocab)
            report = memory_report(
                shape,
                int(self.ctx_combo.currentData()),
                str(self.kv_combo.currentData()),
                self.state.hardware,
            )
        except StudioError as err:
            set_status(self.status, str(err), error=True)
            self.errorShown.emit(str(err))
            return
        set_status(self.status, f"{report.shape.name} · this machine: {report.machine}")
        self.show_report(report)

    def show_report(self, report: Any) -> None:
        """Fill the table, the bars and the worked formulas from a ``MemoryReport``."""
        selected = self.selected_precision() or "Q4_K_M"
        self.report = report
        self.table.setRowCount(len(report.rows))
        for r, row in enumerate(report.rows):
            cells: list[tuple[str, Any]] = [
                (row.precision, None),
                (f"{row.bpw:.3g} ({row.bpw_source})", None),
                (gib_text(row.weights_bytes), row.weights_bytes),
                (gib_text(row.kv_cache_bytes), row.kv_cache_bytes),
                (gib_text(row.overhead_bytes), row.overhead_bytes),
                (gib_text(row.total_bytes), row.total_bytes),
            ]
            cells += [("fits" if row.fits[f"{g}GB"] else "no", row.fits[f"{g}GB"]) for g in GPU_SIZES_GB]
            cells.append((row.this_machine, row.this_machine))
            for c, (text, data) in enumerate(cells):
                item = QTableWidgetItem(text)
                if data is not None:
                    item.setData(BYTES_ROLE, data)
                if isinstance(data, int) and not isinstance(data, bool):
                    item.setToolTip(f"{data:,} bytes")
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if isinstance(data, bool):
                    item.setBackground(verdict_colour("FITS_GPU" if data else "DOES_NOT_FIT"))
                    item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                if c == len(cells) - 1:
                    item.setBackground(verdict_colour(_machine_verdict(row.this_machine)))
                if row.note and c == 0:
                    item.setToolTip(row.note)
                self.table.setItem(r, c, item)
        names = [row.precision for row in report.rows]
        self.table.selectRow(names.index(selected) if selected in names else 0)
        self._draw(report)
        self._show_worked()
        self.reportShown.emit(report)

    def _draw(self, report: Any) -> None:
        for bar in self._bars:
            self.plot.removeItem(bar)
        legend = self.plot.getPlotItem().legend
        if legend is not None:
            legend.clear()
        xs = list(range(len(report.rows)))
        top = max((row.total_bytes for row in report.rows), default=0)
        # a small model's bars in MB; the card's line then sits far above them, off the chart
        self.plot_unit = 10**9 if top >= 10**9 else 10**6
        unit_name = "GB" if self.plot_unit == 10**9 else "MB"
        self.plot.setLabel("left", f"memory ({unit_name})")
        self._bars = []
        base = [0.0] * len(xs)
        for name, part in (("weights", "weights"), ("KV cache", "kv"), ("overhead", "overhead")):
            heights = [
                getattr(row, f"{part if part != 'kv' else 'kv_cache'}_bytes") / self.plot_unit
                for row in report.rows
            ]
            bar = pg.BarGraphItem(
                x=xs,
                height=heights,
                y0=list(base),
                width=0.7,
                brush=pg.mkBrush(memory_part_color(part)),
                name=name,
            )
            self.plot.addItem(bar)  # named: the legend lists it
            self._bars.append(bar)
            base = [b + h for b, h in zip(base, heights, strict=True)]
        self.plot.getAxis("bottom").setTicks(
            [[(i, _short(row.precision)) for i, row in enumerate(report.rows)]]
        )
        card = int(self.gpu_combo.currentData())
        capacity = int(card * GIB - GPU_RESERVE_BYTES)
        self.card_line.setValue(capacity / self.plot_unit)
        self.card_line.label.setFormat(f"{card} GB card: {gib_text(capacity)} usable")
        fitting = [row.precision for row in report.rows if row.fits[f"{card}GB"]]
        reach = max(base, default=0.0)
        if capacity <= 1.5 * top:  # the card's line is worth showing next to the bars
            reach = max(reach, capacity / self.plot_unit)
        self.plot.setYRange(0, reach * 1.08 or 1.0, padding=0)
        self.headline.setText(
            f"At {report.ctx_len:,} tokens with a {report.kv_type.upper()} KV cache "
            f"({gib_text(report.kv_cache_bytes)}), a {card} GB card holds: "
            + (", ".join(fitting) if fitting else "none of these precisions")
            + "."
        )

    def bar_totals(self) -> list[float]:
        """The top of each stacked bar as drawn, in bytes (weights + KV cache + overhead)."""
        out = [0.0] * (self.table.rowCount())
        for bar in self._bars:
            opts = bar.opts
            for i, (y0, h) in enumerate(zip(opts["y0"], opts["height"], strict=True)):
                out[i] = max(out[i], (float(y0) + float(h)) * self.plot_unit)
        return out

    def selected_precision(self) -> str | None:
        """The precision of the selected row, or None."""
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows:
            return None
        item = self.table.item(rows[0].row(), 0)
        return item.text() if item is not None else None

    def cell_bytes(self, precision: str, column: str) -> Any:
        """The exact value behind a cell: bytes for the size columns, True/False for a card."""
        names = [self.table.item(r, 0).text() for r in range(self.table.rowCount())]
        item = self.table.item(names.index(precision), COLUMNS.index(column))
        return item.data(BYTES_ROLE)

    @Slot()
    def _show_worked(self) -> None:
        name = self.selected_precision()
        if self.report is None or name is None:
            self.worked.setText("")
            return
        self.worked.setText(f"{name}:\n{self.report.worked(name)}")

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        style_plot(self.plot, dark)
        c = plot_colors(dark)
        self.card_line.setPen(pg.mkPen(c["outlier"], width=2, style=Qt.PenStyle.DashLine))
        self.card_line.label.setColor(c["fg"])


def _short(precision: str) -> str:
    """A bar's label: ``FP16/BF16`` → ``FP16``, ``INT4/Q4_0`` → ``Q4_0``."""
    a, _, b = precision.partition("/")
    return b if b and a.startswith("INT") else a


def _machine_verdict(text: str) -> str:
    """The ``estimate.Verdict`` name of its value (the table keeps the words)."""
    try:
        return Verdict(text).name
    except ValueError:
        return ""
