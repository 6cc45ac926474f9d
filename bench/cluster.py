"""The exact sensitivity scan in process and through a local Ray cluster of 1 and of 2 workers, in one run.

    python bench/cluster.py --model /path/to/smollm2-f32 [--types Q4_0,Q8_0] [--scan-ctx 128]
                            [--scan-chunks 2] [--calib-chunks 4]

The imatrix is computed once first (the scan needs it; not timed). Then the same exact scan runs
(1) in this process on one thread (what one Ray worker gets: one CPU), (2) in this process on every
thread, (3) through ``--cluster local:1`` and (4) through ``--cluster local:2``; each cluster is
started before its scan and shut down after it, and its start-up (Ray's processes, then one warm-up
task per worker that imports torch and the scan's unit code, which a long-lived cluster pays once) is
printed apart from the scan's time. Printed per run: wall seconds, the KL agreement with run (1), and for the cluster runs the
peak RSS of each worker process and of this (head) process, and the seconds of work per
stream-layer (a (tensor, type) pair carried through one decoder layer), from which the README's
estimate for a 70B model is worked out. ``uptime``'s load is printed before and after: on a shared
machine the walls mean little without it. The default types are a subset (2 of the scan's 12) so
that the four scans fit a loaded machine; ``--types all`` runs the full exact scan.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import peak_mib  # noqa: E402


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


def stream_layers(scan, n_layers: int) -> int:
    """Pairs × decoder layers each pair's stream goes through (plus the head) in an exact scan."""
    n = 0
    for t in scan.tensors:
        k = len({c.effective for c in t.by_type.values()})
        start = 0 if t.layer is None else t.layer
        n += k * ((n_layers - start + 1) if t.gguf_name != "output.weight" else 1)
    return n


def max_rel(a, b) -> float:
    worst = 0.0
    for x, y in zip(a.tensors, b.tensors, strict=True):
        for q, c in x.by_type.items():
            d = abs(y.by_type[q].kl - c.kl) / max(abs(c.kl), 1e-30)
            worst = max(worst, d)
    return worst


def warm(_i: int) -> int:
    """One worker's imports (torch, transformers, the scan's unit code), as a long-lived cluster has them."""
    import transformers  # noqa: F401

    import studio.core.cluster.scan  # noqa: F401

    time.sleep(1.0)  # long enough that every worker takes one
    return os.getpid()


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default="Q4_0,Q8_0", help="candidate types, or 'all' (the scan's 12)")
    ap.add_argument("--scan-ctx", type=int, default=128)
    ap.add_argument("--scan-chunks", type=int, default=2)
    ap.add_argument("--calib-chunks", type=int, default=4)
    args = ap.parse_args()

    import torch

    from studio.core.calib import calibrate, imatrix_from_stats
    from studio.core.calib.sensitivity import DEFAULT_TYPES, ScanSettings, scan_sensitivity
    from studio.core.cluster import open_executor
    from studio.core.jobs import JobContext
    from studio.core.model import open_model

    types = DEFAULT_TYPES if args.types == "all" else tuple(t.strip().upper() for t in args.types.split(","))
    st = ScanSettings(
        types=types,
        exact=True,
        n_ctx=args.scan_ctx,
        n_chunks=args.scan_chunks,
        calib_chunks=args.calib_chunks,
    )
    print(f"load before: {uptime()}", flush=True)
    print(f"model {args.model}; exact scan of {len(types)} types ({','.join(types)}), "
          f"{args.scan_chunks} × {args.scan_ctx} tokens; {os.cpu_count()} CPUs")  # fmt: skip
    with open_model(args.model) as ck:
        info = ck.info
    n_layers = int(info.n_layers or 0)
    stats = calibrate(
        args.model, "builtin", n_chunks=args.calib_chunks, device="cpu", dtype="float32", histogram=False
    )
    im = imatrix_from_stats(stats, info)
    # the kernels compile (or load from numba's cache) outside the timed runs
    import numpy as np

    from studio.core.calib.sensitivity import quantize_rows

    for q in types:
        quantize_rows(np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32), q, None)

    rows = []

    def show(name, wall, started, scan, logs) -> None:
        rows.append((name, wall, started, scan, logs))
        note = next((m for m in logs if "peak memory per worker" in m), "")
        print(f"{name:24} {wall:8.1f} s  cluster start {started:5.1f} s  max rel KL diff "
              f"{max_rel(rows[0][3], scan):.2e}  {note}", flush=True)  # fmt: skip

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ref = scan_sensitivity(args.model, "builtin", st, imatrix=im)
    show("in process, 1 thread", time.perf_counter() - t0, 0.0, ref, [])
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    full = scan_sensitivity(args.model, "builtin", st, imatrix=im)
    show(f"in process, {threads} threads", time.perf_counter() - t0, 0.0, full, [])
    for n in (1, 2):
        t0 = time.perf_counter()
        ex = open_executor(f"local:{n}")
        from studio.core.executor import Unit

        pids = {pid for _, pid in ex.run(warm, [Unit((i,)) for i in range(n)])}
        started = time.perf_counter() - t0
        print(f"local:{n}: {len(pids)} worker process{'es' * (len(pids) != 1)} warm", flush=True)
        logs: list[str] = []
        try:
            t0 = time.perf_counter()
            got = scan_sensitivity(
                args.model, "builtin", st, imatrix=im, executor=ex, ctx=JobContext(on_log=logs.append)
            )
            show(f"Ray local:{n}", time.perf_counter() - t0, started, got, logs)
        finally:
            ex.close()
    sl = stream_layers(ref, n_layers)
    pairs = sum(len(t.by_type) for t in ref.tensors)
    print(f"{pairs} pairs, {sl} stream-layers")
    base1, r1, r2 = rows[0][1], rows[2][1], rows[3][1]
    print(f"Ray 1 worker / in process ({threads} threads): {r1 / rows[1][1]:.2f}×  (for reference)")
    print(f"in process, 1 thread: {base1 / sl * 1e3:.2f} ms per stream-layer "
          f"({args.scan_chunks * args.scan_ctx} tokens; the README's 70B estimate scales this)")  # fmt: skip
    print(f"head peak RSS: {peak_mib():.0f} MiB")
    print(f"load after: {uptime()}")
    over, speed = r1 / base1, r1 / r2
    print("== goals (issue 27; meaningful only on an otherwise idle machine) ==")
    print(
        f"Ray overhead, 1 worker / in process on 1 thread: {over:.2f}×  goal ≤ 1.15×  {verdict(over <= 1.15)}"
    )
    print(
        f"speed-up, 2 workers over 1 worker:             {speed:.2f}×  goal ≥ 1.70×  {verdict(speed >= 1.7)}"
    )


if __name__ == "__main__":
    main()
