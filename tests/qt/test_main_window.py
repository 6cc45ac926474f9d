"""The main window over real factory models: tree, summary, estimates, errors, recent models, title."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QTableWidget

from studio.core.plan.estimate import LOW_BIT_PRESETS
from studio.qt.fmt import human_bytes
from studio.qt.main_window import APP_TITLE
from studio.qt.opener import DEMO_NAME
from studio.qt.panels.model_tree import COL_NAME, COL_ROLE, GLOBAL_GROUP, NAME_ROLE
from studio.qt.settings import RECENT_KEY
from studio.qt.theme import verdict_colour

PRESETS = ["F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K", *LOW_BIT_PRESETS]
OPEN_TIMEOUT_MS = 30_000


def _safetensors_names(folder: Path) -> set[str]:
    """Tensor names read straight from the safetensors files, independently of studio.core."""
    from safetensors import safe_open

    names: set[str] = set()
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), framework="numpy") as st:
            names.update(st.keys())
    return names


def _open(qtbot, win, path: Path) -> None:
    job = win.open_path(path)
    assert job is not None
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)


def _tree_rows(win) -> dict[str, dict[str, str]]:
    """Every tensor row of the tree: full name -> {group, name cell, role cell}."""
    model = win.model_tree.model
    rows: dict[str, dict[str, str]] = {}
    for g in range(model.rowCount()):
        group = model.index(g, COL_NAME)
        for r in range(model.rowCount(group)):
            name_idx = model.index(r, COL_NAME, group)
            full = name_idx.data(NAME_ROLE)
            rows[full] = {
                "group": group.data(),
                "role": model.index(r, COL_ROLE, group).data(),
            }
    return rows


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_opening_a_factory_model_fills_the_tree_with_every_tensor(qtbot, make_window, tiny_models, arch):
    path = tiny_models(arch)
    win = make_window()
    assert win.model_tree.model.rowCount() == 0
    _open(qtbot, win, path)

    info = win.state.info
    rows = _tree_rows(win)
    expected = _safetensors_names(path)
    assert len(rows) == win.model_tree.model.tensor_count() == len(info.tensors)
    assert set(rows) == expected
    # One group per layer plus the model-level group, each tensor under its own layer.
    groups = {row["group"] for row in rows.values()}
    assert groups == {GLOBAL_GROUP} | {f"Layer {i}" for i in range(info.n_layers)}
    for t in info.tensors:
        assert rows[t.name]["group"] == (GLOBAL_GROUP if t.layer is None else f"Layer {t.layer}")
        assert rows[t.name]["role"] == t.role.value
    roles = {row["role"] for row in rows.values()}
    assert "unknown" not in roles
    assert {"token_embd", "norm"} <= roles


def test_roles_are_the_architectures_roles(qtbot, make_window, tiny_models):
    win = make_window()
    _open(qtbot, win, tiny_models("llama"))
    rows = _tree_rows(win)
    assert rows["model.layers.0.self_attn.q_proj.weight"]["role"] == "attn_q"
    assert rows["model.layers.1.mlp.down_proj.weight"]["role"] == "ffn_down"
    assert rows["model.layers.1.mlp.down_proj.weight"]["group"] == "Layer 1"
    assert rows["model.embed_tokens.weight"]["group"] == GLOBAL_GROUP


def test_selecting_a_tensor_in_the_tree_selects_it_in_the_state(qtbot, make_window, tiny_models):
    win = make_window()
    _open(qtbot, win, tiny_models("llama"))
    name = "model.layers.1.mlp.up_proj.weight"
    with qtbot.waitSignal(win.state.tensorSelected, timeout=2000) as sig:
        view = win.model_tree.view
        view.setCurrentIndex(win.model_tree.proxy.mapFromSource(win.model_tree.model.index_of(name)))
    assert sig.args == [name]
    assert win.state.selected_tensor == name
    # And the other way round: a selection made elsewhere moves the tree's current row.
    other = "model.layers.0.self_attn.k_proj.weight"
    win.state.select_tensor(other)
    assert win.model_tree.view.currentIndex().siblingAtColumn(COL_NAME).data(NAME_ROLE) == other


def test_summary_shows_the_estimates_and_the_context_length_recomputes(qtbot, make_window, tiny_models):
    from studio.core.plan.estimate import estimate_presets

    win = make_window()
    _open(qtbot, win, tiny_models("llama"))
    qtbot.waitUntil(lambda: win.summary.estimate_table.rowCount() > 0, timeout=OPEN_TIMEOUT_MS)
    table = win.summary.estimate_table
    assert [table.item(r, 0).text() for r in range(table.rowCount())] == PRESETS

    info, hw = win.state.info, win.state.hardware
    expected = estimate_presets(info, hw, ctx_len=win.state.context_length)
    for r, est in enumerate(expected):
        assert table.item(r, 1).text() == human_bytes(est.file_bytes)
        assert table.item(r, 3).text() == human_bytes(est.memory_bytes)
        assert table.item(r, 4).background().color() == verdict_colour(est.verdict)
    facts = win.summary.fact_labels
    assert facts["Architecture"].text() == info.architecture
    assert facts["Layers"].text() == str(info.n_layers)
    assert f"{info.parameters:,}" in facts["Parameters"].text()

    # A longer context means a bigger KV cache: the memory column follows the spin box.
    before = [table.item(r, 3).text() for r in range(table.rowCount())]
    with qtbot.waitSignal(win.state.estimatesChanged, timeout=OPEN_TIMEOUT_MS):  # the estimate is a job
        win.summary.ctx_spin.setValue(131072)
    assert win.state.context_length == 131072
    longer = estimate_presets(info, hw, ctx_len=131072)
    after = [table.item(r, 3).text() for r in range(table.rowCount())]
    assert after == [human_bytes(e.memory_bytes) for e in longer]
    assert after != before
    assert "131,072" in table.horizontalHeaderItem(3).text()


def test_window_title_names_the_open_model(qtbot, make_window, tiny_models):
    win = make_window()
    assert win.windowTitle() == APP_TITLE
    path = tiny_models("llama")
    _open(qtbot, win, path)
    assert win.windowTitle() == f"{path.name} — {APP_TITLE}"
    win.state.close_model()
    assert win.windowTitle() == APP_TITLE
    assert win.model_tree.model.rowCount() == 0
    assert win.summary.stack.currentIndex() == 0  # the welcome page again


def test_a_bad_folder_shows_one_sentence_in_a_dialog_and_the_window_still_answers(
    qtbot, make_window, tiny_models, dialogs, tmp_path
):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    win = make_window()
    win.open_path(empty)
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=OPEN_TIMEOUT_MS)
    kind, title, text = dialogs.calls[0]
    assert kind == "warning"
    assert "empty-model" in text
    assert "Traceback" not in text and "\n" not in text.strip()
    assert win.state.checkpoint is None
    assert win.windowTitle() == APP_TITLE
    # Still answers: the next open works.
    _open(qtbot, win, tiny_models("llama"))
    assert win.model_tree.model.tensor_count() > 0


def test_an_unexpected_exception_is_logged_and_shown_as_one_sentence(
    qtbot, make_window, real_services, dialogs, tmp_path, caplog
):
    def broken_open(path, ctx, allow_pickle):
        raise ValueError("boom\nsecond line")

    win = make_window(dataclasses.replace(real_services, open_model=broken_open))
    win.open_path(tmp_path)
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=5000)
    text = dialogs.calls[0][2]
    assert "ValueError: boom" in text and "\n" not in text and "second line" not in text
    assert any("unexpected error" in rec.getMessage() and rec.exc_info for rec in caplog.records)


def test_recent_models_are_remembered_across_windows(qtbot, make_window, tiny_models, settings_path):
    llama, gpt2 = tiny_models("llama"), tiny_models("gpt2")
    first = make_window()
    _open(qtbot, first, llama)
    qtbot.waitUntil(lambda: first.jobs.active_jobs("open") == [], timeout=5000)
    _open_next(qtbot, first, gpt2)
    first.close()

    # A gone path in the list is pruned when the menu is built.
    settings = QSettings(str(settings_path), QSettings.Format.IniFormat)
    settings.setValue(RECENT_KEY, [*settings.value(RECENT_KEY), str(Path("/nonexistent/model"))])
    settings.sync()

    second = make_window()
    second.recent_menu.aboutToShow.emit()
    paths = [a.data() for a in second.recent_menu.actions() if a.data()]
    assert paths == [str(gpt2.resolve()), str(llama.resolve())]  # most recent first, the gone one dropped
    assert second.recent_models() == paths
    # Choosing one opens it.
    second.recent_menu.actions()[1].trigger()
    qtbot.waitUntil(lambda: second.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)
    assert second.windowTitle().startswith(llama.name)


def _open_next(qtbot, win, path: Path) -> None:
    old = win.state.checkpoint
    assert win.open_path(path) is not None
    qtbot.waitUntil(
        lambda: win.state.checkpoint is not None and win.state.checkpoint is not old, timeout=OPEN_TIMEOUT_MS
    )


def test_open_demo_model_builds_and_opens(qtbot, make_window, real_services, tiny_models):
    built = []

    def demo(ctx):
        ctx.report(1, 2, "building")
        built.append(True)
        return tiny_models("qwen2")

    win = make_window(dataclasses.replace(real_services, demo_model_path=demo))
    win.act_open_demo.trigger()
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)
    assert built == [True]
    assert win.state.info.model_type == "qwen2"
    assert win.windowTitle() == f"{DEMO_NAME} — {APP_TITLE}"


def test_layout_and_geometry_are_remembered(qtbot, make_window, settings_path):
    first = make_window()
    dock = first.dock("ModelTreeDock")
    first.removeDockWidget(dock)
    first.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
    dock.show()
    first.close()
    second = make_window()
    assert second.dockWidgetArea(second.dock("ModelTreeDock")) == Qt.DockWidgetArea.RightDockWidgetArea
    second.reset_layout()
    assert second.dockWidgetArea(second.dock("ModelTreeDock")) == Qt.DockWidgetArea.LeftDockWidgetArea


def test_the_window_shows_before_heavy_modules_are_imported(tmp_path):
    """``quant-studio`` shows its window without importing torch, transformers, llama_cpp or the hub client."""
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-m", "studio.app", "--bench-startup", "--settings", str(tmp_path / "s.ini")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["heavy_modules_loaded"] == []
    assert report["torch_imported"] is False


def test_tensor_panel_shows_the_selected_tensor_and_its_type_per_preset(qtbot, make_window, tiny_models):
    win = make_window()
    _open(qtbot, win, tiny_models("llama"))
    qtbot.waitUntil(lambda: bool(win.state.estimates), timeout=OPEN_TIMEOUT_MS)
    panel = win.tensor_panel
    assert panel.details.isHidden()
    name = "model.layers.0.mlp.down_proj.weight"
    win.state.select_tensor(name)
    t = win.state.info.tensor(name)
    assert not panel.details.isHidden()
    assert panel.values["Name"].text() == name
    assert panel.values["Role"].text() == "ffn_down"
    assert panel.values["Shape"].text() == " × ".join(map(str, t.shape))
    table = panel.types_table
    shown = {table.item(r, 0).text(): table.item(r, 1).text() for r in range(table.rowCount())}
    assert shown == {e.preset: e.types[name] for e in win.state.estimates}
    assert shown["Q8_0"] == "Q8_0"


def test_a_second_open_while_one_runs_is_ignored(qtbot, make_window, real_services, tiny_models):
    import threading

    gate = threading.Event()

    def slow_open(path, ctx, allow_pickle):
        gate.wait(5)
        return real_services.open_model(path, ctx, allow_pickle)

    win = make_window(dataclasses.replace(real_services, open_model=slow_open))
    first = win.open_path(tiny_models("llama"))
    assert first is not None
    assert win.open_path(tiny_models("gpt2")) is None  # rapid second click: ignored, no crash
    assert not win.job_progress.isHidden()  # the progress indicator shows while opening
    gate.set()
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)
    assert win.state.info.model_type == "llama"
    # the open starts the Chat column's load, a child process that imports torch and transformers
    # (seconds on two cores): the indicator stays while that job runs and hides once no job does
    qtbot.waitUntil(lambda: not win.jobs.busy, timeout=OPEN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: win.job_progress.isHidden(), timeout=5000)


def test_quitting_while_an_important_job_runs_asks_then_cancels_and_joins(qtbot, make_window, dialogs):
    import threading

    from PySide6.QtCore import QThreadPool
    from PySide6.QtWidgets import QMessageBox

    win = make_window()
    qtbot.waitUntil(lambda: not win.jobs.busy, timeout=10_000)  # hardware detection done
    running = threading.Event()

    def export_like(ctx):
        running.set()
        while True:
            ctx.check_cancelled()
            ctx.report(1, 100, "writing")
            threading.Event().wait(0.01)

    job = win.jobs.submit("Exporting", export_like, kind="export", confirm_on_quit=True)
    assert running.wait(5)
    dialogs.answer = QMessageBox.StandardButton.No
    assert not win.close()
    assert win.isVisible() and job.active
    dialogs.answer = QMessageBox.StandardButton.Yes
    assert win.close()
    assert [c[0] for c in dialogs.calls] == ["question", "question"]
    assert QThreadPool.globalInstance().activeThreadCount() == 0
    qtbot.waitUntil(lambda: not job.active, timeout=2000)


def test_pickle_weights_open_only_after_the_user_opts_in(qtbot, make_window, dialogs, tiny_models, tmp_path):
    import shutil

    import torch
    from PySide6.QtWidgets import QMessageBox

    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_models("llama") / "config.json", folder / "config.json")
    torch.save({"model.embed_tokens.weight": torch.zeros(8, 4)}, folder / "pytorch_model.bin")

    win = make_window()
    dialogs.answer = QMessageBox.StandardButton.Cancel
    win.open_path(folder)
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=OPEN_TIMEOUT_MS)
    assert dialogs.calls[0][0] == "question" and "pytorch_model.bin" in dialogs.calls[0][2]
    qtbot.waitUntil(lambda: not win.jobs.active_jobs("open"), timeout=5000)
    assert win.state.checkpoint is None

    dialogs.answer = QMessageBox.StandardButton.Open
    win.open_path(folder)
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)
    assert win.model_tree.model.tensor_count() == 1
    # The summary says, visibly, that this was a pickle opened with weights_only=True.
    assert not win.summary.warnings_label.isHidden()
    assert "weights_only=True" in win.summary.warnings_label.text()


def test_the_theme_flag_follows_the_palette(qtbot, make_window):
    from PySide6.QtGui import QColor, QPalette

    win = make_window()
    light = QPalette(win.palette())
    light.setColor(QPalette.ColorRole.Window, QColor(240, 240, 240))
    light.setColor(QPalette.ColorRole.WindowText, QColor(20, 20, 20))
    dark = QPalette(win.palette())
    dark.setColor(QPalette.ColorRole.Window, QColor(30, 30, 30))
    dark.setColor(QPalette.ColorRole.WindowText, QColor(230, 230, 230))
    win.setPalette(light)  # start light whatever the platform's theme, so each flip is seen
    assert win.state.dark is False
    seen = []
    win.state.themeChanged.connect(seen.append)
    win.setPalette(dark)
    assert win.state.dark is True and seen == [True]
    win.setPalette(light)
    assert win.state.dark is False and seen == [True, False]


def _write_tiny_gguf(path: Path) -> list[str]:
    """A two-layer llama-like GGUF written with gguf-py (independent of our writer)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_head_count(2)
    names = ["token_embd.weight", "output_norm.weight"]
    w.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    for i in range(2):
        for part in ("attn_q", "ffn_down"):
            name = f"blk.{i}.{part}.weight"
            w.add_tensor(name, np.full((64, 64), 0.5, np.float32))
            names.append(name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return names


def test_a_gguf_file_opens_with_layers_and_roles(qtbot, make_window, tmp_path):
    path = tmp_path / "tiny.gguf"
    names = _write_tiny_gguf(path)
    win = make_window()
    _open(qtbot, win, path)
    rows = _tree_rows(win)
    assert set(rows) == set(names)
    assert rows["blk.1.ffn_down.weight"] == {"group": "Layer 1", "role": "ffn_down"}
    assert rows["blk.0.attn_q.weight"]["role"] == "attn_q"
    assert rows["token_embd.weight"] == {"group": GLOBAL_GROUP, "role": "token_embd"}
    assert win.windowTitle() == f"tiny.gguf — {APP_TITLE}"
    assert win.summary.fact_labels["Format"].text() == "gguf"


def test_bench_opens_the_fetched_bench_model_as_the_cli_does(qtbot, make_window, monkeypatch, tmp_path):
    # `quant-studio BENCH` once said "BENCH does not exist.": the alias was the CLI's alone
    path = tmp_path / "bench.gguf"
    names = _write_tiny_gguf(path)
    monkeypatch.setattr("studio.core.benchmodel.bench_model_path", lambda cache_dir=None: path)
    win = make_window()
    _open(qtbot, win, Path("BENCH"))
    assert set(_tree_rows(win)) == set(names)
    assert win.windowTitle() == f"bench.gguf — {APP_TITLE}"
    assert win.model_path == path


def test_bench_before_it_is_fetched_says_how_to_fetch_it(qtbot, make_window, dialogs):
    win = make_window()  # the tests' own empty cache: nothing fetched
    win.open_path("BENCH")
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=OPEN_TIMEOUT_MS)
    kind, _title, text = dialogs.calls[0]
    assert kind == "warning" and "\n" not in text
    assert "not fetched yet" in text and "quant-studio-cli bench-model" in text
    assert win.state.checkpoint is None


def test_a_text_file_named_gguf_is_refused_with_a_dialog(qtbot, make_window, dialogs, tmp_path):
    fake = tmp_path / "notes.gguf"
    fake.write_text("these are not weights\n")
    win = make_window()
    win.open_path(fake)
    qtbot.waitUntil(lambda: bool(dialogs.calls), timeout=OPEN_TIMEOUT_MS)
    kind, _title, text = dialogs.calls[0]
    assert kind == "warning" and "notes.gguf" in text and "\n" not in text
    assert win.state.checkpoint is None


def test_file_menu_shortcuts(make_window):
    from PySide6.QtGui import QKeySequence

    win = make_window()
    assert win.act_open_folder.shortcut() == QKeySequence("Ctrl+O")
    assert win.act_quit.shortcut() == QKeySequence("Ctrl+Q")
    texts = [a.text() for a in win.file_menu.actions()]
    assert texts[:3] == ["Open &folder…", "Open &GGUF…", "Open &demo model"]
    assert "&Quit" in texts
    win.act_quit.trigger()
    assert not win.isVisible()


# -- the studio window's pages, settings, shortcuts and theme ------------------------------------------


def _built(qtbot, win) -> None:
    """Wait for the pages' panels, which are built just after the first paint."""
    qtbot.waitUntil(lambda: win.panels_ready, timeout=30_000)


def test_the_panels_are_pages_and_a_tensor_chosen_on_the_summary_opens_the_inspector(
    qtbot, make_window, tiny_models
):
    win = make_window()
    _built(qtbot, win)
    titles = [win.tabs.tabText(i) for i in range(win.tabs.count())]
    assert titles[:6] == ["Summary", "Inspector", "Preview", "Overview", "Plan", "Hub"]
    assert titles[6:] == ["Chat", "Evaluate", "Calibrate", "Lab"]
    assert win.panel("chat") is not None and win.panel("evaluate") is not None
    lab = win.panel("lab")
    assert [lab.tabs.tabText(i) for i in range(lab.tabs.count())] == ["Sweep", "Memory", "QAT"]
    assert win.tabs.widget(1).widget is win.panel("inspector")
    assert win.dock("JobsDock").widget() is win.jobs_panel
    assert win.device_selector.parent() is win.toolbar
    _open(qtbot, win, tiny_models("llama"))
    assert win.tabs.currentIndex() == 0
    name = "model.layers.1.mlp.down_proj.weight"
    with qtbot.waitSignal(win.panel("inspector").statsShown, timeout=30_000) as shown:
        win.state.select_tensor(name)
    assert shown.args == [name]
    assert win.tabs.currentWidget().widget is win.panel("inspector")
    # The plan editor got the model too, and its plan is the window's current plan.
    assert win.panel("plan").plan is win.state.plan and win.state.plan is not None


def test_a_pages_error_also_shows_in_the_status_bar(qtbot, make_window):
    win = make_window()
    _built(qtbot, win)
    win.show_page("plan")
    win.panel("plan").set_selected("Q8_0")  # nothing selected: the editor says so
    assert "Select one or more cells first." in win.panel("plan").status.text()
    assert win.statusBar().currentMessage() == "Select one or more cells first."
    win.panel("hub").show_error("The Hub answered 503.")
    assert win.statusBar().currentMessage() == "The Hub answered 503."


def test_a_finished_hub_download_opens_in_the_inspector(qtbot, make_window, tiny_models):
    win = make_window()
    _built(qtbot, win)
    win.show_page("hub")
    path = tiny_models("llama")
    win.panel("hub").modelDownloaded.emit(str(path))
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)
    assert Path(win.state.info.path) == path
    assert win.tabs.currentWidget().widget is win.panel("inspector")


def test_pages_have_ctrl_number_shortcuts_and_the_page_is_remembered(qtbot, make_window, settings_path):
    from PySide6.QtGui import QKeySequence

    win = make_window()
    _built(qtbot, win)
    assert win.page_actions[4].shortcut() == QKeySequence("Ctrl+5")
    win.page_actions[4].trigger()
    assert win.tabs.tabText(win.tabs.currentIndex()) == "Plan"
    assert win.page_actions[9].shortcut() == QKeySequence("Ctrl+0")  # the tenth page
    win.page_actions[9].trigger()
    assert win.tabs.tabText(win.tabs.currentIndex()) == "Lab"
    win.page_actions[4].trigger()
    win.close()
    again = make_window()
    assert again.tabs.tabText(again.tabs.currentIndex()) == "Plan"


def test_help_lists_every_keyboard_shortcut(qtbot, make_window):
    win = make_window()
    _built(qtbot, win)
    assert win.act_shortcuts in win.help_menu.actions()
    dlg = win.show_shortcuts()
    table = dlg.findChild(QTableWidget, "ShortcutsTable")
    rows = {table.item(r, 0).text(): table.item(r, 1).text() for r in range(table.rowCount())}
    assert rows["Export GGUF"] == "Ctrl+E"
    assert rows["Open folder"] == "Ctrl+O"
    assert rows["Go to the Inspector page"] == "Ctrl+2"
    assert rows["Undo (plan editor)"] == "Ctrl+Z"
    assert rows["Keyboard shortcuts"] == "F1"
    # Every shortcut is distinct, so none is silently shadowed by another.
    keys = [k for v in rows.values() for k in v.split(", ")]
    assert len(keys) == len(set(keys))
    dlg.close()


def test_the_dark_theme_recolours_the_plots_and_is_remembered(qtbot, make_window, settings_path):
    from PySide6.QtGui import QPalette

    win = make_window()
    _built(qtbot, win)
    try:
        win.set_theme("dark")
        assert win.state.dark is True
        qtbot.waitUntil(
            lambda: win.palette().color(QPalette.ColorRole.Window).lightness() < 128, timeout=2000
        )
        assert win.state.dark is True
        bg = win.panel("inspector").hist_plot.backgroundBrush().color()
        assert bg.lightness() < 64  # the pyqtgraph background follows state.dark
        import pyqtgraph as pg

        assert pg.mkColor(pg.getConfigOption("background")).lightness() < 64  # and so do new plots
        assert QSettings(str(settings_path), QSettings.Format.IniFormat).value("view/theme") == "dark"
        win.set_theme("light")
        assert win.state.dark is False
        assert win.panel("inspector").hist_plot.backgroundBrush().color().lightness() > 200
        win.set_theme("dark")
        win.close()
        again = make_window()
        assert again.theme_actions["dark"].isChecked() and again.state.dark is True
        again.set_theme("system")
        assert again.theme_actions["system"].isChecked()
    finally:
        for w in (win,):
            w.set_theme("system")


def test_the_device_choice_is_remembered_and_preselected_in_the_export_dialog(
    qtbot, make_window, tiny_models
):
    from studio.core.hardware import Backend, GpuInfo, HardwareInfo

    hw = HardwareInfo(
        "Test CPU",
        8,
        32 << 30,
        16 << 30,
        (GpuInfo(0, "Test GPU", Backend.CUDA, 24 << 30, 20 << 30),),
        "torch",
    )
    win = make_window()
    # The real detection first, so it cannot overwrite the test's machine afterwards.
    qtbot.waitUntil(lambda: win.state.hardware is not None, timeout=30_000)
    win.state.set_hardware(hw)
    assert win.device_selector.devices() == ["cuda:0", "cpu"]
    assert win.device_selector.set_device("cpu")
    _open(qtbot, win, tiny_models("llama"))
    dlg = win.show_export_dialog()
    assert dlg.device == "cpu"
    assert [dlg.device_combo.itemData(i) for i in range(dlg.device_combo.count())] == ["cuda:0", "cpu"]
    dlg.hide()
    win.close()

    again = make_window()
    qtbot.waitUntil(lambda: again.state.hardware is not None, timeout=30_000)
    again.state.set_hardware(hw)
    assert again.device_selector.device == "cpu"  # the remembered choice, not the first GPU


def test_a_panel_that_fails_to_build_shows_one_sentence_in_its_place(qtbot, caplog):
    from studio.qt.pages import LazyPanel

    def broken(_parent):
        raise ImportError("No module named 'pyqtgraph'")

    page = LazyPanel("Inspector", broken)
    qtbot.addWidget(page)
    assert page.build() is None and page.failed
    text = page.placeholder.text()
    assert "inspector panel could not be loaded" in text and "pyqtgraph" in text and "\n" not in text
    assert any("building the Inspector panel failed" in r.message for r in caplog.records)
    ok = LazyPanel("Plan", lambda parent: QTableWidget(parent))
    qtbot.addWidget(ok)
    built = ok.build()
    assert isinstance(built, QTableWidget) and ok.build() is built and ok.widget is built


def test_a_model_downloaded_from_the_hub_page_opens_in_the_inspector(
    qtbot, make_window, monkeypatch, tmp_path
):
    """End to end over the fake Hub: search, select, Download → the window opens the snapshot."""
    from tests.core.hub.fakehub import FakeHub, prepare_env

    with FakeHub() as hub:
        prepare_env(monkeypatch, tmp_path, hub)
        monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (None, None))
        win = make_window()
        _built(qtbot, win)
        win.show_page("hub")
        panel = win.panel("hub")
        assert panel.jobs is win.jobs  # its downloads are the window's jobs (listed, cancelled on quit)
        panel.search_edit.setText("tiny-llama")
        panel.search()
        qtbot.waitUntil(lambda: panel.results.rowCount() > 0, timeout=20_000)
        panel.results.selectRow(0)
        qtbot.waitUntil(
            lambda: panel.files.rowCount() > 0 and panel.download_button.isEnabled(), timeout=20_000
        )
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=60_000)
        snapshot = Path(win.state.info.path)
        assert (snapshot / "model.safetensors").read_bytes() == hub.repos["tiny-org/tiny-llama"].files[
            "model.safetensors"
        ]
        assert win.tabs.currentWidget().widget is win.panel("inspector")
        assert win.model_tree.model.tensor_count() == len(win.state.info.tensors) > 0
        qtbot.waitUntil(lambda: not win.jobs.busy, timeout=30_000)
        win.close()
