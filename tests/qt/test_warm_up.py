"""Importing torch holds the GIL for one long stretch even on a worker thread, so the window imports it
just after its panels are built, not in the first job that needs it (a calibration stalled the GUI
thread 1.6 s): after the start-up jobs torch is loaded, and at the first show it was not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
from PySide6.QtWidgets import QApplication
from studio.app import build_services
from studio.qt.main_window import MainWindow
from studio.qt.settings import AppSettings
from studio.qt.pages import CHILD_KERNELS

app = QApplication([sys.argv[0]])
win = MainWindow(build_services(), settings=AppSettings.from_file(sys.argv[1]))
win.show()
at_show = [m for m in ("torch", "transformers") if m in sys.modules]
end = time.monotonic() + 600  # a fresh clone compiles the kernels in the start-up child
while not (win.panels_ready and not win.jobs.busy) and time.monotonic() < end:
    app.processEvents()
    time.sleep(0.005)
titles = [j.title for j in win.jobs.history()]
warm = sys.modules.get("studio.core.quant.warm")
kernels = bool(warm and warm._done and warm.marker_path(CHILD_KERNELS).is_file())
import gc
t0 = time.thread_time()
gc.collect()
full_gc_s = time.thread_time() - t0
print(json.dumps({"frozen": gc.get_freeze_count(), "full_gc_s": full_gc_s, "at_show": at_show, "after": [m for m in ("torch", "transformers.modeling_utils") if m in sys.modules], "ready": win.panels_ready, "titles": titles, "kernels": kernels}))
win.close()
"""


def test_torch_is_imported_in_a_start_up_job_after_the_panels_not_before_the_window_shows(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "s.ini")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ready"] and report["at_show"] == []
    assert (
        report["after"] == ["torch", "transformers.modeling_utils"]
        and "Preparing torch and transformers" in report["titles"]
    )
    # the same job compiled the quantization kernels in a child (studio.core.quant.warm) and recorded it
    assert report["kernels"]
    # and froze the start-up heap: a full cycle collection (on whatever thread trips it, often the GUI
    # thread) walks only what came after, not torch's and transformers' ~250,000 objects (~150 ms)
    assert report["frozen"] > 100_000 and report["full_gc_s"] < 0.05, report
