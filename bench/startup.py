"""Start-up benchmark: from launching ``quant-studio`` to its window being shown.

Runs ``python -m studio.app --bench-startup`` (which prints a JSON line right after the first show and
quits) several times, next to a reference: a bare PySide6 QMainWindow shown by the same interpreter.
Prints the median times, their ratio, peak RSS, and whether any heavy module (torch, transformers,
llama_cpp, huggingface_hub) was imported before the window appeared.

    python bench/startup.py [--runs 5] [--platform offscreen|xcb]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

REFERENCE = r"""
import json, os, resource, sys, time
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication([])
w = QMainWindow(); w.resize(1400, 860); w.setWindowTitle("reference"); w.show()
def done():
    print(json.dumps({"shown_since_launch_s": time.time() - float(os.environ["QUANT_STUDIO_BENCH_T0"]),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "heavy_modules_loaded": []}), flush=True)
    app.quit()
QTimer.singleShot(0, done)
app.exec()
"""


def _run(cmd: list[str], env: dict[str, str]) -> dict:
    env = {**env, "QUANT_STUDIO_BENCH_T0": repr(time.time())}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--platform", default=os.environ.get("QT_QPA_PLATFORM", "offscreen"))
    args = parser.parse_args()

    env = {**os.environ, "QT_QPA_PLATFORM": args.platform}
    with tempfile.TemporaryDirectory() as tmp:
        app_cmd = [
            sys.executable,
            "-m",
            "studio.app",
            "--bench-startup",
            "--settings",
            str(Path(tmp) / "bench.ini"),
        ]
        ref_cmd = [sys.executable, "-c", REFERENCE]
        # One warm-up of each so the file cache is hot for both (the first launch after install is slower).
        _run(app_cmd, env)
        _run(ref_cmd, env)
        app_runs, ref_runs = [], []
        for _ in range(args.runs):
            app_runs.append(_run(app_cmd, env))
            ref_runs.append(_run(ref_cmd, env))

    app_t = statistics.median(r["shown_since_launch_s"] for r in app_runs)
    ref_t = statistics.median(r["shown_since_launch_s"] for r in ref_runs)
    heavy = sorted({m for r in app_runs for m in r["heavy_modules_loaded"]})
    print(f"platform: {args.platform}, runs: {args.runs}")
    print(
        f"quant-studio window shown after   {app_t * 1000:7.0f} ms (median; min {min(r['shown_since_launch_s'] for r in app_runs) * 1000:.0f} ms)"
    )
    print(f"bare PySide6 window shown after   {ref_t * 1000:7.0f} ms (reference)")
    print(f"ratio quant-studio / reference:   {app_t / ref_t:7.2f}")
    print(
        f"peak RSS at first show:           {max(r['peak_rss_mb'] for r in app_runs):7.0f} MB (reference {max(r['peak_rss_mb'] for r in ref_runs):.0f} MB)"
    )
    print(f"heavy modules before first show:  {', '.join(heavy) if heavy else 'none'}")
    print(f"target < 2 s: {'met' if app_t < 2.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
