"""Composition root of the GUI: builds the real services, the settings and the window, and runs Qt.

``quant-studio [MODEL] [--demo]``. Only PySide6 and the thin Qt layer are imported before the window
shows; torch, transformers, llama_cpp and huggingface_hub are imported later, inside workers.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QStandardPaths, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

import studio
from studio.paths import data_dir
from studio.qt.icons import app_icon
from studio.qt.main_window import MainWindow
from studio.qt.services import real_services
from studio.qt.settings import AppSettings

ORGANIZATION = "QuantStudio"
DESKTOP_ID = "io.quantstudio.QuantStudio"  # packaging/linux/<DESKTOP_ID>.desktop
APPLICATION = "Quant Studio"
HEAVY_MODULES = ("torch", "transformers", "llama_cpp", "huggingface_hub")
BENCH_T0_ENV = "QUANT_STUDIO_BENCH_T0"  # wall-clock time (time.time()) at which the bench launched us

log = logging.getLogger("studio")


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the GUI."""
    parser = argparse.ArgumentParser(
        prog="quant-studio", description="Quant Studio: inspect, plan and quantize LLMs."
    )
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="a model folder, a GGUF file, a Hub id already in the local Hugging Face cache, or BENCH "
        "(the 1.5B bench model, once fetched by quant-studio-cli bench-model)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="open the demo model, SmolLM2-135M-Instruct (prepared once, offline afterwards)",
    )
    parser.add_argument(
        "--ctx", type=int, default=None, metavar="N", help="context length for the memory estimates"
    )
    parser.add_argument(
        "--settings", metavar="FILE", help="keep settings in this INI file instead of the user's settings"
    )
    parser.add_argument("--select", metavar="TENSOR", help="select this tensor once the model is open")
    parser.add_argument("--size", metavar="WxH", help="initial window size, e.g. 1600x1000 (screenshots)")
    # Benchmark hook: print a JSON line once the window has been shown, then quit.
    parser.add_argument("--bench-startup", action="store_true", help=argparse.SUPPRESS)
    # Packaging checks (packaging/check_wheel.sh, check_bundle.sh): print a JSON line once the window
    # is up and its model (--demo or MODEL) is open, then quit; exit status 1 if opening failed.
    parser.add_argument("--smoke-test", action="store_true", help=argparse.SUPPRESS)
    return parser


def build_services():  # -> studio.qt.services.Services
    """The real core services; their modules are imported on first use, in a worker."""
    return real_services()


def _configure_logging() -> Path | None:
    """Warnings to stderr; everything from INFO up to a rotating log file in the user's data folder."""
    root = logging.getLogger()
    if root.handlers:  # configured by the embedding process (tests)
        return None
    root.setLevel(logging.INFO)
    stderr = logging.StreamHandler()
    stderr.setLevel(logging.WARNING)
    stderr.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(stderr)
    folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppLocalDataLocation)
    if not folder:
        return None
    try:
        path = Path(folder) / "logs" / "quant-studio.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=2_000_000, backupCount=3, encoding="utf-8"
        )
    except OSError:
        return None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"))
    root.addHandler(handler)
    return path


def _bench_report(t_main: float) -> None:
    """Print one JSON line describing the start-up (for bench/startup.py)."""
    now = time.time()
    t0 = os.environ.get(BENCH_T0_ENV)
    report = {
        "shown_since_launch_s": (now - float(t0)) if t0 else None,
        "shown_since_main_s": time.perf_counter() - t_main,
        "heavy_modules_loaded": [m for m in HEAVY_MODULES if m in sys.modules],
        "torch_imported": "torch" in sys.modules,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,  # KiB on Linux
        "modules_loaded": len(sys.modules),
    }
    print(json.dumps(report), flush=True)


SMOKE_TIMEOUT_S = 600


def _arm_smoke_test(app, window, *, wait_for_model: bool) -> None:  # noqa: ANN001
    """Report (one JSON line on stdout) what an installed copy shows, then quit; see ``--smoke-test``."""
    reported: list[bool] = []

    def report(ok: bool, error: str = "") -> None:
        if reported:
            return
        reported.append(ok)
        info = window.state.info
        out = {
            "ok": ok,
            "title": window.windowTitle(),
            "model": str(info.path) if info is not None else None,
            "tensors": len(info.tensors) if info is not None else 0,
            "package": studio.__file__,
            "resources": str(data_dir("resources")),
            "icon": not app.windowIcon().isNull(),
            "error": error,
        }
        print(json.dumps(out), flush=True)
        app.exit(0 if ok else 1)

    def watch() -> None:
        # A failed open shows a message box: report its sentence instead of waiting for the timeout.
        box = QApplication.activeModalWidget()
        if isinstance(box, QMessageBox):
            report(False, box.text())

    class _Errors(logging.Handler):
        # An exception in a GUI callback is logged, not shown: without this the check would only
        # notice it at the timeout.
        def emit(self, record: logging.LogRecord) -> None:
            QTimer.singleShot(0, window, lambda: report(False, record.getMessage()))

    logging.getLogger("studio").addHandler(_Errors(logging.ERROR))
    if wait_for_model:
        window.state.modelOpened.connect(lambda _ckpt: QTimer.singleShot(0, lambda: report(True)))
        poll = QTimer(window)
        poll.timeout.connect(watch)
        poll.start(500)
    else:
        QTimer.singleShot(0, lambda: report(True))
    QTimer.singleShot(SMOKE_TIMEOUT_S * 1000, lambda: report(False, "timed out"))


GUI_SWITCH_INTERVAL = 0.001  # seconds a Python thread runs before it offers the GIL (Python's default: 0.005)


def tune_interpreter() -> None:
    """Let the GUI thread take the GIL from a busy worker within 1 ms, not 5: every Qt event the window
    handles in Python waits for it once per hand-over, and a 32-layer model's open (its estimates in a
    worker) stalled the window 127 ms against 101–111 ms with the shorter interval."""
    sys.setswitchinterval(GUI_SWITCH_INTERVAL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the GUI; returns the process exit status."""
    t_main = time.perf_counter()
    tune_interpreter()
    args, qt_args = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))

    QCoreApplication.setOrganizationName(ORGANIZATION)
    QCoreApplication.setApplicationName(APPLICATION)
    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    QApplication.setDesktopFileName(DESKTOP_ID)  # Wayland matches the window to this .desktop entry
    app.setWindowIcon(app_icon())
    _configure_logging()

    settings = AppSettings.from_file(args.settings) if args.settings else AppSettings()
    window = MainWindow(build_services(), settings=settings)
    if args.ctx:
        window.state.set_context_length(args.ctx)
    if args.size:
        w, _, h = args.size.lower().partition("x")
        window.resize(int(w), int(h))
    app.aboutToQuit.connect(window.shutdown)
    window.show()

    if args.smoke_test:
        _arm_smoke_test(app, window, wait_for_model=bool(args.demo or args.model))
    if args.bench_startup:
        # Runs once the event loop has processed the show and first paint.
        def finish() -> None:
            _bench_report(t_main)
            window.close()
            app.quit()

        QTimer.singleShot(0, finish)
    elif args.demo:
        window.open_demo()
    elif args.model:
        window.open_path(args.model)
    if args.select:
        name = args.select

        def select_once(_checkpoint: object) -> None:
            window.state.modelOpened.disconnect(select_once)
            window.state.select_tensor(name)

        window.state.modelOpened.connect(select_once)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
