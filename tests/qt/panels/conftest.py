"""Fixtures shared by the panel tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def open_plan_editor(qtbot, tiny_models) -> Iterator[Callable[[str], tuple[Any, Any, Any]]]:
    """``open_plan_editor(arch) -> (state, panel, checkpoint)``: a shown plan editor over a tiny model."""
    from studio.core.model import open_model
    from studio.qt.jobs import JobManager
    from studio.qt.panels.plan_editor import PlanEditorPanel
    from studio.qt.state import StudioState

    opened = []

    def run(arch: str) -> tuple[Any, Any, Any]:
        state = StudioState()
        ckpt = open_model(tiny_models(arch))
        opened.append(ckpt)
        panel = PlanEditorPanel(state, JobManager())
        qtbot.addWidget(panel)
        panel.show()
        state.set_checkpoint(ckpt)
        return state, panel, ckpt

    yield run
    for ck in opened:
        ck.close()


@pytest.fixture
def open_budget_export(qtbot, tiny_models) -> Iterator[Callable[[str], tuple[Any, Any, Any]]]:
    """``open_budget_export(arch) -> (state, budget dialog, export dialog)`` over a tiny model, one job
    manager between them (as the window has); shut down and closed afterwards."""
    from studio.core.model import open_model
    from studio.qt.jobs import JobManager
    from studio.qt.panels.budget_dialog import BudgetDialog
    from studio.qt.panels.export_dialog import ExportDialog
    from studio.qt.state import StudioState

    opened = []

    def run(arch: str) -> tuple[Any, Any, Any]:
        state, jobs = StudioState(), JobManager()
        ckpt = open_model(tiny_models(arch))
        opened.append((jobs, ckpt))
        state.set_checkpoint(ckpt)
        budget, export = BudgetDialog(state, jobs), ExportDialog(state, jobs)
        qtbot.addWidget(budget)
        qtbot.addWidget(export)
        return state, budget, export

    yield run
    for jobs, ckpt in opened:
        jobs.shutdown(5000)
        ckpt.close()
