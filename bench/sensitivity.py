"""Time of the sensitivity scan in proxy and exact mode, against one forward pass measured in the same run.

    python bench/sensitivity.py --model /work/tools/smollm2-f32 [--modes proxy,exact] [--out DIR]

Each mode runs in its own child process (so its peak RSS is its own), after the imatrix of the
built-in calibration text has been computed once (timed separately: the export needs it anyway).
The reference is one float32 forward pass of the whole model over 512 tokens in the same process.
Printed per mode: wall seconds, CPU seconds (user + system, which a loaded machine does not inflate)
and their ratio to the reference, the number of (tensor, type) pairs, and peak RSS. With ``--out``
the scans are written as JSON (``sensitivity-proxy.json``, ``sensitivity-exact.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import peak_mib  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def reference_forward(model: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one float32 forward pass over 512 tokens, best of 3."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, trust_remote_code=False).eval()
    ids = torch.randint(0, m.config.vocab_size, (1, 512))
    best = (float("inf"), float("inf"))
    with torch.no_grad():
        m(input_ids=ids)
        for _ in range(3):
            t0, c0 = time.perf_counter(), _cpu()
            m(input_ids=ids)
            best = min(best, (time.perf_counter() - t0, _cpu() - c0))
    return best


def warm_kernels() -> float:
    """Compile (or load from numba's cache) every quantization kernel once; returns the seconds it took.

    The first scan after an install pays this (about a minute on 2 cores, kept in numba's cache after
    that); it is timed on its own so that the scans are timed as every later run sees them.
    """
    import numpy as np

    from studio.core.calib.sensitivity import DEFAULT_TYPES, quantize_rows

    t0 = time.perf_counter()
    rows = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    for q in DEFAULT_TYPES:
        quantize_rows(rows, q, np.ones(512, dtype=np.float32))
    return time.perf_counter() - t0


def child(args: argparse.Namespace) -> None:
    import torch  # noqa: F401  (imported before the clock starts: the window and CLI have it loaded)
    import transformers  # noqa: F401

    from studio.core.calib.imatrix import read_imatrix
    from studio.core.calib.sensitivity import ScanSettings, scan_sensitivity

    warm_kernels()

    im = read_imatrix(args.imatrix)
    st = ScanSettings(exact=args.mode == "exact")
    t0, c0 = time.perf_counter(), _cpu()
    scan = scan_sensitivity(args.model, "builtin", st, imatrix=im)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    pairs = sum(len({c.effective for c in t.by_type.values()}) for t in scan.tensors)
    measured = sum(c.measured for t in scan.tensors for c in t.by_type.values())
    out = {
        "mode": args.mode,
        "wall": wall,
        "cpu": cpu,
        "pairs": pairs,
        "measured": measured,
        "rss": peak_mib(),
    }
    if scan.check is not None:
        out["check"] = {
            "median_abs_log_ratio": scan.check.median_abs_log_ratio,
            "spearman": scan.check.spearman,
        }
    if args.out:
        Path(args.out, f"sensitivity-{args.mode}.json").write_text(
            json.dumps(scan.to_dict()), encoding="utf-8"
        )
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/work/tools/smollm2-f32")
    ap.add_argument("--modes", default="proxy,exact")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--imatrix", default=None, help="an imatrix GGUF of the built-in text (skips calibrating)"
    )
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    import tempfile

    from studio.core.calib import calibrate, imatrix_from_stats, write_imatrix
    from studio.core.model import open_model

    tmp = Path(args.out or tempfile.mkdtemp(prefix="qs-bench-sens-"))
    tmp.mkdir(parents=True, exist_ok=True)
    im_path = Path(args.imatrix) if args.imatrix else tmp / "imatrix.gguf"
    cal = None
    if not args.imatrix:
        t0, c0 = time.perf_counter(), _cpu()
        stats = calibrate(args.model, "builtin", device="cpu", dtype="float32", histogram=False)
        with open_model(args.model) as ck:
            write_imatrix(imatrix_from_stats(stats, ck.info), im_path)
        cal = (time.perf_counter() - t0, _cpu() - c0, stats.n_chunks, stats.n_ctx)
    ref = reference_forward(args.model)
    jit = warm_kernels()
    print(f"model {args.model}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    print(f"quantization kernels compiled or loaded from numba's cache: {jit:.1f} s (once per install)")
    print(f"reference: one forward over 512 tokens: {ref[0]:.2f} s wall, {ref[1]:.2f} CPU s")
    if cal is not None:
        print(
            f"imatrix of the built-in text ({cal[2]} × {cal[3]} tokens): {cal[0]:.1f} s wall, {cal[1]:.1f} CPU s"
        )
    else:
        print(f"imatrix: {im_path} (given)")
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--child", "1", "--mode", mode, "--model", args.model]
        cmd += ["--imatrix", str(im_path)] + (["--out", str(tmp)] if args.out else [])
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
        line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{mode}: failed\n{res.stderr[-2000:]}")
            continue
        r = json.loads(line[7:])
        extra = f"; load average {os.getloadavg()[0]:.1f} after"
        if "check" in r:
            extra += f"; proxy vs exact on held-out pairs: median |ln ratio| {r['check']['median_abs_log_ratio']:.3f}"
            extra += f", rank correlation {r['check']['spearman']:.3f}"
        print(
            f"{mode:5s} scan: {r['wall']:.1f} s wall ({r['wall'] / ref[0]:.0f}× the forward), {r['cpu']:.1f} CPU s "
            f"({r['cpu'] / ref[1]:.0f}×; {r['cpu'] / 2:.0f} s on 2 idle cores), {r['pairs']} (tensor, type) pairs, "
            f"{r['measured']} measured, peak RSS {r['rss']:.0f} MiB{extra}"
        )


if __name__ == "__main__":
    main()
