"""What folding a randomised Hadamard rotation into the weights (``export --rotate``) does, beside the same
export unrotated: KLD on held-out text, file size, and the time and memory the rotation adds.

    QS_LLAMA_BIN=/work/llama.cpp/build/bin python bench/rotation_quality.py --model DEMO \\
        --eval resources/eval/code_python.txt --out /tmp/rq [--presets Q4_0,IQ4_NL,Q3_K_M] \\
        [--methods rtn,imatrix] [--calib resources/calibration/prose.txt]

1. The unrotated F16 export is the reference: llama-perplexity saves its logits of the evaluation text
   (ctx 512). The rotated F16 export's KLD against it says the rotation computes the same function.
2. For each preset and method, the same per-tensor types unrotated and rotated (``--rotate``): file
   bytes (a tied head is untied by the rotation: the rotated file carries it) and mean KLD by
   ``llama-perplexity --kl-divergence``; the ratio is rotated / unrotated.
3. Each export's seconds and peak resident memory (its own process, by ``os.wait4``), so the F16 pair
   shows the cost of the rotation (the float32 logits check included) as a ratio measured in the same run;
   ``--cost-only`` stops there.
Prints one table and writes ``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_BIN = Path(os.environ.get("QS_LLAMA_BIN", "llama.cpp/build/bin"))


def export(model: str, out: Path, preset: str, method: str, rotate: bool, calib: str | None) -> dict:
    """One ``quant-studio-cli export`` in its own process: its JSON answer, seconds and peak RSS (MiB)."""
    argv = ["export", model, "-o", str(out), "--preset", preset, "--json"]
    if method != "rtn":
        argv += ["--method", method] + (["--calib-text", calib] if calib else [])
    if rotate:
        argv.append("--rotate")
    cmd = [sys.executable, "-m", "studio.cli", *argv]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, text=True, cwd=ROOT, env=env)
        # wait4 gives this child's own peak RSS (RUSAGE_CHILDREN is the largest over all children so far)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        secs = time.monotonic() - t0
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
    d = json.loads(stdout)
    d["wall_s"], d["peak_mib"] = secs, usage.ru_maxrss / 1024
    return d


def kld(gguf: Path, base: Path, threads: int) -> float:
    """Mean KLD of ``gguf`` against the saved base logits (llama-perplexity, ctx 512)."""
    cmd = [str(LLAMA_BIN / "llama-perplexity"), "-m", str(gguf), "-c", "512", "-t", str(threads)]
    cmd += ["--kl-divergence-base", str(base), "--kl-divergence", "--no-repack"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    m = re.search(r"Mean\s+KLD:\s+([0-9.eE+-]+)", res.stdout + res.stderr)
    if not m:
        raise SystemExit(f"llama-perplexity gave no KLD for {gguf}:\n{(res.stdout + res.stderr)[-2000:]}")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--out", default="/tmp/rotation-quality")
    ap.add_argument("--presets", default="Q4_0,Q3_K_M")
    ap.add_argument("--methods", default="rtn")
    ap.add_argument(
        "--calib", default=None, help="calibration text for calibrated methods (default built-in)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cost-only", action="store_true", help="only the F16 pair's time and memory")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = args.threads
    rows: list[dict] = []
    f16 = {
        r: export(args.model, out / f"F16-{r}.gguf", "F16", "rtn", r == "rot", None) for r in ("plain", "rot")
    }
    for name, d in f16.items():
        print(f"F16 {name}: {d['wall_s']:.1f} s wall, peak {d['peak_mib']:.0f} MiB, {d['file_bytes']:,} B")
    p, r = f16["plain"], f16["rot"]
    print(
        f"rotation cost (same run): {r['wall_s'] / p['wall_s']:.2f}x time, "
        f"{r['peak_mib'] / p['peak_mib']:.2f}x peak RSS",
        flush=True,
    )
    if args.cost_only:
        return 0
    base = out / "base.kld"
    if not base.exists():
        subprocess.run(
            [
                str(LLAMA_BIN / "llama-perplexity"),
                "-m",
                str(out / "F16-plain.gguf"),
                "-f",
                args.eval,
                "-c",
                "512",
            ]
            + ["-t", str(t), "--kl-divergence-base", str(base), "--no-repack"],
            capture_output=True,
            check=True,
        )
    rot_f16_kld = kld(out / "F16-rot.gguf", base, t)
    print(f"F16 rotated vs unrotated: KLD {rot_f16_kld:.6f}")
    print(
        f"{'preset':8} {'method':8} {'plain KLD':>10} {'rot KLD':>10} {'ratio':>6} {'plain B':>12} {'rot B':>12}"
    )
    for preset in args.presets.split(","):
        for method in args.methods.split(","):
            r = {"preset": preset, "method": method}
            for kind in ("plain", "rot"):
                f = out / f"{preset}-{method}-{kind}.gguf"
                d = export(args.model, f, preset, method, kind == "rot", args.calib)
                r[kind] = {"kld": kld(f, base, t), "file_bytes": d["file_bytes"], "wall_s": d["wall_s"]}
                f.unlink()
            r["ratio"] = r["rot"]["kld"] / r["plain"]["kld"]
            rows.append(r)
            print(
                f"{preset:8} {method:8} {r['plain']['kld']:10.5f} {r['rot']['kld']:10.5f} {r['ratio']:6.2f} "
                f"{r['plain']['file_bytes']:12,} {r['rot']['file_bytes']:12,}",
                flush=True,
            )
    res = {"f16_rotated_kld": rot_f16_kld, "f16": f16, "rows": rows}
    for k in ("plain", "rot"):
        res["f16"][k] = {x: f16[k][x] for x in ("wall_s", "peak_mib", "file_bytes")}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
