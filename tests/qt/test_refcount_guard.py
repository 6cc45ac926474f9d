"""PySide6 6.12 drops a reference to None on every void call; studio.qt's guard keeps a long session alive."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CALLS = 120_000  # a long chat stream's worth of widget calls: more than None's own count at start-up
LOOP = f"""
from PySide6.QtWidgets import QApplication, QLabel
app = QApplication([])
label = QLabel()
for _ in range({CALLS}):
    label.setText("x")
    app.processEvents()
print("alive")
"""


def _run(prelude: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    return subprocess.run(
        [sys.executable, "-c", prelude + LOOP], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12 (PEP 683)")
def test_the_window_survives_many_qt_calls_that_drop_references_to_none():
    bare = _run("")
    if bare.returncode == 0:
        pytest.skip("this PySide6 keeps its references to None (the bug is fixed): nothing to guard")
    assert "deallocating" in bare.stderr  # the bug as it shows without the guard
    guarded = _run("import studio.qt\n")
    assert guarded.returncode == 0 and "alive" in guarded.stdout, guarded.stderr[-500:]
