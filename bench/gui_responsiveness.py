"""GUI responsiveness benchmark: the longest the GUI thread is blocked while any job of the window runs.

Builds (once, cached) a factory Llama checkpoint with about 500 MB of float32 weights, opens it in the
real main window (offscreen), and runs, one after the other:

1. idle (the reference: the same timer with nothing running),
2. the inspector's statistics of the largest weight matrix (selecting it, as a click in the tree does),
3. a calibration on the Calibrate page,
4. the budget dialog: its sensitivity scan (on the Calibrate page's importance matrix), then a user
   editing the budget (typing budgets and pressing Enter, dragging the slider) while it re-plans,
5. an export through the Export dialog for each preset asked (verification off unless ``--verify``),
6. an evaluation of those exports on the Evaluate page.

During each phase a 10 ms ``QTimer`` records the time between its ticks on the GUI thread; the worst
interval is how long the GUI was unresponsive. Prints the worst and 99th-percentile gap per phase,
the ratio to the idle reference measured in the same run, the most CPU time the GUI thread itself
spent between two ticks (work on the GUI thread, as opposed to the machine's load or a worker holding
the GIL), and the peak RSS. Then, for every stall over 100 ms, who ran in it: a watchdog thread reads
every thread's CPU clock (``/proc/self/task/*/schedstat``) and stack (``sys._current_frames()``) every
10 ms once a tick is 50 ms late, and the late tick itself reads them once more (a worker that holds the
GIL keeps the watchdog out too); each thread's CPU time is charged to where its stack was. A worker's
CPU while the GUI thread waits in the bench's own loop is that worker holding the GIL; a stall in which
the process itself barely ran is the machine's other processes.
Opening the model (a job) is a phase too; start-up includes the torch warm-up and the quantization
kernels' compile in a child process (``studio.qt.pages``, ``studio.core.quant.warm``).

    python bench/gui_responsiveness.py [--hidden 2048 --layers 2 --intermediate 8192]
        [--presets Q8_0,Q4_K_M] [--verify] [--model-dir DIR] [--skip calibrate,budget,export,evaluate]
        [--model CHECKPOINT]

The budget dialog keeps its scans in the CLI's scan cache: a second run on the same model reads its
scan back (seconds). For a real scan every time, give the run a fresh cache:
``QUANT_STUDIO_CACHE=$(mktemp -d) python bench/gui_responsiveness.py``. A fresh numba cache as well
(``NUMBA_CACHE_DIR=$(mktemp -d)``) is a first start after an install: the start-up job then compiles
every quantization kernel in its child (minutes on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TICK_MS = 10
BUDGET_MS = 100.0


SAMPLE_AFTER_MS = 50.0  # the watchdog samples every thread's stack once a tick is this late
SAMPLE_EVERY_S = 0.01
BASELINE_EVERY_S = 0.05  # how often the threads' CPU clocks are read while the GUI keeps time


def _site(frame) -> str:
    """The innermost frames of a thread's stack that are our code (studio/, bench/), else the top."""
    stack = traceback.extract_stack(frame)
    ours = [f for f in stack if "/studio/" in f.filename or "/bench/" in f.filename]
    top = stack[-1]
    where = ours[-1] if ours else top
    text = f"{Path(where.filename).name}:{where.lineno} {where.name}"
    if where is not top:
        text += f" → {Path(top.filename).name}:{top.lineno} {top.name}"
    return text


def _task_cpu() -> dict[int, float]:
    """CPU time (ms) of every native thread of this process, from /proc (precise, and safe for threads
    that end meanwhile): the thread that ran while the GUI thread waited is the one that held the GIL."""
    out: dict[int, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e6
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile, or no schedstat (then the stack samples still tell)
    return out


def _task_name(tid: int) -> str:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


class GapRecorder:
    """Records the intervals between the ticks of a ``TICK_MS`` timer on the GUI thread and, for each
    late interval, who ran meanwhile: a watchdog thread reads every thread's CPU clock (/proc) and
    stack (sys._current_frames()) and charges each thread's CPU time to where its stack was.

    A worker that holds the GIL in one long call keeps the watchdog out too; when it wakes, that worker's
    CPU since the last reading (taken at most ``BASELINE_EVERY_S`` before the stall) is charged to the
    line it stands on, just after the call: the culprit, with its milliseconds."""

    def __init__(self) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self._tick)
        self.gaps: list[float] = []
        self.cpu_gaps: list[float] = []
        self._last = self._last_cpu = 0.0
        self._gui = threading.get_ident()
        self._running = False
        # the current late interval: site → [CPU ms, samples]
        self._gap_sites: dict[str, list[float]] = {}
        self._gap_total = 0.0  # CPU ms of all the process's threads (but the watchdog) in it
        # per stall over BUDGET_MS: (gap ms, the process's CPU ms in it, [(site, CPU ms, samples)])
        self.sites: list[tuple[float, float, list[tuple[str, float, int]]]] = []
        self.history: list[list[tuple[float, float, list[tuple[str, float, int]]]]] = []
        self._lock = threading.Lock()
        self._base: dict[int, float] = {}
        self._base_at = 0.0
        self._watch_tid = 0
        threading.Thread(target=self._watch, daemon=True, name="gui-watchdog").start()

    def _watch(self) -> None:
        self._watch_tid = threading.get_native_id()
        with self._lock:
            self._base, self._base_at = _task_cpu(), time.perf_counter()
        while True:
            time.sleep(SAMPLE_EVERY_S)
            now = time.perf_counter()
            late = self._running and (now - self._last) * 1000.0 >= SAMPLE_AFTER_MS
            if late:
                self._sample(in_tick=False)
            elif now - self._base_at >= BASELINE_EVERY_S:
                cpu = _task_cpu()  # read outside the lock: the GUI thread's tick must never wait for /proc
                with self._lock:
                    self._base, self._base_at = cpu, now

    def _sample(self, in_tick: bool) -> None:
        """Charge each thread's CPU since the last reading to where its stack is now."""
        cpu = _task_cpu()  # read outside the lock: the GUI thread's tick must never wait for /proc
        frames = sys._current_frames()
        with self._lock:
            self._charge(cpu, frames, in_tick)

    def _charge(self, cpu: dict[int, float], frames: dict[int, Any], in_tick: bool) -> None:
        known = {t.ident: t for t in threading.enumerate()}
        native = {i: t.native_id for i, t in known.items()}
        gui_tid = native.get(self._gui) or threading.main_thread().native_id
        names = {t.native_id: t.name for t in known.values()}
        by_tid = {native[i]: f for i, f in frames.items() if native.get(i) is not None}
        # Python threads a pool started without a threading.Thread (no native id known here)
        unmapped = sorted({_site(f) for i, f in frames.items() if native.get(i) is None and i != self._gui})
        for tid, ms in cpu.items():
            spent = ms - self._base.get(tid, ms)
            if tid == self._watch_tid:
                continue  # the watchdog itself
            self._gap_total += max(0.0, spent)
            if spent < 1.0:
                continue  # threads that did not run
            frame = by_tid.get(tid)
            if tid == gui_tid:
                # read from the tick itself, the GUI thread's stack is the tick: its CPU is the interval's
                site = "[GUI] (work between the samples)" if in_tick else f"[GUI] {_site(frame)}"
            else:
                who = f"[{names.get(tid) or _task_name(tid)}]"
                if frame is not None:
                    site = f"{who} {_site(frame)}"
                elif unmapped:
                    site = f"{who} (one of: {' | '.join(unmapped)})"
                else:
                    site = f"{who} (no Python frame: native code)"
            entry = self._gap_sites.setdefault(site, [0.0, 0])
            entry[0] += spent
            entry[1] += 1
        self._base, self._base_at = cpu, time.perf_counter()

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        gap = (now - self._last) * 1000.0
        self.gaps.append(gap)
        # the GUI thread's own CPU time in the interval: a long gap of little CPU is the machine (other
        # processes, or a worker holding the GIL), a long gap of as much CPU is work on the GUI thread
        self.cpu_gaps.append((cpu - self._last_cpu) * 1000.0)
        self._last, self._last_cpu = now, cpu
        if gap > BUDGET_MS:
            # a worker that held the GIL kept the watchdog out too: what it ran is read here as well
            self._sample(in_tick=True)
        with self._lock:
            if gap > BUDGET_MS:
                top = sorted(self._gap_sites.items(), key=lambda kv: -kv[1][0])[:4]
                self.sites.append((gap, self._gap_total, [(site, spent, int(n)) for site, (spent, n) in top]))
            self._gap_sites, self._gap_total = {}, 0.0

    def start(self) -> None:
        self.gaps, self.cpu_gaps = [], []
        self.sites = []
        self._last, self._last_cpu = time.perf_counter(), time.thread_time()
        self._running = True
        self.timer.start()

    def stop(self) -> dict[str, float]:
        self.timer.stop()
        self._running = False
        self._tick()  # the interval until "now" counts too: a block at the very end would otherwise be missed
        self.history.append(sorted(self.sites, key=lambda s: -s[0]))  # one entry per phase, in order
        g = sorted(self.gaps)
        return {
            "worst_ms": g[-1],
            "worst_cpu_ms": max(self.cpu_gaps),
            "p99_ms": g[min(len(g) - 1, int(0.99 * len(g)))],
            "median_ms": statistics.median(g),
            "ticks": len(g),
        }


def _wait(app, cond, timeout_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        app.processEvents()
        time.sleep(0.001)
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _build_model(folder: Path, hidden: int, layers: int, intermediate: int) -> Path:
    from studio.core.factory import make_tiny_model

    marker = folder / f"h{hidden}-l{layers}-i{intermediate}"
    if (marker / "config.json").is_file():
        return marker
    print(
        f"building a factory model (hidden {hidden}, {layers} layers, intermediate {intermediate}) …",
        flush=True,
    )
    t0 = time.monotonic()
    make_tiny_model(marker, "llama", hidden=hidden, layers=layers, intermediate=intermediate, dtype="float32")
    print(f"  built in {time.monotonic() - t0:.0f} s", flush=True)
    return marker


def _budget_phases(app, win, rec) -> list[tuple[str, dict[str, float], float]]:
    """The budget dialog's scan, then edits: budgets typed with Enter, and slider moves, each re-planned."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    out = []
    dlg = win.show_budget_dialog()
    t0 = time.monotonic()
    rec.start()
    dlg.start_scan()
    _wait(app, lambda: dlg.scan is not None and not dlg.running and not dlg.planning, 3600, "the scan")
    how = "calibrated first" if dlg.calibrated else "on the Calibrate page's imatrix"
    out.append((f"budget dialog: scan ({how}) and first plan", rec.stop(), time.monotonic() - t0))
    t0 = time.monotonic()
    rec.start()
    for text in ("4.5bpw", "3.5bpw", "6bpw", "5bpw"):
        dlg.budget_edit.setFocus()
        dlg.budget_edit.selectAll()
        QTest.keyClicks(dlg.budget_edit, text)  # typed as a user types, one key at a time
        QTest.keyClick(dlg.budget_edit, Qt.Key.Key_Return)
        _wait(app, lambda: not dlg.planning, 600, f"the plan for {text}")
    n = len(dlg.front)
    for i in list(range(n // 2, n)) + list(range(n - 1, 0, -3)):  # a drag right, then back left
        dlg.slider.setValue(i)
        end = time.monotonic() + 0.03
        _wait(app, lambda end=end: time.monotonic() > end, 5, "the drag")
    _wait(app, lambda: not dlg.planning, 600, "the plan after the drag")
    out.append(("budget dialog: typing 4 budgets and dragging the slider", rec.stop(), time.monotonic() - t0))
    dlg.hide()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--presets", default="Q8_0,Q4_K_M", help="comma-separated presets to export")
    parser.add_argument("--verify", action="store_true", help="also verify each export (llama.cpp vs torch)")
    parser.add_argument("--idle-s", type=float, default=2.0, help="length of the idle reference phase")
    parser.add_argument("--calib-ctx", type=int, default=128, help="tokens per calibration chunk")
    parser.add_argument("--calib-chunks", type=int, default=4, help="calibration chunks")
    parser.add_argument("--eval-chunks", type=int, default=2, help="chunks the evaluation scores")
    parser.add_argument("--skip", default="", help="phases to leave out: calibrate,budget,export,evaluate")
    parser.add_argument(
        "--model-dir", default=str(Path(tempfile.gettempdir()) / "quant-studio-bench"), help="model cache"
    )
    parser.add_argument(
        "--model",
        default="",
        help="open this checkpoint instead of building one (e.g. bench/make_8b_fixture.py's)",
    )
    args = parser.parse_args()

    if args.model:
        model = Path(args.model)
    else:
        model = _build_model(Path(args.model_dir), args.hidden, args.layers, args.intermediate)

    from PySide6.QtWidgets import QApplication

    from studio.app import build_services, tune_interpreter
    from studio.qt.main_window import MainWindow
    from studio.qt.settings import AppSettings

    tune_interpreter()  # as studio.app.main does
    app = QApplication.instance() or QApplication([sys.argv[0]])
    with tempfile.TemporaryDirectory() as tmp:
        settings = AppSettings.from_file(str(Path(tmp) / "bench.ini"))
        win = MainWindow(build_services(), settings=settings)
        win.resize(1600, 1000)
        rec = GapRecorder()
        results: list[tuple[str, dict[str, float], float]] = []
        # 0. start-up: from the first show until every page's panel is built (imports run in a worker)
        t0 = time.monotonic()
        win.show()
        rec.start()
        # the start-up job compiles the quantization kernels in a child on a first run (minutes when busy)
        _wait(app, lambda: win.panels_ready and not win.jobs.busy, 1800, "the panels")
        results.append(("start-up: show → panels built [cold]", rec.stop(), time.monotonic() - t0))
        t0 = time.monotonic()
        rec.start()
        win.open_path(model)
        _wait(app, lambda: win.state.checkpoint is not None, 300, "the model to open")
        _wait(app, lambda: not win.jobs.busy, 120, "estimates")
        results.append(("open the model (and its estimates)", rec.stop(), time.monotonic() - t0))
        info = win.state.info
        weight_mb = info.weight_bytes / 1e6
        print(f"model: {model} — {weight_mb:.0f} MB of weights, {len(info.tensors)} tensors", flush=True)
        _wait(app, lambda: not win.jobs.busy, 120, "estimates")

        # 1. the reference: nothing running
        rec.start()
        t_end = time.monotonic() + args.idle_s
        _wait(app, lambda: time.monotonic() > t_end, args.idle_s + 5, "idle")
        results.append(("idle (reference)", rec.stop(), args.idle_s))

        # 2. statistics of the two largest matrices, computed in a worker and drawn by the inspector; the
        #    first one is "cold" (numba's one-time set-up runs in the worker and holds the GIL at times)
        win.show_page("inspector")
        app.processEvents()
        shown: list[str] = []
        win.panel("inspector").statsShown.connect(shown.append)
        bigs = sorted((t for t in info.tensors if len(t.shape) == 2), key=lambda t: -t.n_elements)[:2]
        for i, big in enumerate(bigs):
            t0 = time.monotonic()
            rec.start()
            win.state.select_tensor(big.name)
            _wait(app, lambda name=big.name: name in shown, 600, f"statistics of {big.name}")
            label = f"statistics of {big.name} ({big.n_elements / 1e6:.1f} M values)"
            results.append((label + (" [cold]" if i == 0 else ""), rec.stop(), time.monotonic() - t0))

        skip = {p.strip() for p in args.skip.split(",") if p.strip()}
        # 3. calibration on the Calibrate page
        if "calibrate" not in skip:
            win.show_page("calibrate")
            page = win.panel("calibrate")
            page.set_run(ctx=args.calib_ctx, chunks=args.calib_chunks)
            calibrated: list[object] = []
            page.calibrated.connect(calibrated.append)
            t0 = time.monotonic()
            rec.start()
            assert page.start() is not None, page.status.text()
            _wait(app, lambda: bool(calibrated) and not page.running, 3600, "the calibration")
            results.append(("calibrate (Calibrate page)", rec.stop(), time.monotonic() - t0))

        # 4. the budget dialog: its scan, then a user editing the budget while it re-plans
        if "budget" not in skip:
            results.extend(_budget_phases(app, win, rec))

        # 5. exports through the dialog
        exported: list[Path] = []
        for preset in [p.strip() for p in args.presets.split(",") if p.strip() and "export" not in skip]:
            dlg = win.show_export_dialog()
            dlg.set_plan_choice(preset)
            dlg.set_output_path(Path(tmp) / f"bench-{preset}.gguf")
            dlg.verify_check.setChecked(args.verify)
            done: list[object] = []
            dlg.exportFinished.connect(done.append)
            dlg.exportFailed.connect(done.append)
            t0 = time.monotonic()
            rec.start()
            job = dlg.start()
            assert job is not None, dlg.status.text()
            _wait(app, lambda done=done, job=job: bool(done) and not job.active, 3600, f"the {preset} export")
            stats = rec.stop()
            dlg.exportFinished.disconnect(done.append)
            dlg.exportFailed.disconnect(done.append)
            if isinstance(done[0], str):
                raise SystemExit(f"the {preset} export failed: {done[0]}")
            label = f"export {preset}" + (" + verify" if args.verify else "")
            results.append((label, stats, time.monotonic() - t0))
            exported.append(Path(tmp, f"bench-{preset}.gguf"))

        # 6. the evaluation of those exports
        if exported and "evaluate" not in skip:
            win.show_page("evaluate")
            ev = win.panel("evaluate")
            for path in exported:
                ev.add_variant(path)
            ev.ctx_spin.setValue(128)
            ev.chunks_spin.setValue(args.eval_chunks)
            reports: list[object] = []
            ev.reportShown.connect(reports.append)
            errors: list[str] = []
            ev.errorShown.connect(errors.append)
            t0 = time.monotonic()
            rec.start()
            assert ev.start(), ev.status.text()
            _wait(app, lambda: (bool(reports) or bool(errors)) and not ev.running, 3600, "the evaluation")
            if errors:
                raise SystemExit(f"the evaluation failed: {errors[0]}")
            results.append(
                (f"evaluate {len(exported)} exports (Evaluate page)", rec.stop(), time.monotonic() - t0)
            )
        for path in exported:
            path.unlink(missing_ok=True)
        win.close()

    ref = next(st["worst_ms"] for label, st, _t in results if label.startswith("idle"))
    print()
    print(f"{'phase':66s} {'seconds':>8s} {'worst gap':>10s} {'p99 gap':>9s} {'ratio':>7s} {'GUI CPU':>10s}")
    for label, s, secs in results:
        print(
            f"{label:66s} {secs:8.1f} {s['worst_ms']:8.1f} ms {s['p99_ms']:6.1f} ms {s['worst_ms'] / ref:7.2f}"
            f" {s['worst_cpu_ms']:7.1f} ms"
        )
    print(
        "(GUI CPU: the most CPU time the GUI thread itself spent between two ticks; a long gap with little "
        "CPU is the machine's load or a worker holding the GIL, not work on the GUI thread)"
    )
    working = [(label, st) for label, st, _t in results if not label.startswith("idle")]
    worst = max(st["worst_ms"] for _label, st in working)
    warm = max(st["worst_ms"] for label, st in working if "[cold]" not in label)
    stalled = [(label, sites) for (label, _s, _t), sites in zip(results, rec.history, strict=True) if sites]
    if stalled:
        print(
            f"\nwho ran during each stall over {BUDGET_MS:.0f} ms: each thread's CPU time in the stall, charged "
            f"to where its stack was (read every {SAMPLE_EVERY_S * 1000:.0f} ms once a tick is "
            f"{SAMPLE_AFTER_MS:.0f} ms late; ×samples). A worker's CPU while [GUI] waits in the bench's loop "
            "is a worker holding the GIL:"
        )
    for label, sites in stalled:
        print(f"  {label}:")
        for gap, total, top in sites[:8]:
            who = "; ".join(f"{site} {ms:.0f} ms CPU ×{n}" for site, ms, n in top) or "nothing sampled"
            load = "  ← little CPU here: the machine's other processes" if total < 0.3 * gap else ""
            print(f"    {gap:7.1f} ms, this process's CPU {total:5.0f} ms{load}: {who}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KiB on Linux → MB
    print(
        f"\nworst GUI-thread gap while working: {warm:.1f} ms (budget {BUDGET_MS:.0f} ms: "
        f"{'met' if warm <= BUDGET_MS else 'NOT met'}); including the cold phases (start-up, first statistics): {worst:.1f} ms; "
        f"idle reference {ref:.1f} ms"
    )
    print(f"weights: {weight_mb:.0f} MB; peak RSS: {peak:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
