"""Time and memory of GPTQ: seconds per layer of a calibrated export, and the peak RSS.

    python bench/gptq.py [--model DIR] [--preset Q4_K_M] [--method gptq] [--chunks N] [--device cpu]
    python bench/gptq.py --shapes 8b [--layers 2] --device cuda     # Llama-3-8B-shaped linears only
    python bench/gptq.py --lattice IQ2_S [--rows 1024]              # vector GPTQ onto an i-quant lattice

The first form exports MODEL (default: a tiny factory llama) with ``--method`` and with ``imatrix``
(the same calibration run without GPTQ, the reference), each in a child process so that each peak
RSS is its own, and prints per layer: seconds of the layer's forward passes and of its methods; then
the ratio of the two totals. The second form times only the GPTQ sweeps of one decoder layer of a
Llama-3-8B shape (q/k/v/o 4096², gate/up 14336×4096, down 4096×14336, random Hessians of those
sizes) on ``--device``, and extrapolates to 32 layers (AutoRound's reference: 8B in ~12 min on an A100).
The third times GPTQ onto a lattice type (``gptq_lattice``) on the 1.5B bench model's widths (q_proj's
1536 inputs, down_proj's 8960; ``--rows`` output rows each, the time is linear in them) beside llama.cpp's
own imatrix quantizer (``ggml_quantize_chunk``, one thread) of the same matrix, the reference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import peak_mib, synced  # noqa: E402


def _child(args: argparse.Namespace, method: str, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", method, "--model", str(args.model), "--preset", args.preset]
    cmd += ["--device", args.device, "--out", str(out), "--calib-text", args.calib_text]
    if args.chunks:
        cmd += ["--chunks", str(args.chunks)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=str(ROOT))
    if res.returncode != 0:
        raise SystemExit(f"{method} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_child(args: argparse.Namespace) -> None:
    from studio.core.calib.quantize import export_calibrated
    from studio.core.model import open_model
    from studio.core.plan.plan import plan_from_preset, with_method

    with open_model(args.model) as ck:
        info = ck.info
    plan = with_method(plan_from_preset(info, args.preset, imatrix=True), info, args.child)
    t0 = time.monotonic()
    r = export_calibrated(
        args.model, args.out, plan, text=args.calib_text, n_chunks=args.chunks, device=args.device
    )
    print(
        json.dumps(
            {
                "seconds": time.monotonic() - t0,
                "calibration_seconds": r.run.seconds if r.run else 0.0,
                "layers": [[lr.layer, lr.seconds] for lr in r.layers],
                "n_layers": r.run.n_layers if r.run else 0,
                "tokens": r.tokens,
                "peak_rss_mib": peak_mib(),
            }
        )
    )


def shapes_8b(args: argparse.Namespace) -> None:
    import torch

    from studio.core.quant.gptq import gptq_quantize

    dev = torch.device(args.device)
    hidden, inter = 4096, 14336
    shapes = [("q", hidden, hidden, "Q4_K"), ("k", 1024, hidden, "Q4_K"), ("v", 1024, hidden, "Q6_K")]
    shapes += [("o", hidden, hidden, "Q4_K"), ("gate", inter, hidden, "Q4_K"), ("up", inter, hidden, "Q4_K")]
    shapes += [("down", hidden, inter, "Q6_K")]
    g = torch.Generator(device=dev).manual_seed(0)
    hess = {}
    for n in (hidden, inter):
        x = torch.randn(4 * n, n, device=dev, generator=g)
        hess[n] = 2 * x.T @ x / x.shape[0]
        del x
    per_layer = []
    for layer in range(args.layers):
        t_layer = 0.0
        for name, rows, cols, qtype in shapes:
            w = 0.02 * torch.randn(rows, cols, device=dev, generator=g)
            t0 = time.perf_counter()
            synced(lambda w=w, h=hess[cols], q=qtype: gptq_quantize(w, h, q), dev)()
            dt = time.perf_counter() - t0
            t_layer += dt
            print(f"layer {layer} {name:5s} {rows}×{cols} {qtype}: {dt:.2f} s", flush=True)
        per_layer.append(t_layer)
    mean = sum(per_layer[1:] or per_layer) / len(per_layer[1:] or per_layer)
    print(f"GPTQ sweeps per 8B-shaped layer on {dev}: {mean:.1f} s; × 32 layers ≈ {32 * mean / 60:.1f} min")
    print("(AutoRound's reference: Llama-3.1-8B in ~12 min on an A100; forward passes not included here)")
    print(f"peak RSS {peak_mib():.0f} MiB")


def lattice(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from studio.core.quant import gptq_lattice
    from studio.core.quant import reference as ref
    from studio.core.quant.types import row_bytes

    torch.manual_seed(0)
    total_g = total_r = 0.0
    for n in (1536, 8960):  # Qwen2.5-1.5B: hidden (q/k/v/o, gate/up inputs), FFN (down_proj's input)
        x = torch.randn(2048, n)  # 2,048 tokens: H is singular at n = 8960, as a real one may be (damped)
        x[:, :: max(1, n // 8)] *= 20  # a few massive input channels, as real activations have
        h = x.T @ x / x.shape[0]
        del x
        w = 0.02 * torch.randn(args.rows, n)
        imx = np.ascontiguousarray(torch.diagonal(h).numpy(), dtype=np.float32)
        out = np.empty((args.rows, row_bytes(args.lattice, n)), np.uint8)
        ref.ggml_quantize_into(w[:1].numpy(), args.lattice, out[:1], imx)  # llama.cpp builds its grids once
        t0 = time.perf_counter()
        ref.ggml_quantize_into(w.numpy(), args.lattice, out, imx)
        t_ref = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = gptq_lattice.gptq_lattice(w, h, args.lattice, imatrix=imx)
        t_g = time.perf_counter() - t0
        total_g, total_r = total_g + t_g, total_r + t_ref
        nw = args.rows * n
        print(
            f"{args.lattice} {args.rows}×{n}: gptq {t_g:.2f} s ({1e9 * t_g / nw:.0f} ns/weight), "
            f"llama.cpp {t_ref:.2f} s, ratio {t_g / t_ref:.1f}, output error {r.gain:.3f}× llama.cpp's",
            flush=True,
        )
    print(f"ratio gptq / llama.cpp time: {total_g / total_r:.1f}; peak RSS {peak_mib():.0f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: a tiny factory llama)")
    ap.add_argument("--preset", default="Q4_K_M")
    ap.add_argument("--method", default="gptq")
    ap.add_argument("--calib-text", default="builtin")
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", choices=("8b",), default=None)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lattice", default=None, metavar="QTYPE", help="time vector GPTQ onto this i-quant")
    ap.add_argument("--rows", type=int, default=1024, help="--lattice: output rows per matrix")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(args)
        return 0
    if args.shapes:
        shapes_8b(args)
        return 0
    if args.lattice:
        lattice(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-gptq-") as tmp:
        if args.model is None:
            from studio.core.factory import make_tiny_model

            args.model = make_tiny_model(Path(tmp) / "llama", "llama", hidden=256, layers=4)
        ref = _child(args, "imatrix", Path(tmp) / "imatrix.gguf")
        got = _child(args, args.method, Path(tmp) / f"{args.method}.gguf")
    n = got["n_layers"] or 1
    fwd = got["calibration_seconds"] - sum(s for _, s in got["layers"])
    print(f"{args.model}: {args.preset}, {got['tokens']} calibration tokens, device {args.device}")
    print(f"{'layer':>6} {'methods s':>10}")
    for layer, sec in got["layers"]:
        print(f"{'head' if layer is None else layer:>6} {sec:10.2f}")
    print(f"forward passes {fwd:.1f} s ({fwd / n:.2f} s per layer, two per layer: collect, then recompute)")
    print(
        f"{args.method}: {got['seconds']:.1f} s total, {got['seconds'] / n:.2f} s per layer, "
        f"peak RSS {got['peak_rss_mib']:.0f} MiB"
    )
    print(f"imatrix (reference): {ref['seconds']:.1f} s total, peak RSS {ref['peak_rss_mib']:.0f} MiB")
    print(f"ratio {args.method} / imatrix time: {got['seconds'] / ref['seconds']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
