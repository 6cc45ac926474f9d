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
