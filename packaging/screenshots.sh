#!/usr/bin/env bash
# Reproduce the README screenshots under Xvfb, into resources/screenshots/:
#
#   main-window.png   the summary of the demo model, SmolLM2-135M-Instruct (presets, sizes, fit)
#   inspector.png     the inspector on the demo's first screen: a real outlier input channel
#   plan-editor.png   the per-layer precision plan editor with a mixed plan
#   export.png        the Export dialog with an export running (progress visible)
#   hub.png           the Hub panel: search results, model card and files (a local fake Hub, no network)
#   chat.png          the side-by-side chat: the original next to its Q2_K export (made in the Export
#                     dialog), the demo question, greedy; the Q2_K answer diverges, highlighted
#   evaluate.png      perplexity / KL divergence of Q8_0, Q4_K_M and Q2_K exports against the original
#
#   packaging/screenshots.sh [MODEL]     (default: the demo model, as `quant-studio --demo`)
#
# With --pages it shoots instead every page (and every tab inside a page, and the Budget plan dialog) at
# 1280×720 and at 1920×1080 into docs/screenshots/ (PAGE-WxH.png), after a short calibration, a Q2_K
# export and its evaluation so the pages have something to show, and prints each plot's height:
#
#   packaging/screenshots.sh --pages [MODEL]
#
# Needs: xvfb-run, ImageMagick's `import` and `convert` (Debian: apt-get install xvfb imagemagick
# libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1); openbox, if installed, draws the dialogs' title bars.
# Settings, caches and exports go to a throw-away folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=resources/screenshots
mkdir -p "$OUT"

PAGES=0
if [ "${1:-}" = "--pages" ]; then
  PAGES=1
  shift
  OUT=docs/screenshots
  mkdir -p "$OUT"
fi

if [ -z "${_QS_IN_XVFB:-}" ]; then
  export _QS_IN_XVFB=1
  [ "$PAGES" = 1 ] && set -- --pages "$@"
  exec xvfb-run -a -s "-screen 0 1920x1080x24" "$0" "$@"
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export QT_QPA_PLATFORM=xcb
# The demo is prepared from scratch in a throw-away cache, exactly as on a newcomer's first start.
export QUANT_STUDIO_CACHE="$WORK/cache"
# A neutral, reproducible look: Fusion style, no desktop theme, fixed font size.
export QT_STYLE_OVERRIDE=Fusion QT_QPA_PLATFORMTHEME= QT_FONT_DPI=96
export QS_WORK="$WORK" QS_OUT="$OUT" QS_MODEL="${1:-}" QS_PAGES="$PAGES"
export HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false

# The driver is a file (not stdin) so the llama.cpp child processes can be spawned from it.
cat >"$WORK/driver.py" <<'PYEOF'
"""Drive the real main window through the screens of the README and capture each one."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORK, OUT, MODEL = Path(os.environ["QS_WORK"]), Path(os.environ["QS_OUT"]), os.environ.get("QS_MODEL", "")
SIZE = (1600, 1000)
MAX_BYTES = 300_000
PAGE_SIZES = ((1280, 720), (1920, 1080))


def main() -> int:
    sys.path.insert(0, os.getcwd())
    # A local stand-in for the Hub (the one the tests use), so the Hub page has results offline.
    from tests.core.hub.fakehub import FakeHub

    hub = FakeHub().start()
    os.environ.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(WORK / "hf"),
        HF_HUB_CACHE=str(WORK / "hf" / "hub"),
        NO_PROXY="127.0.0.1,localhost",
    )
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "http_proxy", "https_proxy"):
        os.environ.pop(var, None)

    from PySide6.QtCore import QCoreApplication
    from PySide6.QtWidgets import QApplication

    QCoreApplication.setOrganizationName("QuantStudioScreenshots")
    app = QApplication([sys.argv[0]])
    from studio.app import build_services
    from studio.qt.main_window import MainWindow
    from studio.qt.settings import AppSettings

    settings = AppSettings.from_file(str(WORK / "settings.ini"))
    win = MainWindow(build_services(), settings=settings)
    win.resize(*SIZE)
    win.move(0, 0)
    win.showMaximized()  # fills the screen, with or without a window manager's title bar

    def pump(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)

    def wait(cond, what: str, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise SystemExit(f"screenshots: timed out waiting for {what}")
            app.processEvents()
            time.sleep(0.01)

    def shot(name: str, settle: float = 1.0, crop: tuple[int, int] | None = None) -> None:
        pump(settle)
        raw = WORK / f"{name}.raw.png"
        area = ["-crop", f"{crop[0]}x{crop[1]}+0+0", "+repage"] if crop else []
        subprocess.run(["import", "-window", "root", "-depth", "8", *area, str(raw)], check=True)
        target = OUT / f"{name}.png"
        # Palette-reduce so the PNG stays small without visible loss on flat UI colours.
        for colours in (192, 128, 96, 64):
            subprocess.run(["convert", str(raw), "-colors", str(colours), "-strip", f"PNG8:{target}"], check=True)
            if target.stat().st_size < MAX_BYTES:
                break
        print(f"{target}  {target.stat().st_size // 1000} KB", flush=True)

    wait(lambda: win.panels_ready, "the panels")
    shown: list[str] = []  # listening before the model opens: the demo selects its tensor at once
    win.panel("inspector").statsShown.connect(shown.append)
    if MODEL:
        win.open_path(MODEL)
    else:
        win.open_demo()
    wait(lambda: win.state.checkpoint is not None, "the model to open", 600)
    wait(lambda: bool(win.state.estimates), "the estimates")
    if os.environ.get("QS_PAGES") == "1":
        return every_page(app, win, shot, pump, wait, hub)
    win.show_page(0)  # the Summary (the demo itself opens on the Inspector, shot next)
    shot("main-window")

    # Inspector: a weight matrix with planted outlier input channels.
    factory = Path(win.state.info.path) / "quant_studio_factory.json"
    names = json.loads(factory.read_text())["outlier_tensors"] if factory.is_file() else []
    target = next((n for n in names if n.endswith("mlp.up_proj.weight")), names[0] if names else "")
    from studio.core.demo import DEMO_QUESTION, DEMO_TENSOR

    if not target and DEMO_TENSOR in {t.name for t in win.state.info.tensors}:
        target = DEMO_TENSOR  # the demo's first screen: a real outlier channel
    target = os.environ.get("SELECT", target) or win.state.info.tensors[0].name
    win.show_page("inspector")
    win.state.select_tensor(target)
    wait(lambda: target in shown, "the inspector's statistics")
    shot("inspector", 1.5)

    # Plan editor: Q4_K_M, first and last layer at Q8_0, a rule for the down projections.
    win.show_page("plan")
    editor = win.panel("plan")
    editor.apply_preset("Q4_K_M")
    editor.keep_first_last(1, "Q8_0")
    editor.regex_edit.setText(r"mlp\.down_proj")
    editor.regex_type.setCurrentText("Q6_K")
    editor.apply_regex(r"mlp\.down_proj", "Q6_K")
    editor.table.selectRow(1)
    shot("plan-editor")

    # A running export of that plan (progress bar moving, verification on), with the Jobs dock raised.
    win.dock("JobsDock").raise_()
    dlg = win.show_export_dialog()
    dlg.set_output_path(WORK / "demo-plan.gguf")
    pump(0.3)
    dlg.move(win.x() + (win.width() - dlg.width()) // 2, win.y() + 150)
    job = dlg.start()
    assert job is not None, dlg.status.text()
    wait(lambda: 250 <= dlg.progress.value() < 1000 or not job.active, "the export to get going", 600)
    shot("export", 0.3)
    job.cancel()
    wait(lambda: not job.active, "the export to stop", 300)
    dlg.hide()
    win.dock("TensorDock").raise_()

    # Hub: search, select the first result, wait for its card and files.
    win.show_page("hub")
    panel = win.panel("hub")
    panel.search_edit.setText("llama")
    panel.search()
    wait(lambda: panel.results.rowCount() > 0, "the Hub search")
    panel.results.selectRow(0)
    wait(lambda: panel.files.rowCount() > 0 and "loading" not in panel.title_label.text(), "the model card")
    shot("hub")

    # Chat: the original (transformers) next to its Q2_K export (llama.cpp), the same greedy prompt.
    if win.panel("chat") is not None:
        dlg = win.show_export_dialog()
        dlg.set_plan_choice("Q2_K")
        dlg.set_output_path(WORK / "demo-Q2_K.gguf")
        dlg.verify_check.setChecked(False)
        job = dlg.start()
        assert job is not None, dlg.status.text()
        wait(lambda: not job.active, "the Q2_K export", 600)
        dlg.hide()
        chat = win.panel("chat")
        win.show_page("chat")
        wait(lambda: len(chat.columns) >= 2, "the exported file to join the chat")
        chat.max_tokens.setValue(40)
        chat.prompt.setPlainText(DEMO_QUESTION)
        finished: list[object] = []
        chat.turnFinished.connect(finished.append)
        assert chat.send()
        wait(lambda: bool(finished), "the chat reply", 600)
        shot("chat", 1.0)

    # Evaluate: the original against Q8_0, Q4_K_M and Q2_K exports on the shipped sample text.
    if win.panel("evaluate") is not None:
        for preset in ("Q8_0", "Q4_K_M"):
            dlg = win.show_export_dialog()
            dlg.set_plan_choice(preset)
            dlg.set_output_path(WORK / f"demo-{preset}.gguf")
            dlg.verify_check.setChecked(False)
            job = dlg.start()
            assert job is not None, dlg.status.text()
            wait(lambda job=job: not job.active, f"the {preset} export", 600)
            dlg.hide()
        ev = win.panel("evaluate")
        win.show_page("evaluate")
        shown_reports: list[object] = []
        ev.reportShown.connect(shown_reports.append)
        ev.chunks_spin.setValue(4)
        if ev.start():
            wait(lambda: bool(shown_reports) or not ev.running, "the evaluation", 900)
            if shown_reports:
                # Room for the table and the plot: the bottom docks closed, the splitter halved.
                for name in ("TensorDock", "JobsDock"):
                    win.dock(name).hide()
                from PySide6.QtWidgets import QSplitter

                for sp in ev.findChildren(QSplitter):
                    sp.setSizes([1, 1])
                shot("evaluate", 1.0)
            else:
                print(f"screenshots: evaluation failed: {ev.status.text()}", file=sys.stderr)

    win.close()
    hub.stop()
    return 0


def every_page(app, win, shot, pump, wait, hub) -> int:
    """Every page and inner tab at 1280×720 and 1920×1080, with data: a calibration, a Q2_K export and its
    evaluation; the Budget plan dialog after a scan. Prints each visible plot's height."""
    from PySide6.QtWidgets import QTabWidget

    from studio.qt.fit import MIN_PLOT_HEIGHT, plot_heights

    info = win.state.info
    # something to show: activations (2 chunks), a Q2_K file, its evaluation, the outlier tensor
    cal = win.panel("calibrate")
    cal.set_run(ctx=128, chunks=2)
    done: list[object] = []
    cal.calibrated.connect(done.append)
    cal.start()
    wait(lambda: bool(done) and not cal.running, "the calibration", 900)
    dlg = win.show_export_dialog()
    dlg.set_plan_choice("Q2_K")
    dlg.set_output_path(WORK / "demo-Q2_K.gguf")
    dlg.verify_check.setChecked(False)
    job = dlg.start()
    assert job is not None, dlg.status.text()
    wait(lambda: not job.active, "the Q2_K export", 900)
    dlg.hide()
    ev = win.panel("evaluate")
    ev.ctx_spin.setValue(128)
    ev.chunks_spin.setValue(2)
    reports: list[object] = []
    ev.reportShown.connect(reports.append)
    if ev.start():
        wait(lambda: bool(reports) or not ev.running, "the evaluation", 900)
    from studio.core.demo import DEMO_TENSOR

    names = {t.name for t in info.tensors}
    target = DEMO_TENSOR if DEMO_TENSOR in names else next(t.name for t in info.tensors if len(t.shape) == 2)
    win.state.select_tensor(target)
    prev = win.panel("preview")
    prev.start()
    wait(lambda: not prev.running, "the preview", 300)
    ov = win.panel("overview")
    ov.start()
    wait(lambda: not ov.running, "the overview", 900)
    hp = win.panel("hub")
    hp.search_edit.setText("llama")
    hp.search()
    wait(lambda: hp.results.rowCount() > 0, "the Hub search")
    hp.results.selectRow(0)
    wait(lambda: hp.files.rowCount() > 0 and "loading" not in hp.title_label.text(), "the model card")
    budget = None
    if os.environ.get("QS_BUDGET", "1") == "1":
        budget = win.show_budget_dialog()
        budget.start_scan()
        wait(lambda: budget.scan is not None and not budget.running and not budget.planning, "the scan", 1800)
        budget.hide()
    small: list[str] = []
    keys = ["summary"] + [k for k in ("inspector", "preview", "overview", "plan", "hub", "chat", "evaluate", "calibrate", "lab")]
    for w, h in PAGE_SIZES:
        win.showNormal()
        win.setGeometry(0, 0, w, h)
        pump(0.5)
        win.fit_docks()
        for key in keys:
            win.show_page(0 if key == "summary" else key)
            panel = win.summary if key == "summary" else win.panel(key)
            tabs = [] if panel is None else [t for t in panel.findChildren(QTabWidget)]
            views = [(key, None, 0)] + [(f"{key}-{t.tabText(i).lower().replace(' ', '-')}", t, i) for t in tabs for i in range(t.count()) if i]
            for name, t, i in views:
                if t is not None:
                    t.setCurrentIndex(i)
                name = "".join(ch for ch in name if ch.isalnum() or ch in "-_")
                shot(f"{name}-{w}x{h}", 0.8, (w, h))
                for plot, height in plot_heights(win):
                    print(f"  {name} {w}x{h}: {plot} {height} px", flush=True)
                    if height < MIN_PLOT_HEIGHT:
                        small.append(f"{name} {w}x{h}: {plot} {height} px")
            for t in tabs:
                t.setCurrentIndex(0)
        if budget is not None:
            budget.show()
            budget.setGeometry(40, 40, min(1100, w - 80), min(760, h - 80))
            for i in range(budget.views.count()):
                budget.views.setCurrentIndex(i)
                shot(f"budget-{budget.views.tabText(i).split()[0].lower().replace('/', '-')}-{w}x{h}", 1.0, (w, h))
                for plot, height in plot_heights(budget):
                    print(f"  budget {w}x{h}: {plot} {height} px", flush=True)
                    if height < MIN_PLOT_HEIGHT:
                        small.append(f"budget {w}x{h}: {plot} {height} px")
            budget.hide()
    print("plots under the minimum height:", small or "none", flush=True)
    win.close()
    hub.stop()
    return 1 if small else 0


if __name__ == "__main__":
    sys.exit(main())
PYEOF

# Window decorations for the dialogs, when a small window manager is installed (optional).
if command -v openbox >/dev/null; then
  openbox --sm-disable >/dev/null 2>&1 &
  sleep 1
fi
"$PY" "$WORK/driver.py"
ls -l "$OUT"
