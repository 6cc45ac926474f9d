"""``quant-studio-cli sensitivity MODEL``: the KL each tensor costs at each candidate qtype."""

from __future__ import annotations

import argparse
import json

from studio.commands._common import ProgressLine, format_table, print_json, torch_original, write_text
from studio.commands._scan import calibration, run_scan, scanned_info
from studio.core.export.run import check_exportable
from studio.core.jobs import JobContext
from studio.core.model import open_model
from studio.core.units import format_bytes


def run(args: argparse.Namespace) -> int:
    """Handler of ``sensitivity``."""
    args.model = torch_original(args.model, "the sensitivity scan")  # its tensor names are the folder's
    with open_model(args.model) as ck:
        info = scanned_info(ck, args)  # with --rotate: the rotated model's tensors
    check_exportable(info)
    with ProgressLine() as line:
        ctx = JobContext(on_progress=line.fraction, on_log=line.log, min_interval=0.2)
        imatrix = None if args.scan else calibration(args, info, ctx)
        scan = run_scan(args, info, ctx, imatrix)
    d = scan.to_dict()
    if args.output:
        write_text(args.output, json.dumps(d), "sensitivity scan")
    if args.json:
        print_json(d)
        return 0
    print(
        f"{scan.mode} scan of {len(scan.tensors)} tensors × {len(scan.types)} types on {scan.n_tokens} tokens "
        f"of {scan.dataset} ({scan.method}); {scan.seconds:.1f} s, {scan.cpu_seconds:.1f} CPU s"
    )
    low = scan.types[0] if scan.types else ""
    ranked = sorted(scan.tensors, key=lambda t: -min(c.kl for c in t.by_type.values()))
    rows = []
    for t in ranked[: max(0, args.top)]:
        worst = max(t.by_type.values(), key=lambda c: c.kl)
        best = min(t.by_type.values(), key=lambda c: c.kl)
        rows.append(
            (
                t.name,
                t.role,
                "" if t.layer is None else str(t.layer),
                f"{worst.kl:.2e} ({worst.effective})",
                f"{best.kl:.2e} ({best.effective})",
                format_bytes(best.bytes),
            )
        )
    if rows:
        print(f"\nmost sensitive tensors (KL at their smallest and largest candidate; {low} … first type):")
        print(format_table(("tensor", "role", "layer", "KL worst", "KL best", "bytes best"), rows, right={2}))
    if scan.check is not None and scan.check.pairs:
        print(
            f"\nproxy check on {len(scan.check.pairs)} held-out pairs: median |ln(proxy/exact)| "
            f"{scan.check.median_abs_log_ratio:.3f}, rank correlation {scan.check.spearman:.3f}"
        )
    return 0
