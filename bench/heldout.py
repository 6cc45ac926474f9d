"""Why budget plans over-fit their calibration text: per-tensor KL on the scan's text against held-out text.

    python bench/heldout.py --model DEMO --calib resources/calibration/prose.txt \
        --heldout resources/eval/code_python.txt --budget 105454336 [--exclude Q4_1,Q5_1] [--out DIR]

1. The imatrix and a proxy scan of the first 75 % of the calibration text (cached as the CLI caches them).
2. Each single-tensor perturbation (a sample: the tied embedding at every candidate, and a few tensors of
   each role at their smallest candidate) measured with only that tensor quantized, on the scan's chunks
   and on the held-out text (``measure_plans``: every plan is a stream): the ratio held-out / scan per
   tensor shows which tensors the scan under-estimates on new text.
3. The budget plan, the plan with the embedding at llama.cpp's choice, and llama.cpp's preset of the
   same size, each on the scan chunks and on the held-out text (additivity: measured / predicted).
Printed as tables; ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--budget", default="105454336")
    ap.add_argument("--exclude", default="Q4_1,Q5_1")
    ap.add_argument("--out")
    args = ap.parse_args()

    from studio.commands._scan import calibration
    from studio.core.calib.data import load_text_file
    from studio.core.calib.heldout import measure_heldout, preset_plans, same_size_preset, split_text
    from studio.core.calib.scan_cache import default_cache_dir
    from studio.core.calib.sensitivity import ScanSettings, measure_plans, scan_sensitivity
    from studio.core.jobs import null_context
    from studio.core.model import open_model
    from studio.core.plan.allocate import allocate, parse_budget

    with open_model(args.model) as ck:
        info = ck.info
    # as plan/export --budget do: the imatrix and the scan see the first 75 % of the calibration text
    # (both cached where the CLI keeps them, so a run after `plan` costs only the probes)
    calib, _ = split_text(load_text_file(args.calib))
    held = load_text_file(args.heldout)
    ex = tuple(q for q in args.exclude.split(",") if q)
    t0 = time.monotonic()
    ns = argparse.Namespace(calib_text=args.calib, calib_ctx=512, calib_chunks=None, no_cache=False)
    im = calibration(ns, info, null_context(), calib)
    print(f"imatrix {time.monotonic() - t0:.1f} s", flush=True)
    t0 = time.monotonic()
    st = ScanSettings()
    scan = scan_sensitivity(info.path, calib, st, imatrix=im, cache_dir=default_cache_dir())
    print(f"scan {time.monotonic() - t0:.1f} s ({scan.mode})", flush=True)

    # single-tensor perturbations
    probes: list[tuple[str, str]] = []
    emb = next(t for t in scan.tensors if t.gguf_name == "token_embd.weight")
    for c in emb.by_type.values():
        if c.effective not in ex and (emb.name, c.effective) not in probes:
            probes.append((emb.name, c.effective))
    roles: dict[str, int] = {}
    for t in scan.tensors:
        if t.layer is None or t.layer % 7 != 3:
            continue
        if roles.get(t.role, 0) >= 2:
            continue
        roles[t.role] = roles.get(t.role, 0) + 1
        q = "Q4_0" if "Q4_0" in t.by_type else min(t.by_type.values(), key=lambda c: c.bytes).effective
        probes.append((t.name, t.by_type[q].effective if q in t.by_type else q))
    plans = [{n: q} for n, q in probes]
    t0 = time.monotonic()
    on_scan = measure_plans(info.path, plans, calib, st, imatrix=im)
    on_held, n_tok = measure_heldout(info.path, plans, held, imatrix=im)
    print(f"single-tensor probes {time.monotonic() - t0:.1f} s; held-out {n_tok} tokens", flush=True)
    rows = []
    print(f"{'tensor':44} {'type':7} {'predicted':>10} {'scan':>10} {'held-out':>10} {'held/scan':>9}")
    for (n, q), a, b in zip(probes, on_scan, on_held, strict=True):
        t = scan.tensor(n)
        pred = next(c.kl for c in t.by_type.values() if c.effective == q)
        rows.append({"tensor": t.gguf_name, "qtype": q, "predicted": pred, "scan": a, "heldout": b})
        print(f"{t.gguf_name:44} {q:7} {pred:10.5f} {a:10.5f} {b:10.5f} {b / a if a else float('nan'):9.2f}")

    # whole plans
    cands = tuple(q for q in scan.types if q not in ex)
    alloc = allocate(info, scan, parse_budget(args.budget), candidates=cands, exclude=ex, imatrix=im)
    pres = preset_plans(info, imatrix=im)
    preset = same_size_preset(pres, alloc.limit_bytes)
    whole = {"budget plan": dict(alloc.plan.types)}
    pinned = dict(alloc.plan.types)
    if preset is not None:
        pinned[emb.name] = preset[2][emb.name]
        whole[f"plan, embedding at {preset[2][emb.name]}"] = pinned
        whole[f"preset {preset[0]}"] = dict(preset[2])
    plist = list(whole.values())
    s_kl = measure_plans(info.path, plist, calib, st, imatrix=im)
    h_kl, _ = measure_heldout(info.path, plist, held, imatrix=im)
    prows = []
    print(f"\n{'plan':36} {'emb':6} {'predicted':>10} {'scan':>10} {'held-out':>10}")
    for (name, types), a, b in zip(whole.items(), s_kl, h_kl, strict=True):
        pred = scan.predicted_kl(types)
        prows.append({"plan": name, "embedding": types[emb.name], "predicted": pred, "scan": a, "heldout": b})
        print(f"{name:36} {types[emb.name]:6} {pred:10.5f} {a:10.5f} {b:10.5f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "heldout.json").write_text(json.dumps({"probes": rows, "plans": prows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
