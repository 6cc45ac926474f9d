"""The Calibrate page over a checkpoint truncated mid-run: the window stays open and shows one sentence
(issue 25). The page runs in a real child process with the offscreen platform: before the fix the
process died of SIGBUS (which would end pytest too)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.hostile_children import ROOT, TRUNCATE, child_env

GUI = (
    TRUNCATE
    + r"""
import json, sys
from PySide6.QtWidgets import QApplication
from PySide6.QtCore import QTimer
from studio.core.model import open_model
from studio.qt.jobs import JobManager
from studio.qt.panels.calibrate_panel import CalibratePanel
from studio.qt.state import StudioState

model, text = sys.argv[1], sys.argv[2]
app = QApplication([])
state, jobs = StudioState(), JobManager()
ckpt = open_model(model)
panel = CalibratePanel(state, jobs)
panel.resize(900, 600)
panel.show()
state.set_checkpoint(ckpt)
panel.set_text("text", text)
panel.set_run(ctx=64, chunks=2, device="cpu")
seen = {}

def finish():
    # measured before quit(), which closes the windows in Qt 6
    seen["visible"] = panel.isVisible()
    seen["run_enabled"] = panel.run_button.isEnabled()
    seen["status"] = panel.status.text()
    app.quit()

def on_error(msg):
    seen["error"] = msg
    QTimer.singleShot(300, finish)  # the window keeps running a little after the failure

panel.errorShown.connect(on_error)
panel.calibrated.connect(lambda _s: (seen.setdefault("calibrated", True), app.quit()))
QTimer.singleShot(240_000, app.quit)
panel.start()
app.exec()
print("RESULT " + json.dumps(seen), flush=True)
jobs.shutdown(10_000)
ckpt.close()
"""
)


def test_window_survives_a_checkpoint_truncated_during_calibration(tiny_models, tmp_path):
    from studio.core.factory import sample_text

    model = tmp_path / "model"
    shutil.copytree(tiny_models("llama"), model)
    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-c", GUI, str(model), str(text)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (res.returncode, res.stderr[-3000:])  # SIGBUS was -7
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
    seen = json.loads(line[len("RESULT ") :])
    assert "calibrated" not in seen
    assert "model.safetensors ended" in seen["error"] and "\n" not in seen["error"]
    assert seen["visible"] and seen["run_enabled"] and seen["status"] == seen["error"], seen
