"""Budget plans judged on a text of another kind than their calibration text, beside llama.cpp's presets.

    QS_LLAMA_BIN=/work/llama.cpp/build/bin python bench/heldout_quality.py --model DEMO \\
        --calib resources/calibration/prose.txt --eval resources/eval/code_python.txt --out /tmp/hq \\
        [--presets Q4_K_M,Q3_K_M] [--methods imatrix,awq+gptq] [--preset-methods awq+gptq]

1. The model as an F32 GGUF (the studio's exporter) and llama-perplexity's base logits of the evaluation
   text (ctx 512).
2. llama.cpp's reference: ``llama-imatrix`` on the calibration text, ``llama-quantize --imatrix`` at each
   preset; its file size is the budget.
3. ``quant-studio-cli export --budget SIZE --calib-text CALIB --exclude Q4_1,Q5_1`` for each method (the
   demo's weights were dequantized from a Q4_1 file and lie on the Q4_1/Q5_1 grids), and optionally
   ``--preset P --method M`` for reference.
4. ``llama-perplexity --kl-divergence`` of every file; the ratio is KLD / llama.cpp's preset with imatrix.
Prints one table and writes ``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gptq_quality import LLAMA_BIN, llama_kl  # noqa: E402


def cli(*argv: str) -> dict:
    """Run ``quant-studio-cli`` (this checkout) with ``--json``; its JSON answer."""
    cmd = [sys.executable, "-m", "studio.cli", *argv, "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--out", default="/tmp/heldout-quality")
    ap.add_argument("--presets", default="Q4_K_M,Q3_K_M")
    ap.add_argument("--methods", default="imatrix,awq+gptq")
    ap.add_argument("--preset-methods", default="", help="also export each preset with these methods")
    ap.add_argument("--exclude", default="Q4_1,Q5_1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--extra", default="", help="extra export arguments for the budget plans (space-separated)"
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = str(args.threads)
    f32 = out / "model-F32.gguf"
    if not f32.exists():
        cli("export", args.model, "-o", str(f32), "--preset", "F32")
    base = out / "base.kld"
    if not base.exists():
        subprocess.run(
            [str(LLAMA_BIN / "llama-perplexity"), "-m", str(f32), "-f", args.eval, "-c", "512", "-t", t]
            + ["--kl-divergence-base", str(base), "--no-repack"],
            capture_output=True,
            check=True,
        )
    imx = out / "llama-imatrix.gguf"
    if not imx.exists():
        subprocess.run(
            [str(LLAMA_BIN / "llama-imatrix"), "-m", str(f32), "-f", args.calib, "-c", "512", "-t", t]
            + ["-o", str(imx), "--no-repack"],
            capture_output=True,
            check=True,
        )
    rows = []
    for preset in args.presets.split(","):
        ref = out / f"llama-{preset}-imatrix.gguf"
        if not ref.exists():
            subprocess.run(
                [str(LLAMA_BIN / "llama-quantize"), "--imatrix", str(imx), str(f32), str(ref), preset],
                capture_output=True,
                check=True,
            )
        ref_kl = llama_kl(ref, base, args.threads)
        budget = ref.stat().st_size
        rows.append({"size": preset, "file": f"llama.cpp {preset} + imatrix", "bytes": budget, "kld": ref_kl})
        print(f"{preset}: llama.cpp + imatrix {budget} B, KLD {ref_kl:.5f}", flush=True)
        for method in filter(None, args.methods.split(",")):
            f = out / f"budget-{preset}-{method}.gguf"
            t0 = time.monotonic()
            res = cli(
                "export", args.model, "-o", str(f), "--budget", str(budget), "--calib-text", args.calib,
                "--exclude", args.exclude, "--method", method, *args.extra.split(),
            )  # fmt: skip
            kl = llama_kl(f, base, args.threads)
            b = res.get("budget") or {}
            rows.append(
                {
                    "size": preset,
                    "file": f"export --budget, method {method}",
                    "bytes": f.stat().st_size,
                    "kld": kl,
                    "ratio": kl / ref_kl if kl and ref_kl else None,
                    "predicted_kl": b.get("predicted_kl"),
                    "heldout": b.get("heldout"),
                    "types": res.get("types"),
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
            print(f"  budget {method}: {f.stat().st_size} B, KLD {kl:.5f} ({kl / ref_kl:.2f}×)", flush=True)
        for method in filter(None, args.preset_methods.split(",")):
            f = out / f"preset-{preset}-{method}.gguf"
            if not f.exists():
                cli(
                    "export",
                    args.model,
                    "-o",
                    str(f),
                    "--preset",
                    preset,
                    "--calib-text",
                    args.calib,
                    "--method",
                    method,
                )
            kl = llama_kl(f, base, args.threads)
            rows.append(
                {"size": preset, "file": f"export --preset {preset} --method {method}", "bytes": f.stat().st_size,
                 "kld": kl, "ratio": kl / ref_kl if kl and ref_kl else None}
            )  # fmt: skip
            print(f"  preset {method}: {f.stat().st_size} B, KLD {kl:.5f} ({kl / ref_kl:.2f}×)", flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n| size | file | bytes | KLD | × llama.cpp + imatrix |\n|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") else "1.00"
        print(f"| {r['size']} | {r['file']} | {r['bytes']:,} | {r['kld']:.4f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
