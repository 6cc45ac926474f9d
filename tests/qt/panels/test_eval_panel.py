"""The evaluation panel: runs the real evaluation in a job, fills the table and the quality-versus-size plot."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from studio.qt.jobs import JobManager
from studio.qt.panels.eval_panel import COLUMNS, EvalPanel
from studio.qt.state import StudioState
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of


@pytest.fixture
def panel(qtbot):
    p = EvalPanel(StudioState(), JobManager())
    qtbot.addWidget(p)
    p.show()
    yield p
    p.cancel()
    qtbot.waitUntil(lambda: not p.running, timeout=60_000)
    p.jobs.shutdown()


def test_evaluation_fills_table_and_plot(qtbot, panel, chat_model, f32_gguf, gguf_of):
    panel.state.modelOpened.emit(SimpleNamespace(info=SimpleNamespace(path=chat_model)))
    assert panel.original_edit.text() == str(chat_model)
    assert not panel.run_button.isEnabled()  # no variants yet
    q2 = gguf_of(chat_model, "Q2_K")
    panel.add_variant(f32_gguf)
    panel.state.publish_export(
        SimpleNamespace(result=SimpleNamespace(path=q2))
    )  # an export lands in the list
    assert panel.variants() == [str(f32_gguf), str(q2)]
    panel.ctx_spin.setValue(64)
    panel.chunks_spin.setValue(2)
    published = []
    panel.state.evaluated.connect(published.append)
    with qtbot.waitSignal(panel.reportShown, timeout=120_000) as blocker:
        assert panel.start()
        assert panel.cancel_button.isEnabled() and not panel.run_button.isEnabled()
    report = blocker.args[0]
    assert published and published[-1] is report
    assert panel.table.rowCount() == 3
    header = [panel.table.horizontalHeaderItem(i).text() for i in range(len(COLUMNS))]
    assert header == list(COLUMNS)
    assert panel.table.item(0, 0).text().endswith("(original)")
    f32_row, q2_row = 1, 2
    assert float(panel.table.item(f32_row, 3).text()) < 1e-5
    assert float(panel.table.item(q2_row, 3).text()) > float(panel.table.item(f32_row, 3).text())
    assert panel.table.item(q2_row, 5).text().endswith("%")
    pts = panel.plotted_points()
    assert len(pts) == 2
    (x_small, kl_small), (x_big, kl_big) = pts  # smallest file first
    assert x_small < x_big and kl_small > kl_big
    assert kl_small == pytest.approx(report.variants[1].kld_mean)
    assert panel.run_button.isEnabled() and not panel.progress.isVisible()


def test_errors_and_cancel_are_shown(qtbot, panel, chat_model, tmp_path):
    panel.set_original(tmp_path / "no-such-model")
    panel.add_variant(tmp_path / "x.gguf")
    with qtbot.waitSignal(panel.errorShown, timeout=60_000) as blocker:
        assert panel.start()
    assert "no-such-model" in blocker.args[0] and "no-such-model" in panel.status.text()
    # the failed run is over and a new one can start at once
    assert not panel.running and panel.run_button.isEnabled() and not panel.progress.isVisible()
    assert panel.start() is True and panel.running
    panel.cancel()
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)


def test_text_source_choice(panel, tmp_path):
    assert panel.text_source() == "sample"
    f = tmp_path / "mine.txt"
    f.write_text("hello", encoding="utf-8")
    panel.set_text_file(f)
    assert panel.text_source() == str(f) and "mine.txt" in panel.text_combo.currentText()
