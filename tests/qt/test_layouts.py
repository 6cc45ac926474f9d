"""Every page fits a laptop screen and a desktop one: at 1280×720 and 1920×1080 no plot is shorter than
MIN_PLOT_HEIGHT (the page scrolls instead), in every page and every inner tab."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication, QTabWidget

from studio.core.model import open_model
from studio.qt.fit import MIN_PLOT_HEIGHT, plot_heights
from studio.qt.main_window import MainWindow
from studio.qt.pages import PAGES
from studio.qt.settings import AppSettings


def _settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(10)


def _each_view(win, qtbot):
    """(where, panel) for every page and every tab inside a page, each shown in turn."""
    for spec in PAGES:
        panel = win.panel(spec.key)
        if panel is None:
            continue
        win.show_page(spec.key)
        _settle(qtbot)
        yield spec.title, panel
        for tabs in panel.findChildren(QTabWidget):
            for i in range(tabs.count()):
                tabs.setCurrentIndex(i)
                _settle(qtbot)
                yield f"{spec.title} › {tabs.tabText(i)}", panel
            tabs.setCurrentIndex(0)


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_every_plot_of_every_page_is_at_least_the_minimum_height(
    qtbot, real_services, settings_path, tiny_models, size
):
    win = MainWindow(real_services, settings=AppSettings.from_file(str(settings_path)))
    qtbot.addWidget(win)
    win.resize(*size)
    win.show()
    try:
        win.ensure_panels()
        win.state.set_checkpoint(open_model(tiny_models("llama")))
        _settle(qtbot)
        assert (win.width(), win.height()) == size
        seen, small = 0, []
        for where, panel in _each_view(win, qtbot):
            for name, height in plot_heights(panel):
                seen += 1
                if height < MIN_PLOT_HEIGHT:
                    small.append(f"{where}: {name} is {height} px tall")
        assert seen >= 15  # the inspector's six, preview, overview, evaluate, calibrate's views, the lab's
        assert not small, "\n".join(small)
    finally:
        win.close()


def _horizontal_bars(win, qtbot) -> list[str]:
    """Where a page (or an inner tab) shows a horizontal scroll bar: its content is wider than the window."""
    from PySide6.QtWidgets import QScrollArea

    found = []
    for where, panel in _each_view(win, qtbot):
        area = panel.parentWidget()
        while area is not None and not isinstance(area, QScrollArea):
            area = area.parentWidget()
        if area is not None and area.horizontalScrollBar().isVisible():
            need = panel.minimumSizeHint().width()
            found.append(f"{where}: needs {need} px, has {area.viewport().width()} px")
    return found


@pytest.mark.parametrize("model", ["tiny", "gguf"])
def test_no_page_scrolls_sideways_at_1280x720(
    qtbot, real_services, settings_path, tiny_models, model, tmp_path
):
    """At 1280×720 with a model open (a GGUF original too: the chat page then has its GGUF columns),
    every page fits the window's width: the chat page's right column was cut off behind a scroll bar."""
    from studio.core.export.run import export_gguf

    folder = tiny_models("llama")
    # a name as long as the bench model's (a chat column's title is as wide as its name)
    gguf = export_gguf(folder, tmp_path / "Tiny-Llama-Coder-1.5B-Instruct-Q8_0.gguf", "Q8_0").path
    path, other = (gguf, folder) if model == "gguf" else (folder, gguf)
    win = MainWindow(real_services, settings=AppSettings.from_file(str(settings_path)))
    qtbot.addWidget(win)
    win.resize(1280, 720)
    win.show()
    try:
        win.ensure_panels()
        win.state.set_checkpoint(open_model(path))
        chat = win.panel("chat")
        chat.add_model(other)  # two columns side by side, the GGUF one on either side
        assert len(chat.columns) == 2
        _settle(qtbot)
        bars = _horizontal_bars(win, qtbot)
        assert not bars, "\n".join(bars)
    finally:
        win.close()
