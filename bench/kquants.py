"""Benchmark the K-quant kernels alone against llama.cpp's ggml_quantize_chunk, single-threaded.

    python bench/kquants.py [--types Q4_K,Q6_K] [--rows 4096] [--cols 4096] [--repeat 1]
                            [--imatrix] [--torch]

For each type: the one-off numba compile (or cache load) time, ns/weight of ours and of the
reference on the same rows x cols float32 Gaussian matrix in one thread, the ratio ours/reference,
whether the bytes are identical, and the process's peak RSS. ``--torch`` also times the torch
path on CPU (on a 1/16 slice: it is meant for GPUs) and on CUDA when one is present.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import best, peak_mib, synced  # noqa: E402

from studio.core.quant import kquants  # noqa: E402
from studio.core.quant import reference as ref  # noqa: E402


def _torch_rows(x, qtype, qw, device):
    import torch

    from studio.core.quant import kquants_torch

    xt = torch.from_numpy(x).to(device)
    qt = None if qw is None else torch.from_numpy(qw).to(device)

    run = synced(lambda: kquants_torch.quantize_rows_torch(xt, qtype, qt).cpu().numpy(), device)

    run()  # warm-up (allocator, kernels)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(kquants.KQUANT_TYPES))
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--imatrix", action="store_true", help="also time with a random importance matrix")
    ap.add_argument("--torch", action="store_true", help="also time the torch path (CPU slice, CUDA)")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols), dtype=np.float32)
    qws = [None] + ([(rng.random(args.cols, dtype=np.float32) ** 2 * 4 + 1e-3)] if args.imatrix else [])
    n = x.size
    print(f"matrix {args.rows}x{args.cols} float32, 1 thread, best of {args.repeat}")
    print(
        f"{'type':6} {'imatrix':7} {'compile_s':>9} {'ours_ns/w':>9} {'ggml_ns/w':>9} {'ratio':>6} {'same':>5} {'rss_MiB':>8}"
    )
    for qtype in args.types.split(","):
        for qw in qws:
            t0 = time.perf_counter()
            kquants.quantize_rows(x[:1], qtype, qw)  # compile or load from numba's cache
            compile_s = time.perf_counter() - t0
            t_ours, ours = best(lambda: kquants.quantize_rows(x, qtype, qw), args.repeat)  # noqa: B023
            t_ref, theirs = best(lambda: ref.ggml_quantize(x, qtype, qw), args.repeat)  # noqa: B023
            same = bool(np.array_equal(ours, theirs))
            print(
                f"{qtype:6} {'yes' if qw is not None else 'no':7} {compile_s:9.2f} {t_ours / n * 1e9:9.1f} "
                f"{t_ref / n * 1e9:9.1f} {t_ours / t_ref:6.2f} {str(same):>5} {peak_mib():8.0f}",
                flush=True,
            )
            if args.torch:
                import torch

                devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
                for dev in devices:
                    xs = x[: max(1, args.rows // 16)] if dev == "cpu" else x
                    run = _torch_rows(xs, qtype, qw, dev)
                    t_t, got = best(run, args.repeat)
                    ok = bool(np.array_equal(got, theirs[: xs.shape[0]]))
                    print(
                        f"  torch {dev:4} {t_t / xs.size * 1e9:9.1f} ns/w  same={ok}  rss {peak_mib():.0f} MiB"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
