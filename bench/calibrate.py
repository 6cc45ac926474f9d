"""Calibration speed and memory: the layer-wise runner with its hooks against a plain forward of the same model.

In separate processes (so each peak RSS is its own):

1. reference: transformers loads the whole model and runs the same chunks through it, no hooks;
2. the layer runner without consumers (reading each layer from disk, no hooks);
3. the layer runner with the activation collector (the ``calibrate`` run).

Prints tokens/s of each (wall clock and per CPU second) and the ratio reference / calibration (the
hooks must cost at most 1.3×), and the peak RSS above the process's baseline after imports next to the
largest layer's weights plus the activations (hidden states of all chunks in and out, one layer's
temporaries): at most that + 400 MB. Every mode imports the model's transformers modules and loads the
compiled reduction kernels before its clock starts, so one-time import costs are not counted as hooks.

On a shared machine, compare with ``--threads 1``: a loaded CPU makes torch's parallel regions wait
for descheduled threads, which inflates every small operation (the load average is printed).

Usage: ``python bench/calibrate.py [--model DIR] [--ctx 512] [--chunks 4] [--repeat 3] [--threads N]``
(default model: a random Llama with hidden 768 and 6 layers made on the fly).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_now_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / (1 << 20)


def _warm_imports(model: str) -> None:
    """Import what any mode imports lazily (the model's modeling module, transformers' model code) and
    load the compiled reduction kernels, so no clock below counts a one-time import."""
    import torch
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from studio.core.calib.accumulators import HiddenAccumulator, Reduction

    _ = MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model))]
    Reduction.of(torch.ones(2, 8))
    HiddenAccumulator(0, 8, "cpu").add(torch.ones(1, 2, 8))


def child(mode: str, model: str, ctx_len: int, chunks: int, threads: int) -> None:
    """One measurement; prints a JSON line."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    import transformers  # noqa: F401 - imported before the baseline is taken
    from _common import peak_mib

    from studio.core.calib import ActivationCollector, prepare_input, run_model
    from studio.core.model import open_model

    if threads:
        torch.set_num_threads(threads)
    inp = prepare_input(model, "builtin", n_ctx=ctx_len, n_chunks=chunks)
    _warm_imports(model)
    base = _rss_now_mib()
    if mode == "plain":
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, trust_remote_code=False).eval()
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            for row in inp.chunks.tokens:
                m.model(input_ids=torch.as_tensor(row[None]), use_cache=False)  # the decoder, as the runner
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    else:
        consumers = [ActivationCollector()] if mode == "calibrate" else []
        with open_model(model) as ck:
            t0, c0 = time.perf_counter(), time.process_time()
            run_model(ck, inp.chunks, consumers, device="cpu", dtype="float32")
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        json.dumps(
            {
                "mode": mode,
                "seconds": seconds,
                "cpu": cpu,
                "threads": torch.get_num_threads(),
                "tokens": int(inp.chunks.n_tokens),
                "base_mib": base,
                "peak_mib": peak_mib(),
            }
        )
    )


def _layer_bytes(model: str) -> tuple[int, dict]:
    from studio.core.model import open_model

    with open_model(model) as ck:
        by_layer: dict[int, int] = {}
        for t in ck.info.tensors:
            if t.layer is not None:
                by_layer[t.layer] = by_layer.get(t.layer, 0) + t.n_elements * 4
        return max(by_layer.values()), ck.info.config


def main() -> int:
    """Run the three measurements and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a Hugging Face model folder (default: a random Llama made here)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds, best of each (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    ap.add_argument("--child", nargs=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.model, args.ctx, args.chunks, args.threads)
        return 0
    sys.path.insert(0, str(ROOT))
    model = args.model
    if not model:
        from studio.core.factory import make_tiny_model

        model = str(
            make_tiny_model(
                Path(tempfile.mkdtemp(prefix="bench-calib-")) / "llama",
                "llama",
                hidden=768,
                layers=6,
                outliers=True,
            )
        )
    load0 = os.getloadavg()[0]
    results: dict[str, dict] = {}
    cpu_best: dict[str, float] = {}
    for _ in range(max(1, args.repeat)):  # interleaved, best of N: a busy machine slows every mode alike
        for mode in ("plain", "layers", "calibrate"):
            out = (
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--model",
                        model,
                        "--ctx",
                        str(args.ctx),
                        "--chunks",
                        str(args.chunks),
                        "--threads",
                        str(args.threads),
                        "--child",
                        mode,
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            r = json.loads(out)
            if mode not in results or r["seconds"] < results[mode]["seconds"]:
                results[mode] = r
            cpu_best[mode] = min(cpu_best.get(mode, float("inf")), r["cpu"])
    largest, cfg = _layer_bytes(model)
    hidden = int(cfg.get("hidden_size", 0))
    inter = int(cfg.get("intermediate_size", 4 * hidden))
    heads = int(cfg.get("num_attention_heads", 1))
    states = 2 * args.chunks * args.ctx * hidden * 4
    temps = args.ctx * (3 * inter + 6 * hidden) * 4 + heads * args.ctx * args.ctx * 4
    acts = states + temps
    tps = {k: v["tokens"] / v["seconds"] for k, v in results.items()}
    cps = {k: results[k]["tokens"] / v for k, v in cpu_best.items()}
    print(
        f"model {model}: {args.chunks} chunks × {args.ctx} tokens, hidden {hidden}, {cfg.get('num_hidden_layers')} layers; "
        f"{results['plain']['threads']} torch threads; load average {load0:.1f} → {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    print("                                        tokens/s   tokens/CPU-s")
    print(f"plain forward (whole model, no hooks)   {tps['plain']:9.1f}   {cps['plain']:9.1f}")
    print(f"layer runner, no hooks                  {tps['layers']:9.1f}   {cps['layers']:9.1f}")
    print(f"calibration (runner + collector hooks)  {tps['calibrate']:9.1f}   {cps['calibrate']:9.1f}")
    ratio = tps["plain"] / tps["calibrate"]
    cratio = cps["plain"] / cps["calibrate"]
    print(
        f"ratio plain / calibration: {ratio:.2f}× wall, {cratio:.2f}× CPU (target ≤ 1.30×) "
        f"{'OK' if ratio <= 1.3 else 'OVER'}"
    )
    cal = results["calibrate"]
    above = cal["peak_mib"] - cal["base_mib"]
    bound = (largest + acts) / (1 << 20) + 400
    print(
        f"peak RSS {cal['peak_mib']:.0f} MiB ({above:.0f} MiB above the {cal['base_mib']:.0f} MiB after imports); "
        f"largest layer {largest / (1 << 20):.0f} MiB + activations {acts / (1 << 20):.0f} MiB + 400 MiB = {bound:.0f} MiB "
        f"{'OK' if above <= bound else 'OVER'}"
    )
    print(f"plain forward peak RSS {results['plain']['peak_mib']:.0f} MiB (the whole model loaded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
