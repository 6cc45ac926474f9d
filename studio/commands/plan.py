"""``quant-studio-cli plan MODEL --budget SIZE -o plan.json``: the per-tensor plan for a budget, without quantizing."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from studio.commands._common import ProgressLine, print_json, print_notes, torch_original, write_text
from studio.commands._heldout import allocate_guarded, guard, judge, split
from studio.commands._scan import (
    allocation,
    budget_preface,
    calibration,
    check_budget_args,
    check_budget_memory,
    for_rounding,
    run_scan,
    scanned_info,
)
from studio.core.export.run import check_exportable
from studio.core.gguf.writer import check_output_path
from studio.core.jobs import JobContext
from studio.core.model import open_model
from studio.core.model.rotate import rotation_of
from studio.core.quant.methods import check_method
from studio.core.units import format_bytes


def run(args: argparse.Namespace) -> int:
    """Handler of ``plan``."""
    method = check_method(args.method)
    args.model = torch_original(args.model, "the budget planner's scan")  # the plan is keyed by its names
    with open_model(args.model) as ck:
        info = scanned_info(ck, args)  # with --rotate: the rotated model, its untied head counted
    check_exportable(info)
    # a malformed or too small budget is refused before any work; one above F16 needs no scan
    alloc = check_budget_args(args, info, method)
    preface = ""
    if alloc is None:  # the whole run's peak, refused before its first step (its steps check again)
        preface = budget_preface(args, check_budget_memory(args, info, method, export=False), export=False)

    check_output_path(Path(args.output).expanduser())
    scan = verdict = None
    if alloc is None:
        with ProgressLine(preface=preface) as line:
            ctx = JobContext(on_progress=line.fraction, on_log=line.log, min_interval=0.2)
            fit, held, text_note = split(args, info, ctx)
            imatrix = calibration(args, info, ctx, fit)
            scan = run_scan(args, info, ctx, imatrix, fit)
            planned, rounding_note = for_rounding(args, info, scan, fit, method, ctx)
            guarded, presets, note = guard(args, info, planned, imatrix)
            own = imatrix if method == "imatrix" else None
            alloc, note = allocate_guarded(
                planned,
                guarded,
                note,
                lambda sc: allocation(args, info, sc, own, method, ctx, fit),
            )
            notes = tuple(n for n in (text_note, rounding_note, note) if n)
            alloc = dataclasses.replace(alloc, notes=(*alloc.notes, *notes))
            verdict = judge(args, info, alloc, held, fit, imatrix, method, ctx, presets)
    write_text(args.output, alloc.plan.to_json(), "plan")
    out = {"output": args.output, "plan": alloc.plan.name, "method": method, **alloc.to_dict()}
    rot = rotation_of(info)
    out["rotation"] = None if rot is None else {"seed": rot.seed}
    out["scan"] = None
    if scan is not None:
        out["scan"] = {
            "mode": scan.mode,
            "tokens": scan.n_tokens,
            "seconds": round(scan.seconds, 3),
            "key": scan.key,
        }
    out["types"] = dict(alloc.plan.summary(info).tensors_by_type)
    out["heldout"] = None if verdict is None else verdict.to_dict()
    if args.json:
        print_json(out)
        return 0
    print(
        f"wrote {args.output}: {format_bytes(alloc.file_bytes)} file ({alloc.bpw:.2f} bpw) for a budget of "
        f"{alloc.budget.describe()}; predicted KL {alloc.predicted_kl:.4f}"
        + (f", measured {alloc.measured_kl:.4f} on the scan chunks" if alloc.measured_kl is not None else "")
    )
    print("types: " + ", ".join(f"{k}×{v}" for k, v in sorted(out["types"].items())))
    if verdict is not None:
        print(verdict.verdict)
    print_notes(alloc.notes)
    return 0
