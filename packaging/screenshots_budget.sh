#!/usr/bin/env bash
# Screenshots of the Budget plan dialog in the real main window: the sensitivity heat map and ranked bars
# (budget-sensitivity.png), and the size/KL front after the budget plan was exported, with the measured KL
# beside the predicted one (budget-front.png).
#
#   packaging/screenshots_budget.sh [OUT_DIR]      (default: docs/screenshots)
#
# Opens the demo model (SmolLM2-135M-Instruct; MODEL=folder for another). SCAN=scan.json (written by
# `quant-studio-cli sensitivity MODEL -o scan.json`) and IMATRIX=imatrix.gguf skip the dialog's own scan;
# without them the dialog scans (minutes on two cores). BUDGET (default 105454336, the size of
# llama.cpp's Q4_K_M of SmolLM2) and EXCLUDE (default Q4_1,Q5_1) choose the plan, which is then exported
# through File → Export GGUF (verified) and measured. Runs under Xvfb when xvfb-run exists, else on Qt's
# offscreen platform. Needs the project's venv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-docs/screenshots}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT_DIR"
export QS_SHOT_OUT="$OUT_DIR" QS_SHOT_WORK="${QS_SHOT_WORK:-$(mktemp -d)}"

read -r -d '' SCRIPT <<'EOF' || true
import json, os, sys, time
from pathlib import Path

from PySide6.QtCore import QCoreApplication
from PySide6.QtWidgets import QApplication

out, work = Path(os.environ["QS_SHOT_OUT"]), Path(os.environ["QS_SHOT_WORK"])
QCoreApplication.setOrganizationName("QuantStudioScreenshots")
app = QApplication([sys.argv[0]])
from studio.app import build_services
from studio.qt.main_window import MainWindow
from studio.qt.settings import AppSettings

win = MainWindow(build_services(), settings=AppSettings.from_file(str(work / "settings.ini")))
win.resize(1500, 1000)
win.show()


def wait(cond, what, timeout=1800.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"screenshots: timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.01)


def shot(widget, name):
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)
    widget.grab().save(str(out / f"{name}.png"))
    print(out / f"{name}.png", flush=True)


wait(lambda: win.panels_ready, "the panels")
model = os.environ.get("MODEL")
win.open_path(model) if model else win.open_demo()
wait(lambda: win.state.checkpoint is not None, "the model to open")
d = win.show_budget_dialog()
d.resize(1400, 900)
d.exclude_edit.setText(os.environ.get("EXCLUDE", "Q4_1,Q5_1"))
d.budget_edit.setText(os.environ.get("BUDGET", "105454336"))
if os.environ.get("SCAN"):
    from studio.core.calib.imatrix import read_imatrix
    from studio.core.calib.sensitivity import Sensitivity

    scan = Sensitivity.from_dict(json.loads(Path(os.environ["SCAN"]).read_text(encoding="utf-8")))
    im = read_imatrix(os.environ["IMATRIX"]) if os.environ.get("IMATRIX") else None
    d.set_scan(scan, im)
else:
    d.start_scan()
    wait(lambda: d.scan is not None and not d.running, "the scan")
d.replan()
d.use_plan()
d.views.setCurrentIndex(1)
d.map_type.setCurrentIndex(d.map_type.findData("Q4_K"))
shot(d, "budget-sensitivity")

exp = win.show_export_dialog()
exp.set_plan_choice("__current_plan__")
exp.set_output_path(work / "budget.gguf")
measured = []
d.measuredShown.connect(measured.append)
exp.start()
wait(lambda: measured, "the export and the measurement")
exp.hide()
print(d.measured_label.text(), flush=True)
d.views.setCurrentIndex(0)
d.raise_()
shot(d, "budget-front")
win.close()
print("screenshots written to", out)
EOF

if command -v xvfb-run >/dev/null 2>&1; then
  xvfb-run -a -s "-screen 0 1600x1100x24" "$PY" -c "$SCRIPT"
else
  QT_QPA_PLATFORM=offscreen "$PY" -c "$SCRIPT"
fi
