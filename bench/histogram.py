"""Histogram of a 100M-element float32 tensor: computed by studio.core and drawn by pyqtgraph (offscreen).

Prints the seconds for compute + draw (target < 1.5 s), numpy's own ``np.histogram`` on the same data
as the reference measured in this run (and the ratio), the full per-tensor statistics for context,
and the peak RSS.

    QT_QPA_PLATFORM=offscreen python bench/histogram.py [--elements 100000000] [--bins 256]

With ``--gui-latency`` it instead measures how long the GUI thread is ever blocked while the overview
panel computes the statistics of every tensor of a model with ~580 MB of weights (built once with the
factory under ``--model-dir``): a 5 ms QTimer records the largest gap between its ticks.

    QT_QPA_PLATFORM=offscreen python bench/histogram.py --gui-latency [--model-dir /tmp/qs-bench-llama500]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402


def _rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 1024 / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=100_000_000)
    ap.add_argument("--bins", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="best of N")
    ap.add_argument("--gui-latency", action="store_true", help="measure GUI-thread gaps during statistics")
    ap.add_argument("--model-dir", default="/tmp/qs-bench-llama500", help="where the ~580 MB model is cached")
    args = ap.parse_args()
    if args.gui_latency:
        return gui_latency(args.model_dir)

    import pyqtgraph as pg
    from PySide6.QtWidgets import QApplication

    from studio.core.stats.tensor_stats import _compiled_kernel, bin_edges, histogram, stats_of_array

    t0 = time.perf_counter()
    kernel = _compiled_kernel()  # once per process: numba import and the cached (or fresh) compile
    first_use = time.perf_counter() - t0
    app = QApplication.instance() or QApplication([])
    cols = 10_000 if args.elements % 10_000 == 0 else 1
    x = np.random.default_rng(0).standard_normal(args.elements, dtype=np.float32).reshape(-1, cols)
    x[:, 3 % cols] *= 40  # an outlier channel widens the range, as in real LLM weights
    rss_data = _rss_mb()

    pw = pg.PlotWidget()
    pw.resize(800, 400)
    pw.show()
    item = pw.getPlotItem().plot([0.0, 1.0], [0.0], stepMode="center", fillLevel=0, brush=(31, 111, 208, 80))
    app.processEvents()

    def ours() -> tuple[float, float]:
        t0 = time.perf_counter()
        lo, hi = float(x.min()), float(x.max())
        counts = histogram(x, args.bins, lo, hi)
        t1 = time.perf_counter()
        item.setData(bin_edges(args.bins, lo, hi), np.log10(1.0 + counts), stepMode="center", fillLevel=0)
        pw.grab()  # render the scene now, offscreen
        t2 = time.perf_counter()
        return t1 - t0, t2 - t0

    def reference() -> float:
        t0 = time.perf_counter()
        np.histogram(x, bins=args.bins, range=(float(x.min()), float(x.max())))
        return time.perf_counter() - t0

    best_compute = best_total = best_ref = float("inf")
    for _ in range(args.repeat):
        c, t = ours()
        best_compute, best_total = min(best_compute, c), min(best_total, t)
        best_ref = min(best_ref, reference())

    # Exactness check on a slice (the full comparison would double the run time).
    lo, hi = float(x.min()), float(x.max())
    part = x[: max(1, x.shape[0] // 20)]
    assert np.array_equal(
        histogram(part, args.bins, lo, hi), np.histogram(part, bins=bin_edges(args.bins, lo, hi))[0]
    )

    t0 = time.perf_counter()
    stats_of_array(x)
    full = time.perf_counter() - t0

    n = x.size
    print(f"elements: {n:,} float32 ({n * 4 / 1e9:.2f} GB), bins: {args.bins}, best of {args.repeat}")
    print(f"histogram computed (core):            {best_compute:.3f} s")
    print(
        f"histogram computed + drawn (pyqtgraph): {best_total:.3f} s   target < 1.5 s: {'PASS' if best_total < 1.5 else 'FAIL'}"
    )
    print(
        f"reference np.histogram (same data):   {best_ref:.3f} s   ratio ours/numpy: {best_compute / best_ref:.2f}"
    )
    print(f"full tensor statistics (2 passes):    {full:.3f} s")
    path = "numba kernel" if kernel is not None else "numpy fallback"
    print(
        f"first use in this process ({path} load): {first_use:.3f} s (once per app session, not per histogram)"
    )
    print(
        f"peak RSS: {_rss_mb():.0f} MB (of which the tensor itself: {n * 4 / 2**20:.0f} MB; after making it: {rss_data:.0f} MB)"
    )
    return 0


def gui_latency(model_dir: str) -> int:
    """Worst GUI-thread gap while the overview panel computes every tensor's statistics."""
    from pathlib import Path

    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication

    from studio.core.factory import make_tiny_model
    from studio.core.model import open_model
    from studio.core.stats.cache import StatsCache
    from studio.qt.jobs import JobManager
    from studio.qt.panels.inspector import InspectorPanel
    from studio.qt.panels.overview import OverviewPanel
    from studio.qt.state import StudioState

    path = Path(model_dir)
    if not path.exists():
        make_tiny_model(path, "llama", hidden=2048, layers=3, intermediate=5632, seed=0)
    app = QApplication.instance() or QApplication([])
    state, jobs = StudioState(), JobManager()
    cache = StatsCache()  # shared, as the main window should share one between the panels
    overview = OverviewPanel(state, jobs)
    inspector = InspectorPanel(state, jobs)
    overview.cache = inspector.cache = cache
    overview.show()
    inspector.show()
    ckpt = open_model(path)
    weights = ckpt.info.weight_bytes
    state.set_checkpoint(ckpt)

    def measure(label: str) -> None:
        clock = QElapsedTimer()
        gaps: list[int] = []
        last = [0]

        def tick() -> None:
            now = clock.elapsed()
            gaps.append(now - last[0])
            last[0] = now

        timer = QTimer()
        timer.setInterval(5)
        timer.timeout.connect(tick)
        done: list[object] = []
        conn = overview.overviewShown.connect(lambda _o: done.append(True))
        clock.start()
        timer.start()
        t0 = time.perf_counter()
        overview.start()
        while not done:
            app.processEvents()
            time.sleep(0.001)
        elapsed = time.perf_counter() - t0
        overview.overviewShown.disconnect(conn)
        # Then show the largest tensor in the inspector (its statistics are cached: drawing only).
        biggest = max(ckpt.info.tensors, key=lambda t: t.n_elements).name
        shown: list[str] = []
        conn2 = inspector.statsShown.connect(shown.append)
        state.select_tensor(biggest)
        while not shown:
            app.processEvents()
            time.sleep(0.001)
        for _ in range(20):  # let the last paint happen inside the measurement
            app.processEvents()
            time.sleep(0.005)
        timer.stop()
        inspector.statsShown.disconnect(conn2)
        state.select_tensor("")
        g = np.array(gaps[1:] or [0])
        print(
            f"{label}: statistics of all tensors in {elapsed:.2f} s; GUI thread: {g.size} ticks of a 5 ms timer, "
            f"worst gap {g.max()} ms, p99 {np.percentile(g, 99):.0f} ms (limit 100 ms: {'PASS' if g.max() <= 100 else 'FAIL'})"
        )

    print(f"model: {weights / 1e6:.0f} MB of weights, {len(ckpt.info.tensors)} tensors")
    measure("cold (first job loads numba in the worker)")
    cache.clear()
    measure("warm (kernels loaded, statistics recomputed)")
    jobs.shutdown(5000)
    ckpt.close()
    print(f"peak RSS: {_rss_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
