"""Issue 5's acceptance, driven through the real MainWindow over a factory model with planted outliers.

Every expectation is computed here independently of the panels: tensors are read with safetensors,
histograms and channel absmax with numpy, sizes from gguf-py's block table. The window is driven the
way a user drives it: File → Open folder, a click in the model tree, a click on a page's tab, the
plan cell edited through its model's edit role (what the combo delegate does), the Export dialog.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from safetensors import safe_open

from studio.core.factory import read_factory_info
from studio.core.quant.blocks import dequantize, quantize
from studio.core.quant.metrics import error_metrics
from studio.qt.jobs import JobState
from studio.qt.panels.export_dialog import ExportDialog

# Generous: a loaded 2-core machine, and the first statistics/quantize job may compile kernels.
OPEN_TIMEOUT_MS = 60_000
JOB_TIMEOUT_MS = 60_000
EXPORT_TIMEOUT_MS = 240_000  # a cancel can land while the partial file is being verified


# -- independent reference computations ---------------------------------------------------------------


def _read(model_dir: Path, name: str) -> np.ndarray:
    """A tensor read straight from the safetensors files, without studio.core."""
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="np") as st:
            if name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                return st.get_tensor(name)
    raise KeyError(name)


def _gguf_bytes(qtype: str, n_elements: int) -> int:
    """Bytes of ``n_elements`` weights stored as ``qtype``, from gguf-py's (block size, block bytes)."""
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    assert n_elements % block == 0
    return n_elements // block * nbytes


def _total_bytes(label_text: str) -> int:
    """The exact byte count shown in the plan editor's size label ("1.2 MB (1,234,567 bytes of tensors)")."""
    m = re.search(r"\(([\d,]+) bytes", label_text)
    assert m, f"no byte count in the size label {label_text!r}"
    return int(m.group(1).replace(",", ""))


# -- driving the window like a user -------------------------------------------------------------------


def _open_folder(qtbot, win, monkeypatch, path: Path) -> None:
    """File → Open folder…, answering the folder dialog with ``path``; waits until the model is open."""
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(path)))
    win.act_open_folder.trigger()
    qtbot.waitUntil(lambda: win.state.checkpoint is not None, timeout=OPEN_TIMEOUT_MS)
    assert win.panels_ready and win.panel("inspector") is not None


def _click_tensor(qtbot, win, name: str) -> None:
    """Click ``name``'s row in the model tree (its layer group expanded and scrolled to first)."""
    tree = win.model_tree
    idx = tree.proxy.mapFromSource(tree.model.index_of(name))
    assert idx.isValid(), f"{name} is not in the model tree"
    tree.view.expand(idx.parent())
    tree.view.scrollTo(idx)
    rect = tree.view.visualRect(idx)
    assert rect.isValid() and not rect.isEmpty(), f"{name}'s row is not visible in the tree"
    qtbot.mouseClick(tree.view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def _select_and_wait_for_stats(qtbot, win, name: str) -> None:
    with qtbot.waitSignal(
        win.panel("inspector").statsShown, timeout=JOB_TIMEOUT_MS, check_params_cb=lambda shown: shown == name
    ):
        _click_tensor(qtbot, win, name)
    assert win.state.selected_tensor == name


def _click_tab(qtbot, win, key: str) -> None:
    i = win.page_index(key)
    assert i >= 0, f"no {key} page"
    bar = win.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(i).center())
    assert win.tabs.currentIndex() == i


def _assert_inspector_shows(win, x: np.ndarray) -> None:
    """The inspector's histogram and channel plots hold exactly what numpy computes from ``x``."""
    panel = win.panel("inspector")
    # float64 bins over [min, max] (np.histogram of the float32 array would round its edges to float32).
    counts, edges = np.histogram(
        x.astype(np.float64), bins=panel.bins, range=(float(x.min()), float(x.max()))
    )
    assert counts.sum() == x.size
    np.testing.assert_array_equal(panel.hist_item.xData, edges)
    np.testing.assert_array_equal(panel.hist_item.yData, np.log10(1.0 + counts))
    absmax_out, absmax_in = np.abs(x).max(axis=1), np.abs(x).max(axis=0)
    for plot, expected in ((panel.out_channels, absmax_out), (panel.in_channels, absmax_in)):
        np.testing.assert_array_equal(plot.curve.xData, np.arange(expected.size))
        np.testing.assert_array_equal(plot.curve.yData, expected)


# -- the acceptance tests -----------------------------------------------------------------------------


def test_selecting_a_tensor_in_the_tree_draws_numpy_histogram_channels_and_planted_outliers(
    qtbot, make_window, tiny_models, monkeypatch, dialogs
):
    path = tiny_models("llama")
    planted = read_factory_info(path)
    assert planted is not None and planted.outlier_channels
    name = planted.outlier_tensors[0]
    win = make_window()
    _open_folder(qtbot, win, monkeypatch, path)

    _select_and_wait_for_stats(qtbot, win, name)
    # A choice in the tree while the summary is shown brings the inspector to the front.
    assert win.tabs.currentIndex() == win.page_index("inspector")
    x = _read(path, name)
    _assert_inspector_shows(win, x)

    # The highlighted input channels (default rule: 5 × median absmax) are exactly the planted ones.
    panel = win.panel("inspector")
    sx, sy = panel.in_channels.outliers.getData()
    assert sorted(sx.astype(int).tolist()) == sorted(planted.outlier_channels)
    np.testing.assert_array_equal(sy, np.abs(x).max(axis=0)[sorted(planted.outlier_channels)])
    assert panel.table_value("outlier input channels") == f"{len(planted.outlier_channels)} of {x.shape[1]}"
    assert panel.table_value("elements") == f"{x.size:,}"
    assert dialogs.calls == []


def test_preview_page_shows_the_core_snr_for_the_chosen_qtype(
    qtbot, make_window, tiny_models, monkeypatch, dialogs
):
    path = tiny_models("llama")
    name = "model.layers.0.mlp.down_proj.weight"
    win = make_window()
    _open_folder(qtbot, win, monkeypatch, path)
    _select_and_wait_for_stats(qtbot, win, name)
    _click_tab(qtbot, win, "preview")
    preview = win.panel("preview")
    assert name in preview.tensor_label.text()
    x = _read(path, name)

    # Q8_0 first, then Q4_K (the default choice): the label must follow the qtype chosen.
    shown: dict[str, str] = {}
    for qtype in ("Q8_0", "Q4_K"):
        preview.qtype_combo.setCurrentIndex(preview.qtype_combo.findText(qtype))
        assert preview.qtype == qtype
        qtbot.waitUntil(preview.run_button.isEnabled, timeout=JOB_TIMEOUT_MS)
        with qtbot.waitSignal(
            preview.previewShown,
            timeout=JOB_TIMEOUT_MS,
            check_params_cb=lambda r, q=qtype: r.scheme == q and r.name == name,
        ):
            qtbot.mouseClick(preview.run_button, Qt.MouseButton.LeftButton)
        core = error_metrics(x, dequantize(quantize(x, qtype), qtype, x.shape))
        assert preview.snr_label.text() == f"{core.snr_db:.2f} dB"
        assert preview.cosine_label.text() == f"{core.cosine:.6f}"
        shown[qtype] = preview.snr_label.text()
    assert shown["Q8_0"] != shown["Q4_K"]
    assert dialogs.calls == []


def test_plan_cell_edit_changes_the_size_by_that_tensors_bytes_and_undo_restores_it(
    qtbot, make_window, tiny_models, monkeypatch, dialogs
):
    path = tiny_models("llama")
    name = "model.layers.1.self_attn.q_proj.weight"
    win = make_window()
    _open_folder(qtbot, win, monkeypatch, path)
    _click_tab(qtbot, win, "plan")
    editor = win.panel("plan")
    model = editor.model

    # The cell a user sees as row "layer 1", column "attn_q".
    rows = [model.headerData(r, Qt.Orientation.Vertical) for r in range(model.rowCount())]
    cols = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    index = model.index(rows.index("layer 1"), cols.index("attn_q"))
    assert model.tensors_at(index.row(), index.column()) == [name]
    old = index.data(Qt.ItemDataRole.EditRole)
    new = "Q8_0" if old != "Q8_0" else "Q6_K"
    label_before = editor.size_label.text()
    before = _total_bytes(label_before)

    n = _read(path, name).size
    with qtbot.waitSignal(win.state.planChanged, timeout=5000):
        assert model.setData(index, new, Qt.ItemDataRole.EditRole)  # what TypeDelegate.setModelData does
    assert index.data() == new
    assert win.state.plan.types[name] == new
    assert _total_bytes(editor.size_label.text()) - before == _gguf_bytes(new, n) - _gguf_bytes(old, n)

    assert editor.undo_button.isEnabled()
    qtbot.mouseClick(editor.undo_button, Qt.MouseButton.LeftButton)
    assert index.data() == old
    assert editor.size_label.text() == label_before
    assert win.state.plan.types[name] == old
    assert dialogs.calls == []


def test_open_select_export_cancel_leaves_no_file_and_the_window_still_answers(
    qtbot, make_window, tiny_models, monkeypatch, dialogs, tmp_path
):
    path = tiny_models("llama")
    first, second = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight"
    win = make_window()
    _open_folder(qtbot, win, monkeypatch, path)
    _select_and_wait_for_stats(qtbot, win, first)
    _assert_inspector_shows(win, _read(path, first))

    win.act_export.trigger()
    dlg = win.findChild(ExportDialog)  # File → Export GGUF… opened it as the window's child
    assert dlg is not None and dlg.isVisible()
    folder = tmp_path / "exports"
    folder.mkdir()
    dlg.set_plan_choice("Q8_0")
    dlg.set_output_path(folder / "cancelled.gguf")
    assert dlg.verify_check.isChecked()  # verification keeps the job alive long enough to cancel
    seen: list[int] = []
    dlg.progress.valueChanged.connect(seen.append)

    qtbot.mouseClick(dlg.export_button, Qt.MouseButton.LeftButton)
    job = dlg.job
    assert job is not None and job.kind == "export"
    qtbot.waitUntil(lambda: dlg.progress.value() > 0, timeout=OPEN_TIMEOUT_MS)
    assert job.active, "the export ended before it could be cancelled"
    # The window's own status bar follows the export too.
    assert win.job_progress.isVisible()
    with qtbot.waitSignal(dlg.exportCancelled, timeout=EXPORT_TIMEOUT_MS):
        qtbot.mouseClick(dlg.cancel_button, Qt.MouseButton.LeftButton)
    assert job.state is JobState.CANCELLED
    assert seen and max(seen) > 0
    assert sorted(p.name for p in folder.iterdir()) == []  # neither the .gguf nor its .partial
    assert dlg.export_button.isEnabled()

    # The window still answers: another click in the tree redraws the inspector with that tensor.
    _select_and_wait_for_stats(qtbot, win, second)
    _assert_inspector_shows(win, _read(path, second))
    qtbot.waitUntil(lambda: not win.jobs.busy, timeout=OPEN_TIMEOUT_MS)
    assert win.job_progress.isHidden()
    assert dialogs.calls == []
