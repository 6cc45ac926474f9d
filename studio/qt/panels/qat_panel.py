"""QAT against PTQ on the open model: settings, a live training-loss curve, and the float, PTQ and QAT
losses on another text with their verdicts.

The run is ``studio.core.lab.qat.run_qat`` in a child process (``studio.core.childjob``: it holds
float32 weights, gradients and AdamW's moments, and a machine out of memory must not take the window
with it); each step's loss comes back as an event and is drawn as it arrives. ``runner`` is what
tests swap for a fake, called as ``runner(kwargs, ctx, on_step)`` on a worker thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from studio.core.calib.data import builtin_dir
from studio.core.childjob import call_in_child
from studio.core.evaluate.verdict import judge
from studio.core.jobs import JobContext
from studio.core.lab.qat import qat_in_child
from studio.qt import folders, widgets
from studio.qt.jobs import JobManager
from studio.qt.panel_job import JobPanel
from studio.qt.panels import assert_gui_thread, choose, labelled_row, run_controls
from studio.qt.placeholder import set_placeholder
from studio.qt.state import StudioState
from studio.qt.theme import follow_theme, plot_colors, series_color, set_badge, set_status, style_plot

__all__ = ["QatPanel", "QatRunner"]

# A cancelled QAT child that has not stopped by itself within this is terminated: it holds nothing that
# outlives it (the model folder is written through a .partial sibling), and it cannot look at the cancel
# flag while it imports torch and transformers (tens of seconds on a busy machine). Cancel ends in < 2 s.
CANCEL_GRACE_S = 1.0

QatRunner = Callable[[dict[str, Any], JobContext, Callable[[Any], None]], Any]


def run_in_child(kwargs: dict[str, Any], ctx: JobContext, on_step: Callable[[Any], None]) -> Any:
    """The real runner: ``run_qat(**kwargs)`` in a spawned child, its step losses to ``on_step``."""
    return call_in_child(
        qat_in_child, kwargs, what="QAT", ctx=ctx, on_event=on_step, cancel_grace_s=CANCEL_GRACE_S
    )


def _prose() -> str:
    return str(builtin_dir() / "prose.txt")


class _Steps(QObject):
    """Carries step losses from the worker thread to the GUI thread (a queued signal)."""

    step = Signal(int, float)


class QatPanel(JobPanel, QWidget):
    """Fine-tune the open model through the straight-through estimator and compare with plain rounding."""

    resultShown = Signal(object)  # the QatResult just shown
    errorShown = Signal(str)

    def __init__(self, state: StudioState, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.init_task(state, jobs, "qat", progress=True)
        self.runner: QatRunner = run_in_child
        self.result: Any = None
        self.losses: list[tuple[int, float]] = []
        self._train_file: str | None = None
        self._steps = _Steps(self)
        self._steps.step.connect(self._on_step)
        self._build()
        state.modelOpened.connect(self._on_model)
        follow_theme(state, self._apply_theme)
        self.update_controls()

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        self.model_edit = widgets.line_edit(
            self, "a Hugging Face model folder (the open model by default)", self.update_controls
        )
        model_row = widgets.path_row(
            self.model_edit, widgets.button("…", self, self._choose_model, tip="Choose a model folder")
        )

        self.bits_spin = widgets.spin_box(self, 2, 8, 3, suffix=" bits")
        self.group_combo = widgets.combo_box(
            self, [*((f"groups of {g}", g) for g in (32, 64, 128)), ("one scale per output channel", None)]
        )
        self.steps_spin = widgets.spin_box(self, 1, 100_000, 30)
        self.seq_spin = widgets.spin_box(self, 8, 8192, 128, tip="Tokens per training and evaluation chunk")
        self.lr_spin = widgets.spin_box(self, 1e-6, 1e-1, 1e-4, decimals=6, step=1e-5)
        self.train_combo = widgets.combo_box(
            self, [("Built-in prose (the calibration text)", "prose"), ("Text file…", "file")]
        )
        self.train_combo.activated.connect(self._on_train_choice)
        self.eval_combo = widgets.combo_box(
            self, [("Built-in English sample (the evaluation text)", "sample")]
        )
        self.output_edit = widgets.line_edit(
            self, "optional: a new folder for the QAT weights (export takes it)"
        )

        self.run_button, self.cancel_button, self.progress, self.status = run_controls(self, "Run QAT")
        self.status.setText(
            "Rounds every linear layer in the forward pass, lets gradients pass straight through the "
            "rounding, fine-tunes briefly on one text and measures on another. SmolLM2-135M on CPU: "
            "about 2 minutes and 3.7 GB for 30 steps."
        )

        form = QFormLayout()
        form.addRow("Model:", model_row)
        settings = (
            ("Round to", self.bits_spin),
            ("with", self.group_combo),
            ("Steps", self.steps_spin),
            ("Tokens", self.seq_spin),
            ("Learning rate", self.lr_spin),
        )
        form.addRow(labelled_row(self, settings))
        form.addRow("Train on:", self.train_combo)
        form.addRow("Measure on:", self.eval_combo)
        form.addRow("Save to:", self.output_edit)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        form.addRow(buttons)

        self.plot = pg.PlotWidget(self)
        self.plot.setTitle("Training loss (fake-quantized model) and the held-out losses")
        self.plot.setLabel("bottom", "step")
        self.plot.setLabel("left", "cross-entropy (nats per token)")
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.curve = pg.PlotDataItem(symbol="o", symbolSize=4)
        self.plot.addItem(self.curve)
        set_placeholder(self.plot, "Run QAT to see the training loss")
        self._levels: list[pg.InfiniteLine] = []

        box = QGroupBox("On the held-out text", self)
        g = QGridLayout(box)
        self.loss_labels: dict[str, QLabel] = {}
        self.badges: dict[str, QLabel] = {}
        for r, (key, title) in enumerate((("float", "Float"), ("ptq", "PTQ (rounded)"), ("qat", "QAT"))):
            g.addWidget(QLabel(title, box), r, 0)
            self.loss_labels[key] = QLabel("—", box)
            g.addWidget(self.loss_labels[key], r, 1)
            if key != "float":
                self.badges[key] = QLabel("", box)
                g.addWidget(self.badges[key], r, 2)
        self.recovered = QLabel("", box)
        self.recovered.setWordWrap(True)
        g.addWidget(self.recovered, 3, 0, 1, 3)
        g.setRowStretch(4, 1)

        bottom = QHBoxLayout()
        bottom.addWidget(self.plot, 3)
        bottom.addWidget(box, 1)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addLayout(bottom, 1)

    # -- inputs -----------------------------------------------------------------------------------

    def set_model(self, path: str | Path) -> None:
        """Run QAT on the model folder ``path``."""
        self.model_edit.setText(str(path))

    def set_train_file(self, path: str | Path) -> None:
        """Fine-tune on a text file of the user's."""
        self._train_file = str(path)
        choose(self.train_combo, "file")
        self.train_combo.setItemText(self.train_combo.currentIndex(), f"Text file: {Path(path).name}")

    def _choose_model(self) -> None:
        path = QFileDialog.getExistingDirectory(
            self, "Choose a Hugging Face model folder", folders.start_in(self.state)
        )
        folders.remember(self.state, path)
        if path:
            self.set_model(path)

    def _on_train_choice(self, index: int) -> None:
        if self.train_combo.itemData(index) == "file":
            path, _ = QFileDialog.getOpenFileName(
                self, "Choose a text", folders.start_in(self.state), "Text (*.txt);;All files (*)"
            )
            folders.remember(self.state, path)
            if path:
                self.set_train_file(path)
            else:
                self.train_combo.setCurrentIndex(0)

    @Slot(object)
    def _on_model(self, checkpoint: Any) -> None:
        path = getattr(getattr(checkpoint, "info", None), "path", None)
        if path is not None and Path(path).is_dir():  # QAT trains a Hugging Face folder, not a GGUF
            self.set_model(path)

    def settings(self) -> dict[str, Any]:
        """The ``run_qat`` keyword arguments of the current inputs."""
        train = (
            self._train_file if self.train_combo.currentData() == "file" and self._train_file else _prose()
        )
        out = self.output_edit.text().strip()
        return {
            "model": self.model_edit.text().strip(),
            "train_text": train,
            "eval_text": str(self.eval_combo.currentData()),
            "bits": self.bits_spin.value(),
            "group": self.group_combo.currentData(),
            "steps": self.steps_spin.value(),
            "lr": self.lr_spin.value(),
            "seq_len": self.seq_spin.value(),
            "output": out or None,
        }

    # -- running ----------------------------------------------------------------------------------

    @Slot()
    def start(self) -> bool:
        """Run QAT in the background; False without a model or while one runs."""
        assert_gui_thread("QatPanel.start")
        kwargs = self.settings()
        if self.running or not kwargs["model"]:
            return False
        runner, emit = self.runner, self._steps.step.emit

        def work(ctx: JobContext) -> Any:
            return runner(kwargs, ctx, lambda ev: emit(int(ev[0]), float(ev[1])))

        self.losses = []
        self.curve.setData([], [])
        self._clear_levels()
        for label in (*self.loss_labels.values(), *self.badges.values()):
            label.setText("—" if label in self.loss_labels.values() else "")
            label.setStyleSheet("")
        self.recovered.setText("")
        self.status.setText(f"QAT at {kwargs['bits']} bits on {Path(kwargs['model']).name}…")
        self.progress.setRange(0, 0)
        self.task.start(f"QAT of {Path(kwargs['model']).name}", work, confirm_on_quit=True)
        self.update_controls()
        return True

    @Slot(int, float)
    def _on_step(self, step: int, loss: float) -> None:
        if not self.running:
            return  # a late event of a run already ended or superseded
        if not self.losses:
            set_placeholder(self.plot, None)
        self.losses.append((step, loss))
        self.curve.setData([s for s, _ in self.losses], [x for _, x in self.losses])

    def on_done(self, result: Any) -> None:
        self.update_controls()
        self.show_result(result)

    def on_cancel(self) -> None:
        self.update_controls()
        set_status(self.status, f"QAT cancelled after {len(self.losses)} steps.")

    def update_controls(self) -> None:
        busy = self.running
        self.progress.setVisible(busy)
        self.run_button.setEnabled(not busy and bool(self.model_edit.text().strip()))
        self.cancel_button.setEnabled(busy)

    # -- results ----------------------------------------------------------------------------------

    def show_result(self, result: Any) -> None:
        """Show a ``QatResult``: the three losses, their verdicts and levels on the chart."""
        assert_gui_thread("QatPanel.show_result")
        self.result = result
        set_placeholder(self.plot, None)
        if not self.losses:
            self.losses = list(enumerate(result.train_losses, 1))
            self.curve.setData([s for s, _ in self.losses], [x for _, x in self.losses])
        for key, loss in (("float", result.float_loss), ("ptq", result.ptq_loss), ("qat", result.qat_loss)):
            self.loss_labels[key].setText(f"{loss:.3f} nats · PPL {math.exp(loss):.2f}")
        for key, ppl in (("ptq", result.ptq_ppl), ("qat", result.qat_ppl)):
            j = judge(result.float_ppl, ppl)
            set_badge(self.badges[key], j.verdict)
            self.badges[key].setToolTip(j.text)
        gap = result.ptq_loss - result.float_loss
        if gap > 0:
            share = 100.0 * (result.ptq_loss - result.qat_loss) / gap
            self.recovered.setText(
                f"QAT won back {share:.0f} % of the loss rounding cost. The fine-tuned weights unrounded "
                f"score {result.finetuned_float_loss:.3f}: what the text alone taught."
            )
        self._clear_levels()
        c = plot_colors(bool(self.state.dark))
        for i, (name, loss) in enumerate(
            (("float", result.float_loss), ("PTQ", result.ptq_loss), ("QAT", result.qat_loss))
        ):
            line = pg.InfiniteLine(pos=loss, angle=0, movable=False)
            line.setPen(pg.mkPen(series_color(i + 1), width=2, style=Qt.PenStyle.DashLine))
            pg.InfLineLabel(line, f"{name} {loss:.3f}", position=0.9, color=c["fg"])
            self.plot.addItem(line)
            self._levels.append(line)
        set_status(
            self.status,
            f"{result.steps} steps of {result.seq_len} tokens on {result.train_text}, measured on "
            f"{result.eval_text} ({result.eval_tokens} tokens): {result.seconds:.0f} s"
            + (f", peak {result.peak_rss_bytes / 1e9:.1f} GB" if result.peak_rss_bytes else "")
            + (f"; saved to {result.output}" if result.output else "")
            + ".",
        )
        self.resultShown.emit(result)

    def _clear_levels(self) -> None:
        for line in self._levels:
            self.plot.removeItem(line)
        self._levels = []

    @Slot(bool)
    def _apply_theme(self, dark: bool) -> None:
        style_plot(self.plot, dark)
        c = plot_colors(dark)
        self.curve.setPen(pg.mkPen(c["main"], width=1))
        self.curve.setSymbolBrush(pg.mkBrush(c["main"]))
