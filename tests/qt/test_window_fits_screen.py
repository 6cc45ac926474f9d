"""The window's first size fits its screen (issue 26): 1400×860 where there is room, smaller on a
1280×720 laptop, always inside the screen's available area, frame included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from studio.qt.fit import FRAME_ALLOWANCE
from studio.qt.main_window import DEFAULT_SIZE

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from PySide6.QtCore import QCoreApplication, QStandardPaths
from PySide6.QtWidgets import QApplication
app = QApplication([])
QStandardPaths.setTestModeEnabled(True)
QCoreApplication.setOrganizationName("QuantStudioTests")
QCoreApplication.setApplicationName("quant-studio-tests")
from studio.app import build_services
from studio.qt.main_window import MainWindow
from studio.qt.settings import AppSettings
win = MainWindow(build_services(), settings=AppSettings.from_file(sys.argv[1]))
win.show()
app.processEvents()
g, f, a = win.geometry(), win.frameGeometry(), win.screen().availableGeometry()
print(json.dumps({"size": [g.width(), g.height()], "frame": [f.x(), f.y(), f.width(), f.height()],
                  "available": [a.x(), a.y(), a.width(), a.height()]}))
win.close()
"""


def _inside(frame: list[int], area: list[int]) -> bool:
    x, y, w, h = frame
    ax, ay, aw, ah = area
    return ax <= x and ay <= y and x + w <= ax + aw and y + h <= ay + ah


def test_the_window_fits_the_available_geometry_of_the_test_screen(make_window):
    # the offscreen platform's screen here is smaller than the default size
    win = make_window()
    win.show()
    area = win.screen().availableGeometry()
    assert area.width() < DEFAULT_SIZE[0]
    f = win.frameGeometry()
    assert _inside([f.x(), f.y(), f.width(), f.height()], [area.x(), area.y(), area.width(), area.height()])
    assert win.width() == area.width() - FRAME_ALLOWANCE[0]


@pytest.mark.parametrize(
    ("screen", "want"),
    [
        ((1280, 720), (1280 - FRAME_ALLOWANCE[0], 720 - FRAME_ALLOWANCE[1])),  # a laptop: shrunk to fit
        ((1920, 1080), DEFAULT_SIZE),  # room enough: the default size, centred
    ],
)
def test_the_first_window_fits_a_laptop_screen_and_keeps_its_size_on_a_big_one(tmp_path, screen, want):
    res = _window_on(screen, tmp_path / "settings.ini", tmp_path)
    assert tuple(res["size"]) == want
    assert _inside(res["frame"], res["available"])


def _window_on(screen: tuple[int, int], settings: Path, tmp_path: Path) -> dict:
    config = tmp_path / f"screen-{screen[0]}.json"
    w, h = screen
    config.write_text(json.dumps({"screens": [{"name": "s", "x": 0, "y": 0, "width": w, "height": h}]}))
    script = tmp_path / "window_size.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "QT_QPA_PLATFORM": f"offscreen:configfile={config}", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(script), str(settings)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["available"] == [0, 0, w, h]  # the screen really was the one asked for
    return res


def test_a_size_remembered_on_a_big_screen_is_shrunk_on_a_laptop(tmp_path):
    settings = tmp_path / "settings.ini"
    big = _window_on((1920, 1080), settings, tmp_path)
    assert tuple(big["size"]) == DEFAULT_SIZE  # remembered when the window closed
    small = _window_on((1280, 720), settings, tmp_path)
    assert tuple(small["size"]) == (1280 - FRAME_ALLOWANCE[0], 720 - FRAME_ALLOWANCE[1])
    assert _inside(small["frame"], small["available"])
