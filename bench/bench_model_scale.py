"""Time and peak memory at hobbyist scale: the studio beside llama.cpp's own tools on the 1.5B bench model.

    python bench/bench_model_scale.py [--chunks 4] [--ctx 512] [--text resources/calibration/prose.txt]

Needs the bench model (``quant-studio-cli bench-model``) and llama.cpp's tools (``QS_LLAMA_BIN`` or
``--llama-bin``: llama-imatrix, llama-quantize). Each step runs once in its own child process, whose
wall time and peak RSS (``os.wait4``) are printed beside llama.cpp's on the same input:

- ``calibrate`` (the importance matrix, in torch on the float32 folder the studio converts the GGUF to,
  once; the conversion is timed apart on the first run) against ``llama-imatrix`` on the same text,
  context and chunks;
- ``export --preset P`` (a requantization of the GGUF) against ``llama-quantize --allow-requantize``.

Threads: both sides get every core (``--threads``); run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of ``cmd`` run to completion; raises on a non-zero exit."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} … failed ({p.returncode}): {err.strip().splitlines()[-1:]}")
    return wall, usage.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--text", default=str(ROOT / "resources" / "calibration" / "prose.txt"))
    ap.add_argument("--presets", default="Q4_K_M,Q3_K_M")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--llama-bin", default=os.environ.get("QS_LLAMA_BIN", ""))
    ap.add_argument("--skip-calibrate", action="store_true")
    args = ap.parse_args()

    from studio.core.benchmodel import bench_model_path
    from studio.core.model.gguf_source import hf_folder_for

    gguf = str(bench_model_path())
    llama = Path(args.llama_bin)
    if not (llama / "llama-quantize").exists():
        raise SystemExit(
            "llama.cpp's tools are needed: --llama-bin DIR or QS_LLAMA_BIN (llama-quantize, llama-imatrix)."
        )
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "studio.cli"]
    rows: list[tuple[str, tuple[float, float], tuple[float, float] | None]] = []
    with tempfile.TemporaryDirectory(prefix="qs-bench-scale-") as tmp:
        t = Path(tmp)
        t0 = time.perf_counter()
        folder = hf_folder_for(gguf)  # once: the float32 folder calibrate runs on (cached)
        print(f"float32 folder: {folder} ({time.perf_counter() - t0:.1f} s, 0 when cached)")
        if not args.skip_calibrate:
            ours = run(
                [*cli, "calibrate", gguf, "-o", str(t / "ours.imatrix.gguf"), "--text", args.text]
                + ["--ctx", str(args.ctx), "--chunks", str(args.chunks), "--device", "cpu"],
                env,
            )
            theirs = run(
                [str(llama / "llama-imatrix"), "-m", gguf, "-f", args.text, "-o", str(t / "ref.imatrix.gguf")]
                + ["-c", str(args.ctx), "--chunks", str(args.chunks), "-t", str(args.threads), "--no-ppl"]
                # no repacked (AMX) weights: they crash the first decode of K-quants here (DESIGN.md)
                + ["--no-repack"],
                env,
            )
            rows.append((f"calibrate ({args.chunks}×{args.ctx} tokens)", ours, theirs))
            print(rows[-1], flush=True)
        for preset in [p.strip().upper() for p in args.presets.split(",") if p.strip()]:
            ours = run([*cli, "export", gguf, "--preset", preset, "-o", str(t / f"ours-{preset}.gguf")], env)
            theirs = run(
                [str(llama / "llama-quantize"), "--allow-requantize", gguf, str(t / f"ref-{preset}.gguf")]
                + [preset, str(args.threads)],
                env,
            )
            rows.append((f"export --preset {preset}", ours, theirs))
            print(rows[-1], flush=True)
            for f in t.glob(f"*-{preset}.gguf"):
                f.unlink()  # 1 GB each: not kept
    print(f"{'step':34} {'studio s':>9} {'peak MiB':>9} {'llama.cpp s':>12} {'peak MiB':>9} {'time ×':>7}")
    for name, (ws, ms), ref in rows:
        wr, mr = ref if ref else (float("nan"), float("nan"))
        print(f"{name:34} {ws:9.1f} {ms:9.0f} {wr:12.1f} {mr:9.0f} {ws / wr:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
