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
    # each variant's row appears as soon as it is measured, before the report is complete
    streamed = []
    panel.rowStreamed.connect(lambda r: streamed.append((r, panel.table.item(r, 0).text(), panel.report)))
    with qtbot.waitSignal(panel.reportShown, timeout=120_000) as blocker:
        assert panel.start()
        assert panel.cancel_button.isEnabled() and not panel.run_button.isEnabled()
    report = blocker.args[0]
    assert published and published[-1] is report
    assert [(r, label) for r, label, _ in streamed] == [(1, v.label) for v in report.variants[:1]] + [
        (2, report.variants[1].label)
    ]
    assert all(shown is None for _, _, shown in streamed)  # streamed before the report was drawn
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


def _variant(label, ppl, kld, bpw, kv="f32"):
    from studio.core.evaluate import VariantScore

    return VariantScore(
        label, label, ppl, 0.1, kld, kld, kld * 3, kld * 5, 90.0, 10**6, bpw, 100, None, kv, 4096
    )


def _report(variants, original_ppl=6.0):
    from studio.core.evaluate import EvalReport, ModelScore

    o = ModelScore("orig", "orig", "transformers", original_ppl, 0.1, 100, 4 * 10**6, 32.0)
    return EvalReport(o, tuple(variants), "sample", 64, 2, 128, 1.0)


def test_each_variant_has_a_verdict_badge_and_the_hierarchy_is_measured(panel):
    from studio.qt.panels.eval_panel import VERDICT_COLUMN
    from studio.qt.theme import quality_colour

    report = _report(
        [
            _variant("m-Q8_0.gguf [KV f16]", 6.1, 0.001, 8.5, "f16"),
            _variant("m-Q8_0.gguf [KV q4_0]", 6.9, 0.03, 8.5, "q4_0"),
            _variant("m-Q4_K_M.gguf [KV f16]", 7.5, 0.01, 4.9, "f16"),
            _variant("m-Q2_K.gguf [KV f16]", 9.0, 0.2, 3.0, "f16"),
        ]
    )
    panel.show_report(report)
    badges = [panel.table.item(r, VERDICT_COLUMN) for r in range(1, 5)]
    assert [b.text() for b in badges] == ["excellent", "good", "acceptable", "something went wrong"]
    assert badges[0].background().color() == quality_colour("excellent")
    assert badges[3].background().color() == quality_colour("something went wrong")
    assert "ΔPPL +0.1" in badges[0].toolTip()
    assert panel.table.item(0, VERDICT_COLUMN).text() == ""  # the original has no verdict
    assert panel.table.item(2, VERDICT_COLUMN - 1).text().startswith("Q4_0")
    text = panel.hierarchy_label.text()
    assert (
        "weights at 4 bits (m-Q4_K_M.gguf [KV f16]" in text
        and "KV cache at 4 bits (m-Q8_0.gguf [KV q4_0])" in text
    )
    assert "3.0× as sensitive" in text
    panel.show_report(_report([_variant("m-Q4_K_M.gguf", 6.2, 0.01, 4.9)]))
    assert panel.hierarchy_label.text() == ""  # nothing to compare: no line


def test_the_kv_cache_choice_reaches_the_evaluation(qtbot, panel, monkeypatch, tmp_path):
    import studio.core.evaluate as evaluate_mod

    calls = []

    def fake(original, variants, **kw):
        calls.append(kw)
        return _report([_variant(f"v [KV {t}]", 6.1, 0.001, 8.5, t) for t in kw["kv_types"]])

    monkeypatch.setattr(evaluate_mod, "evaluate", fake)
    panel.set_original(tmp_path)
    panel.add_variant(tmp_path / "v.gguf")
    assert panel.kv_combo.currentText() == "F32 (exact)"
    panel.kv_combo.setCurrentIndex(panel.kv_combo.findText("Compare F16, Q8_0 and Q4_0"))
    with qtbot.waitSignal(panel.reportShown, timeout=30_000):
        assert panel.start()
    assert calls[-1]["kv_types"] == ("f16", "q8_0", "q4_0")
    assert panel.table.rowCount() == 4
    panel.kv_combo.setCurrentIndex(panel.kv_combo.findText("F32 (exact)"))
    with qtbot.waitSignal(panel.reportShown, timeout=30_000):
        assert panel.start()
    assert calls[-1]["kv_types"] == ()
