"""Benchmark our block quantizers against llama.cpp's ggml_quantize_chunk at the same thread count.

    python bench/blocks.py [--types Q4_0,Q8_0] [--threads N] [--size 4096] [--repeat 3] [--imatrix]

For each type: ns/weight of ours and of the reference on the same size x size float32 matrix (the
reference runs over row chunks in a thread pool of the same size), the ratio ours/reference, whether
the bytes are identical, and the process's peak RSS after the type. On CUDA/MPS the torch path is
timed too (ns/weight, and whether its bytes equal the reference's).
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import accelerator, best, peak_mib, synced  # noqa: E402

from studio.core.quant import blocks  # noqa: E402
from studio.core.quant import reference as ref  # noqa: E402

ALL = [t for t in blocks.QTYPES if t != "F32"]


def _ref_quantize(x: np.ndarray, qtype: str, imatrix, threads: int) -> np.ndarray:
    rows, n = x.shape
    out = np.empty((rows, blocks.row_bytes(qtype, n)), dtype=np.uint8)
    step = max(1, (1 << 18) // n)

    def work(r0: int) -> None:
        r1 = min(rows, r0 + step)
        ref.ggml_quantize_into(x[r0:r1], qtype, out[r0:r1], imatrix)

    starts = range(0, rows, step)
    if threads == 1:
        for r0 in starts:
            work(r0)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, starts))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(ALL))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--imatrix", action="store_true", help="quantize with a random importance matrix")
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.size, args.size), dtype=np.float32)
    qw_needed = rng.random(args.size, dtype=np.float32) ** 2 * 4
    qw_all = qw_needed if args.imatrix else None
    nw = x.size
    dev = None if args.no_gpu else accelerator()
    xt = None
    if dev is not None:
        import torch

        xt = torch.from_numpy(x).to(dev)
    print(
        f"# {args.size}x{args.size} float32, threads={args.threads}, "
        f"imatrix={'yes' if qw_all is not None else 'only for the types that need one'}, "
        f"cpus={os.cpu_count()}" + (f", device={dev}" if dev is not None else "")
    )
    head = f"{'type':8} {'ours ns/w':>10} {'llama ns/w':>11} {'ratio':>7} {'exact':>6} {'peakRSS MiB':>12}"
    if dev is not None:
        head += f" {dev.type + ' ns/w':>12} {dev.type + ' exact':>11}"
    print(head)
    for t in types:
        qw = qw_all
        if qw is None and t in blocks.QTYPES and blocks.QTYPES[t].needs_imatrix:
            qw = qw_needed  # llama.cpp writes these types only with an importance matrix
        try:
            blocks.quantize(x[:8], t, None if qw is None else qw)  # compile / warm up
            _ref_quantize(x[:8], t, qw, 1)  # ggml builds its tables on first use
        except Exception as exc:  # noqa: BLE001 - a bench reports and moves on
            print(f"{t:8} unavailable: {exc}")
            continue
        t_ref, r = best(lambda t=t, qw=qw: _ref_quantize(x, t, qw, args.threads), args.repeat)
        t_our, o = best(lambda t=t, qw=qw: blocks.quantize(x, t, qw, threads=args.threads), args.repeat)
        exact = bool(np.array_equal(r, o))
        line = (
            f"{t:8} {t_our / nw * 1e9:10.2f} {t_ref / nw * 1e9:11.2f} {t_our / t_ref:7.2f} "
            f"{'yes' if exact else 'NO':>6} {peak_mib():12.0f}"
        )
        if dev is not None:
            on_dev = synced(lambda t=t, qw=qw: blocks.quantize(xt, t, qw), dev)
            try:
                on_dev()
                t_dev, g = best(on_dev, args.repeat)
                line += f" {t_dev / nw * 1e9:12.2f} {'yes' if np.array_equal(g, r) else 'NO':>11}"
            except Exception as exc:  # noqa: BLE001
                line += f" {'error: ' + str(exc)[:60]:>24}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
