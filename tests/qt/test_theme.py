"""The theme: no panel spells a colour, status errors take the theme's colour, plot defaults are safe at start-up."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QLabel

from studio.qt import theme

ROOT = Path(__file__).resolve().parents[2]
PANELS = ROOT / "studio" / "qt" / "panels"
# A hex colour, rgb()/rgba(), a QColor built from numbers, a name, or a pen/brush tuple of numbers.
COLOUR = re.compile(
    r"#[0-9a-fA-F]{6}\b|\brgba?\(|QColor\(\s*(\d|[\"'])|(brush|pen)=\(\s*\d|mk(Pen|Brush)\(\s*[\"'(]"
)


def test_no_panel_spells_a_colour():
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(PANELS.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if COLOUR.search(line)
    ]
    assert found == []


def test_the_colour_check_sees_the_colours_it_forbids():
    for line in ('pen=pg.mkPen("#d00000")', "brush=(208, 0, 0, 70)", "QColor(255, 190, 90)", "rgba(1,2,3,4)"):
        assert COLOUR.search(line), line
    assert not COLOUR.search("QColor(theme.DIVERGE_COLOR)")


def test_an_error_status_takes_the_error_colour_of_a_light_or_dark_window(qtbot):
    label = QLabel()
    qtbot.addWidget(label)
    theme.set_status(label, "The file is gone.", error=True)
    assert label.text() == "The file is gone." and theme.ERROR_COLOR[False] in label.styleSheet()
    dark = QPalette(label.palette())
    dark.setColor(QPalette.ColorRole.Window, QColor(30, 30, 30))
    label.setPalette(dark)
    theme.set_status(label, "Again.", error=True)
    assert theme.ERROR_COLOR[True] in label.styleSheet()
    theme.set_status(label, "Fine now.")
    assert label.styleSheet() == ""


def test_plot_defaults_wait_for_a_half_done_pyqtgraph_import():
    """Opening a model while the start-up job still imports pyqtgraph on a worker thread used to fail
    with AttributeError on the half-initialised module (and the model never opened)."""
    script = textwrap.dedent(
        """
        import importlib.abc, importlib.machinery, sys, threading, time
        from PySide6.QtWidgets import QApplication
        app = QApplication([])
        from studio.qt import theme

        class SlowLoader(importlib.abc.Loader):
            def __init__(self, real): self.real = real
            def create_module(self, spec): return self.real.create_module(spec)
            def exec_module(self, module):
                time.sleep(1.0)  # the module is in sys.modules but still empty
                self.real.exec_module(module)

        class SlowFinder(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "pyqtgraph":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                spec.loader = SlowLoader(spec.loader)
                return spec

        sys.meta_path.insert(0, SlowFinder())
        worker = threading.Thread(target=lambda: __import__("pyqtgraph"))
        worker.start()
        while "pyqtgraph" not in sys.modules:
            time.sleep(0.001)
        theme.set_plot_defaults(True)
        import pyqtgraph as pg
        assert pg.getConfigOption("background") == theme.plot_colors(True)["bg"]
        worker.join()
        print("ok")
        """
    )
    env = {"PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
