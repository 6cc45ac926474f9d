#!/usr/bin/env bash
# Screenshots of the inspector, the plan editor and a running export (with the jobs panel), for the README.
#
#   packaging/screenshots_panels.sh [OUT_DIR]        (default: docs/screenshots)
#
# Runs under Xvfb when xvfb-run exists (real X11 rendering), else on Qt's offscreen platform.
# Builds a small factory model with planted outlier channels (cached in $QS_SHOT_MODELS, default
# /tmp/qs-screenshot-models) so the plots show something worth seeing. Needs the project's venv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-docs/screenshots}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT_DIR"
export QS_SHOT_OUT="$OUT_DIR"
export QS_SHOT_MODELS="${QS_SHOT_MODELS:-/tmp/qs-screenshot-models}"

read -r -d '' SCRIPT <<'EOF' || true
import os, sys, time
from pathlib import Path

from PySide6.QtWidgets import QApplication, QMainWindow, QDockWidget, QTabWidget
from PySide6.QtCore import Qt

from studio.core.factory import make_tiny_model
from studio.core.model import open_model
from studio.core.stats.cache import StatsCache
from studio.qt.jobs import JobManager
from studio.qt.state import StudioState
from studio.qt.panels.inspector import InspectorPanel
from studio.qt.panels.overview import OverviewPanel
from studio.qt.panels.preview import PreviewPanel
from studio.qt.panels.plan_editor import PlanEditorPanel
from studio.qt.panels.jobs_panel import JobsPanel
from studio.qt.panels.device_selector import DeviceSelector

out = Path(os.environ["QS_SHOT_OUT"])
models = Path(os.environ["QS_SHOT_MODELS"])
model = models / "llama-512x4"
if not model.exists():
    make_tiny_model(model, "llama", hidden=512, layers=4, outliers=True, seed=1)

app = QApplication.instance() or QApplication(sys.argv)
state, jobs, cache = StudioState(), JobManager(), StatsCache()
try:
    from studio.core.hardware import detect
    state.set_hardware(detect(probe_torch=False))
except Exception:
    pass

win = QMainWindow()
win.setWindowTitle("Quant Studio — llama-512x4")
tabs = QTabWidget()
inspector = InspectorPanel(state, jobs)
overview = OverviewPanel(state, jobs)
inspector.cache = overview.cache = cache
preview = PreviewPanel(state, jobs)
plan = PlanEditorPanel(state, jobs)
tabs.addTab(inspector, "Inspector")
tabs.addTab(overview, "Overview")
tabs.addTab(preview, "Preview")
tabs.addTab(plan, "Plan")
win.setCentralWidget(tabs)
dock = QDockWidget("Jobs")
jobs_panel = JobsPanel(state, jobs)
dock.setWidget(jobs_panel)
win.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, dock)
dev = QDockWidget("Device")
dev.setWidget(DeviceSelector(state, jobs))
win.addDockWidget(Qt.DockWidgetArea.TopDockWidgetArea, dev)
win.resize(1400, 950)
win.show()

def pump(cond, timeout=120.0):
    t0 = time.monotonic()
    while not cond():
        app.processEvents()
        time.sleep(0.005)
        if time.monotonic() - t0 > timeout:
            raise SystemExit("timed out waiting for the GUI")
    for _ in range(30):
        app.processEvents()
        time.sleep(0.005)

ckpt = open_model(model)
state.set_checkpoint(ckpt)
name = next(t.name for t in ckpt.info.tensors if t.name.endswith("layers.1.self_attn.q_proj.weight"))
shown = []
inspector.statsShown.connect(shown.append)
state.select_tensor(name)
pump(lambda: shown)
win.grab().save(str(out / "inspector.png"))

done = []
overview.overviewShown.connect(done.append)
tabs.setCurrentWidget(overview)
overview.start()
pump(lambda: done)
win.grab().save(str(out / "overview.png"))

tabs.setCurrentWidget(preview)
got = []
preview.previewShown.connect(got.append)
preview.set_qtype("Q4_K")
preview.start()
pump(lambda: got)
win.grab().save(str(out / "preview.png"))

tabs.setCurrentWidget(plan)
plan.apply_preset("Q4_K_M")
plan.keep_first_last(1, "Q8_0")
plan.apply_regex(r"mlp\.down_proj", "Q6_K")
pump(lambda: True)
win.grab().save(str(out / "plan_editor.png"))

# A running export (a bigger model, so it runs long enough to be caught), then cancelled.
from studio.core.export.run import export_gguf
big = models / "llama-1024x6"
if not big.exists():
    make_tiny_model(big, "llama", hidden=1024, layers=6, intermediate=2816, seed=2)
big_ckpt = open_model(big)
state.set_checkpoint(big_ckpt)
plan.keep_first_last(1, "Q8_0")
target = models / "shot.gguf"
job = jobs.submit(
    "Export llama-1024x6 → shot.gguf (Q4_K_M, first/last layer Q8_0)",
    lambda ctx, p=plan.plan: export_gguf(big, target, p, ctx=ctx),
    kind="export",
    confirm_on_quit=True,
)
jobs_panel.tree.setCurrentItem(jobs_panel.row_of(job))
pump(lambda: (job.total and job.done / job.total >= 0.3) or not job.active, timeout=600)
win.grab().save(str(out / "export_running.png"))
job.cancel()
pump(lambda: not job.active)
jobs.shutdown(10_000)
big_ckpt.close()
print("screenshots written to", out)
EOF

if command -v xvfb-run >/dev/null 2>&1; then
  xvfb-run -a -s "-screen 0 1600x1000x24" "$PY" -c "$SCRIPT"
else
  QT_QPA_PLATFORM=offscreen "$PY" -c "$SCRIPT"
fi
