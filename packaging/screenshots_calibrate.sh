#!/usr/bin/env bash
# Screenshots of the calibration views in the real main window: the Calibrate page (outlier features,
# AWQ saliency, SmoothQuant), the Inspector's activation row and the Overview's outlier counts.
#
#   packaging/screenshots_calibrate.sh [OUT_DIR]      (default: docs/screenshots)
#
# Opens the demo model (SmolLM2-135M-Instruct; MODEL=folder for another), calibrates it on the
# built-in text (CTX tokens × CHUNKS, default 256 × 4) and writes calibrate-*.png plus
# calibrate-outliers.txt (the largest outlier features found). Runs under Xvfb when xvfb-run exists,
# else on Qt's offscreen platform. Needs the project's venv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-docs/screenshots}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT_DIR"
export QS_SHOT_OUT="$OUT_DIR" QS_SHOT_WORK="${QS_SHOT_WORK:-$(mktemp -d)}"

read -r -d '' SCRIPT <<'EOF' || true
import os, sys, time
from pathlib import Path

from PySide6.QtCore import QCoreApplication
from PySide6.QtWidgets import QApplication

out, work = Path(os.environ["QS_SHOT_OUT"]), Path(os.environ["QS_SHOT_WORK"])
QCoreApplication.setOrganizationName("QuantStudioScreenshots")
app = QApplication([sys.argv[0]])
from studio.app import build_services
from studio.core.calib.analysis import layer_outlier_counts, top_outlier_features
from studio.core.demo import DEMO_TENSOR
from studio.qt.main_window import MainWindow
from studio.qt.settings import AppSettings

win = MainWindow(build_services(), settings=AppSettings.from_file(str(work / "settings.ini")))
win.resize(1500, 1000)
win.show()


def wait(cond, what, timeout=900.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"screenshots: timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.01)


def shot(name):
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)
    win.grab().save(str(out / f"{name}.png"))
    print(out / f"{name}.png", flush=True)


wait(lambda: win.panels_ready, "the panels")
model = os.environ.get("MODEL")
win.open_path(model) if model else win.open_demo()
wait(lambda: win.state.checkpoint is not None, "the model to open")
cal = win.panel("calibrate")
win.show_page("calibrate")
cal.set_text("builtin")
cal.set_run(ctx=int(os.environ.get("CTX", 256)), chunks=int(os.environ.get("CHUNKS", 4)), device="cpu")
done, views = [], []
cal.calibrated.connect(done.append)
cal.viewsShown.connect(views.append)  # before the run: its end draws the views of the selected weight
cal.start()
wait(lambda: done, "the calibration")
stats = done[0]
with open(out / "calibrate-outliers.txt", "w", encoding="utf-8") as f:
    print(cal.summary.text(), file=f)
    for r in top_outlier_features(stats, limit=25):
        print(f"layer {r.layer} {r.site} channel {r.channel}: max|x| {r.absmax:.3f} ({r.ratio:.1f} x median)", file=f)
    for lo in layer_outlier_counts(stats):
        print(f"layer {lo.layer}: {lo.n_features} features {lo.channels[:10]} max|x| {lo.max_absmax:.3f}", file=f)
shot("calibrate-outliers")

names = {t.name for t in win.state.info.tensors}
target = os.environ.get("SELECT") or (DEMO_TENSOR if DEMO_TENSOR in names else stats.sites[0].name)
win.state.select_tensor(target)
wait(lambda: target in views, "the AWQ and SmoothQuant views")
cal.views.setCurrentWidget(cal.saliency)
shot("calibrate-awq")
cal.views.setCurrentWidget(cal.smooth)
cal.smooth.set_alpha(0.5)
shot("calibrate-smoothquant")

insp = win.panel("inspector")
win.show_page("inspector")
wait(lambda: insp.stats is not None and insp.stats.name == target and insp.profile is not None, "the inspector")
shot("calibrate-inspector")

ov = win.panel("overview")
win.show_page("overview")
shown = []
ov.overviewShown.connect(shown.append)
ov.start()
wait(lambda: shown, "the overview")
shot("calibrate-overview")
win.close()
print("screenshots written to", out)
EOF

if command -v xvfb-run >/dev/null 2>&1; then
  xvfb-run -a -s "-screen 0 1600x1100x24" "$PY" -c "$SCRIPT"
else
  QT_QPA_PLATFORM=offscreen "$PY" -c "$SCRIPT"
fi
