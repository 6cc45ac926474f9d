#!/usr/bin/env bash
# The README screenshots of the Lab page under Xvfb, into resources/screenshots/:
#
#   lab-sweep.png    the bit-width sweep of one down projection: SNR against bits per weight, the cliff
#   lab-memory.png   the memory calculator for the open model at 32K tokens (Q8_0 KV cache), 8 GB card
#   lab-qat.png      QAT at 3 bits against PTQ: the training curve and the three held-out losses
#   budget-sensitivity.png  File → Budget plan…, Sensitivity: the heat map of layers × roles and the ranked bars
#   budget-front.png        the size/KL front after the budget plan was exported: measured beside predicted KL
#
#   packaging/screenshots_lab.sh [MODEL]   (a Hugging Face folder; default: the demo model)
#
# QAT_STEPS (default 12) and QAT_SEQ (tokens per chunk, default 128) size the QAT run; LAB_SHOTS (default "sweep memory qat") which to make. Needs what packaging/screenshots.sh needs.
# LAB_SHOTS=budget makes the Budget plan's: SCAN=scan.json (from `quant-studio-cli sensitivity MODEL -o
# scan.json`) and IMATRIX=imatrix.gguf skip the dialog's own scan (minutes on two cores); BUDGET (default
# 105454336, llama.cpp's Q4_K_M of SmolLM2) and EXCLUDE (default Q4_1,Q5_1) choose the plan, which is
# exported through File → Export GGUF (verified) and then measured.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=resources/screenshots
mkdir -p "$OUT"

if [ -z "${_QS_IN_XVFB:-}" ]; then
  export _QS_IN_XVFB=1
  exec xvfb-run -a -s "-screen 0 1600x1000x24" "$0" "$@"
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export QT_QPA_PLATFORM=xcb QUANT_STUDIO_CACHE="$WORK/cache"
export QT_STYLE_OVERRIDE=Fusion QT_QPA_PLATFORMTHEME= QT_FONT_DPI=96
export QS_SCAN="${SCAN:-}" QS_IMATRIX="${IMATRIX:-}" QS_BUDGET="${BUDGET:-105454336}" QS_EXCLUDE="${EXCLUDE:-Q4_1,Q5_1}"
export QS_WORK="$WORK" QS_OUT="$OUT" QS_MODEL="${1:-}" QS_QAT_STEPS="${QAT_STEPS:-12}" QS_QAT_SEQ="${QAT_SEQ:-128}" QS_SHOTS="${LAB_SHOTS:-sweep memory qat}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# A file, not stdin: the QAT child process is spawned from it.
cat >"$WORK/driver.py" <<'PYEOF'
"""Drive the real main window through the Lab page's tabs and capture each one."""

import os
import subprocess
import sys
import time
from pathlib import Path

WORK, OUT, MODEL = Path(os.environ["QS_WORK"]), Path(os.environ["QS_OUT"]), os.environ.get("QS_MODEL", "")
MAX_BYTES = 300_000
SHOTS = os.environ.get("QS_SHOTS", "sweep memory qat").split()


def main() -> int:
    sys.path.insert(0, os.getcwd())
    from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    QCoreApplication.setOrganizationName("QuantStudioScreenshots")
    app = QApplication([sys.argv[0]])
    from studio.app import build_services
    from studio.qt.main_window import MainWindow
    from studio.qt.settings import AppSettings

    win = MainWindow(build_services(), settings=AppSettings.from_file(str(WORK / "settings.ini")))
    win.resize(1600, 1000)
    win.showMaximized()

    # An event loop, not a processEvents() poll: PySide6 6.12 on Python 3.11 drops a reference to None
    # on every processEvents() call, and a poll of some minutes (QAT) aborts the process.
    def pump(seconds: float) -> None:
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()

    def wait(cond, what: str, timeout: float = 900) -> None:
        end = time.monotonic() + timeout
        loop = QEventLoop()
        timer = QTimer()
        timer.timeout.connect(lambda: loop.quit() if cond() or time.monotonic() > end else None)
        timer.start(50)
        if not cond():
            loop.exec()
        timer.stop()
        if not cond():
            raise SystemExit(f"screenshots: timed out waiting for {what}")

    def shot(name: str, settle: float = 1.0) -> None:
        pump(settle)
        raw = WORK / f"{name}.raw.png"
        subprocess.run(["import", "-window", "root", "-depth", "8", str(raw)], check=True)
        target = OUT / f"{name}.png"
        for colours in (192, 128, 96, 64):
            subprocess.run(["convert", str(raw), "-colors", str(colours), "-strip", f"PNG8:{target}"], check=True)
            if target.stat().st_size < MAX_BYTES:
                break
        print(f"{target}  {target.stat().st_size // 1000} KB", flush=True)

    wait(lambda: win.panels_ready, "the panels")
    if MODEL:
        win.open_path(MODEL)
    else:
        win.open_demo()
    wait(lambda: win.state.checkpoint is not None, "the model to open")
    for name in ("TensorDock", "JobsDock"):  # room for the charts
        dock = win.dock(name)
        if dock is not None:
            dock.hide()
    win.show_page("lab")
    lab = win.panel("lab")

    if "sweep" in SHOTS:
        sweep(win, lab, wait, shot)
    if "memory" in SHOTS:
        memory(lab, shot)
    if "qat" in SHOTS and not qat(lab, wait, shot):
        return 1
    if "budget" in SHOTS:
        budget(win, wait, shot)
    win.close()
    return 0


def sweep(win, lab, wait, shot) -> None:
    """The sweep tab after sweeping layer 0's down projection."""
    target = next(t.name for t in win.state.info.tensors if t.name.endswith("layers.0.mlp.down_proj.weight"))
    lab.show_tab("sweep")
    shown: list[object] = []
    lab.sweep.resultShown.connect(shown.append)
    lab.sweep.select_tensor(target)
    assert lab.sweep.start()
    wait(lambda: bool(shown), "the sweep")
    shot("lab-sweep")


def memory(lab, shot) -> None:
    """The memory tab: the open model at 32K tokens with a Q8_0 KV cache, against an 8 GB card."""
    lab.show_tab("memory")
    lab.memory.set_context(32768)
    lab.memory.set_kv_type("q8_0")
    lab.memory.set_card(8)
    shot("lab-memory")


def qat(lab, wait, shot) -> bool:
    """The QAT tab after 3 bits, groups of 32, a short fine-tune on the built-in prose (measured on the sample)."""
    lab.show_tab("qat")
    done: list[object] = []
    lab.qat.resultShown.connect(done.append)
    lab.qat.steps_spin.setValue(int(os.environ["QS_QAT_STEPS"]))
    lab.qat.seq_spin.setValue(int(os.environ["QS_QAT_SEQ"]))
    assert lab.qat.start(), "QAT needs a Hugging Face model folder"
    wait(lambda: bool(done) or not lab.qat.running, "QAT", 3600)
    if not done:
        print(f"screenshots: QAT failed: {lab.qat.status.text()}", file=sys.stderr)
        return False
    shot("lab-qat")
    return True


def budget(win, wait, shot) -> None:
    """The Budget plan dialog: the sensitivity views at Q4_K, then the front once the plan was exported and measured."""
    import json

    d = win.show_budget_dialog()
    d.resize(1500, 940)
    d.move(50, 30)
    d.exclude_edit.setText(os.environ["QS_EXCLUDE"])
    d.budget_edit.setText(os.environ["QS_BUDGET"])
    if os.environ.get("QS_SCAN"):
        from studio.core.calib.imatrix import read_imatrix
        from studio.core.calib.sensitivity import Sensitivity

        scan = Sensitivity.from_dict(json.loads(Path(os.environ["QS_SCAN"]).read_text(encoding="utf-8")))
        d.set_scan(scan, read_imatrix(os.environ["QS_IMATRIX"]) if os.environ.get("QS_IMATRIX") else None)
    else:
        d.start_scan()
        wait(lambda: d.scan is not None and not d.running, "the scan", 3600)
    d.replan()
    d.use_plan()
    d.views.setCurrentIndex(1)
    d.map_type.setCurrentIndex(d.map_type.findData("Q4_K"))
    d.raise_()
    shot("budget-sensitivity")
    exp = win.show_export_dialog()
    exp.set_plan_choice("__current_plan__")
    exp.set_output_path(WORK / "budget.gguf")
    measured: list[object] = []
    d.measuredShown.connect(measured.append)
    exp.start()
    wait(lambda: bool(measured), "the export and the measurement", 3600)
    exp.hide()
    print(d.measured_label.text(), flush=True)
    d.views.setCurrentIndex(0)
    d.raise_()
    d.activateWindow()
    shot("budget-front")


if __name__ == "__main__":
    sys.exit(main())
PYEOF

"$PY" "$WORK/driver.py"
