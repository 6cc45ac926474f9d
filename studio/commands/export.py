"""``quant-studio-cli export MODEL -o OUT.gguf``: write a GGUF file following a preset or a plan."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Any

from studio.commands import _numbers as numbers
from studio.commands._cluster import open_cluster
from studio.commands._common import (
    ProgressLine,
    print_json,
    print_notes,
    read_text,
    torch_original,
    write_text,
)
from studio.commands._fallbacks import fallback_lines
from studio.commands._heldout import allocate_guarded, guard, judge, split
from studio.commands._scan import (
    allocation,
    budget_preface,
    calibration,
    calibration_preface,
    check_budget_args,
    check_budget_memory,
    for_rounding,
    run_scan,
    warn_thin_calibration,
)
from studio.core.calib.heldout import same_size_preset
from studio.core.calib.imatrix import check_for_model, read_imatrix
from studio.core.calib.quantize import CalibOptions, export_calibrated, plan_sources
from studio.core.errors import StudioError, quote
from studio.core.evaluate.last_word import LastWordCheck, LastWordGate
from studio.core.evaluate.verification import verification_dict, verification_line
from studio.core.export.job import export_and_verify, verify_here
from studio.core.export.run import check_exportable, export_gguf
from studio.core.export.verify import check_verifiable, default_text
from studio.core.jobs import JobContext
from studio.core.model import open_model
from studio.core.model.gguf_source import source_summary
from studio.core.model.rotate import RotatedCheckpoint, rotation_from
from studio.core.plan.imatrix_need import check_imatrix
from studio.core.plan.job_estimate import lattice_weights
from studio.core.plan.plan import (
    Override,
    Plan,
    plan_first_last,
    plan_from_preset,
    plan_uniform,
    with_method,
    with_overrides,
)
from studio.core.plan.presets import PRESETS
from studio.core.quant.gptq import GptqOptions
from studio.core.quant.methods import check_method
from studio.core.units import format_bytes


def _parse_keep(spec: str) -> tuple[int, str]:
    try:
        n, t = spec.split(":", 1)
        return numbers.Whole(0, numbers.MAX_LAYERS)(n), t.strip().upper()
    except (ValueError, argparse.ArgumentTypeError):
        raise StudioError(
            f"--keep-first-last wants N:TYPE with N from 0 to {numbers.MAX_LAYERS:,} (e.g. 1:Q8_0), not {quote(spec)}."
        ) from None


def build_plan(args: argparse.Namespace, info: Any) -> Any:
    """The plan the arguments describe, for the model ``info``: made by the core's plan verbs."""
    overrides = []
    for o in args.override:
        if "=" not in o:
            raise StudioError(f"--override wants REGEX=TYPE, not {o!r}.")
        rx, t = o.rsplit("=", 1)
        overrides.append(Override(rx, t.strip().upper()))
    if args.plan:
        if args.keep_first_last:
            raise StudioError(
                "--keep-first-last goes with --preset or --uniform; a --plan already sets every tensor."
            )
        plan = Plan.from_json(read_text(args.plan, "plan"), info, source=args.plan)
        return with_overrides(plan, info, overrides) if overrides else plan
    if args.keep_first_last:
        n, high = _parse_keep(args.keep_first_last)
        low = (args.uniform or args.preset or "").upper()
        if low in PRESETS:  # as documented: the rest at the preset's main qtype, not its mixture
            low = PRESETS[low].default_type
        return plan_first_last(info, n, high, low, overrides)
    if args.uniform:
        return plan_uniform(info, args.uniform, overrides)
    calibrated = bool(getattr(args, "imatrix", None)) or getattr(args, "method", None) not in (None, "rtn")
    return plan_from_preset(info, args.preset, overrides, imatrix=calibrated)


def _with_method(args: argparse.Namespace, plan: Any, info: Any) -> Any:
    """The plan with ``--method`` applied, and the calibration arguments checked against it."""
    if args.method:
        plan = with_method(plan, info, check_method(args.method))
    elif args.imatrix:
        plan = with_method(plan, info, "imatrix")  # the file records how its codes were chosen
    calib_args = (
        args.calib_text is not None or args.calib_chunks is not None or args.in_order or args.calib_only
    )
    if args.imatrix:
        if any(plan.method_of(n) not in ("rtn", "imatrix") for n in plan.types):
            raise StudioError(
                "--imatrix goes with --method imatrix; gptq and awq collect their own statistics from --calib-text."
            )
        if calib_args:
            raise StudioError(
                "--calib-text and --calib-chunks calibrate; with --imatrix the file is used instead."
            )
        return plan
    if calib_args and not plan.calibrated:
        raise StudioError(
            "--calib-text, --calib-chunks, --calib-only and --in-order need a calibrated --method (imatrix, gptq, "
            "awq, awq+gptq)."
        )
    if plan.calibrated and args.backend != "studio":
        raise StudioError("Calibrated methods are written by the studio back end; drop --backend llama.cpp.")
    return plan


def _check_budget_args(args: argparse.Namespace, info: Any) -> Any:
    """Refuse what does not go with ``--budget`` before any work (a malformed budget included); the
    all-F16 allocation when the budget holds the F16 file (no calibration or scan is needed then)."""
    if args.keep_first_last or args.override:
        raise StudioError(
            "--keep-first-last and --override go with --preset or --uniform, not with --budget."
        )
    if args.backend != "studio":
        raise StudioError("A budget plan is written by the studio back end; drop --backend llama.cpp.")
    if args.in_order and (args.method or "imatrix") not in ("gptq", "awq+gptq"):
        raise StudioError("--in-order goes with --method gptq or awq+gptq.")
    method = check_method(args.method or "imatrix")
    if args.imatrix and method != "imatrix":
        raise StudioError("--imatrix goes with --method imatrix; gptq and awq collect their own statistics.")
    if method == "rtn":
        raise StudioError(
            "A budget plan is scanned with an imatrix; give --method imatrix, gptq, awq or awq+gptq."
        )
    return check_budget_args(args, info, method)


def _budget_plan(
    args: argparse.Namespace, info: Any, imatrix: Any, ctx: Any, last: dict[str, Any] | None = None
) -> tuple[Any, Any, Any]:
    """The allocation for ``--budget``, the imatrix the export weights its search with (None when the
    method collects its own statistics) and the held-out judgement (None without one): the scan is
    weighted by the calibration text's imatrix. ``last`` receives what llama.cpp's last word needs (the
    held-out text, the scan's imatrix, the same-size preset)."""
    method = check_method(args.method or "imatrix")
    fit, held, text_note = split(args, info, ctx)
    if imatrix is None:
        imatrix = calibration(args, info, ctx, fit)
    scan = run_scan(args, info, ctx, imatrix, fit)
    scan, rounding_note = for_rounding(args, info, scan, fit, method, ctx)
    guarded, presets, note = guard(args, info, scan, imatrix)
    own = imatrix if method == "imatrix" else None
    alloc, note = allocate_guarded(
        scan, guarded, note, lambda sc: allocation(args, info, sc, own, method, ctx, fit)
    )
    notes = tuple(n for n in (text_note, rounding_note, note) if n)
    alloc = dataclasses.replace(alloc, notes=(*alloc.notes, *notes))
    verdict = judge(args, info, alloc, held, fit, imatrix, method, ctx, presets)
    if last is not None:
        same = same_size_preset(
            presets, int(alloc.file_bytes if alloc.budget.kind.value != "file" else alloc.limit_bytes)
        )
        last.update(held=held, imatrix=imatrix, preset=None if same is None else same[0])
    return alloc, own, verdict


def _with_last_word(
    args: argparse.Namespace, info: Any, alloc: Any, last: dict[str, Any], ctx: Any, validate: Any, line: Any
) -> Any:
    """``validate`` preceded by llama.cpp's measurement of the partial file beside the same-size preset
    (``LastWordGate``, the window's too): a file worse than promised raises (the partial is deleted) unless
    ``--keep-if-worse``; the gate is kept in ``last["gate"]`` for its word."""
    held = last.get("held")
    check = LastWordCheck(
        info,
        predicted_kl=alloc.predicted_kl,
        text=held.text if held is not None else default_text(),
        preset=last.get("preset"),
        imatrix=last.get("imatrix"),
        keep_if_worse=args.keep_if_worse,
    )
    gate = LastWordGate(
        check,
        ctx=ctx,
        validate=validate,
        extra_buffers=args.llama_extra_buffers,
        on_start=lambda: line.log("llama.cpp measures the file on held-out text ..."),
    )
    last["gate"] = gate
    return gate


def _calibrated(args: argparse.Namespace, info: Any, plan: Any, ctx: Any, validate: Any = None) -> Any:
    opts = CalibOptions(
        gptq=GptqOptions(act_order=False, scales="arrival") if args.in_order else GptqOptions()
    )
    with contextlib.closing(open_cluster(args)) as executor:
        return _export_calibrated(args, info, plan, ctx, opts, executor, validate)


def _export_calibrated(
    args: argparse.Namespace, info: Any, plan: Any, ctx: Any, opts: Any, executor: Any, validate: Any
) -> Any:
    return export_calibrated(
        info.path,
        args.output,
        plan,
        text=plan_sources(plan, args.calib_text, own_only=args.calib_only),
        n_ctx=args.calib_ctx,
        n_chunks=args.calib_chunks,
        device=args.device,
        options=opts,
        ctx=ctx,
        validate=validate,
        allow_pickle=args.allow_pickle,
        executor=executor,
        rotation=rotation_from(args.rotate, args.rotate_seed),
    )


def _runs_in_torch(args: argparse.Namespace) -> bool:
    """Whether this export runs the model in torch: a budget (its scan), or a method that calibrates
    (imatrix without an --imatrix file, gptq, awq, awq+gptq, best), or a rotation (folded into the float
    weights of the Hugging Face folder); a GGUF original is converted for it."""
    if args.budget or args.rotate:
        return True
    return args.method not in (None, "rtn") and not (args.method == "imatrix" and args.imatrix)


def _gguf_source(ck: Any) -> Any:
    """The ``SourceSummary`` of a GGUF original (requantization), None for other checkpoints."""
    g = getattr(ck, "gguf", None)
    if g is None:
        return None

    return source_summary(g)


def run(args: argparse.Namespace) -> int:
    """Handler of ``export``."""
    if args.rotate and args.imatrix:  # before a GGUF original is converted for nothing
        raise StudioError(
            "--rotate measures the rotated model itself (--method imatrix, gptq, awq or a --budget scan); "
            "an --imatrix file was measured on the unrotated one."
        )
    if _runs_in_torch(args):
        what = "the budget's scan" if args.budget else f"--method {args.method}"
        if not args.budget and args.method in (None, "rtn"):
            what = "--rotate"
        args.model = torch_original(args.model, what)
    rotation = rotation_from(args.rotate, args.rotate_seed)
    with open_model(args.model, allow_pickle=args.allow_pickle) as ck:
        info = ck.info
        source = _gguf_source(ck)
        if rotation is not None:  # plans name the rotated model's tensors (an untied head included)
            view = RotatedCheckpoint(ck, rotation)
            info = view.info
            if not args.json:
                print_notes(view.notes)  # R2 alone on a family R1 cannot fold: why, before the work
    check_exportable(info)
    if source is not None and source.warning and not args.json:
        print(f"warning: {source.warning}", file=sys.stderr)
    if args.verify:
        check_verifiable(info.path)  # refuse before a long export, not after it
    imatrix = None
    if args.imatrix:
        imatrix = read_imatrix(args.imatrix)
        check_for_model(imatrix, info)  # another model's imatrix: one sentence, before any work
    alloc = None
    preface = ""  # the job's estimate, said before its first step
    if args.budget:
        alloc = _check_budget_args(args, info)
        if alloc is None:  # the whole run's peak, refused before its first step (its steps check again)
            job = check_budget_memory(args, info, check_method(args.method or "imatrix"), export=True)
            preface = budget_preface(args, job, export=True)
    else:
        if args.exclude or args.measure or args.heldout_text or args.no_heldout:
            # they shape or judge a budget plan; a preset or a plan already names every type
            raise StudioError("--exclude, --measure, --heldout-text and --no-heldout go with --budget.")
        plan = _with_method(args, build_plan(args, info), info)
        if not plan.calibrated:  # IQ2_XXS and the like without --imatrix: one sentence, before any work
            check_imatrix(plan, info, imatrix)
        elif imatrix is None:  # GPTQ on fewer tokens than the model is wide: said before it runs
            on_lattice = lattice_weights(info, plan.types, lambda name: "gptq" in plan.method_of(name))
            preface = calibration_preface(args, info, map(plan.method_of, plan.types), on_lattice)
            gptq = next((m for m in map(plan.method_of, plan.types) if "gptq" in m), None)
            if gptq is not None:
                warn_thin_calibration(args, info, gptq)
        if args.save_plan:
            write_text(args.save_plan, plan.to_json(), "plan")
    verdict = None
    last: dict[str, Any] = {}  # llama.cpp's last word on a budget file (studio.core.evaluate.last_word)
    with ProgressLine(preface=preface) as line:
        ctx = JobContext(on_progress=line.fraction, on_log=line.log, min_interval=0.2)
        if args.budget:
            if alloc is None:
                alloc, imatrix, verdict = _budget_plan(args, info, imatrix, ctx, last)
            plan = alloc.plan
            if args.save_plan:
                write_text(args.save_plan, plan.to_json(), "plan")

        def write(c: JobContext, validate: Any) -> Any:
            if last:  # a scanned budget plan: llama.cpp measures the partial file before it is renamed
                validate = _with_last_word(args, info, alloc, last, c, validate, line)
            if plan.calibrated and imatrix is None:
                return _calibrated(args, info, plan, c, validate)
            return export_gguf(
                info.path,
                args.output,
                plan,
                device=args.device,
                backend=args.backend,
                ctx=c,
                validate=validate,
                allow_pickle=args.allow_pickle,
                imatrix=imatrix,
                rotation=rotation,
            )

        # the window's job: the partial file is verified before it is renamed into place
        verify = None
        if args.verify:
            verify = verify_here(
                args.device,
                extra_buffers=args.llama_extra_buffers,
                on_start=lambda: line.log("verifying against the original model ..."),
            )
        outcome = export_and_verify(ctx, info.path, write, verify=verify)
    res, calibration = outcome.result, outcome.calibration
    out: dict[str, Any] = {
        "output": str(res.path),
        "backend": res.backend,
        "device": res.device,
        "plan": res.plan_name,
        "file_bytes": res.file_bytes,
        "tensor_bytes": res.tensor_bytes,
        "bpw": round(res.bpw, 4),
        "tensors": res.n_tensors,
        "seconds": round(res.seconds, 3),
        "types": dict(res.tensor_types),
        "fallbacks": [f.to_dict() for f in res.fallbacks],
        "notes": list(res.notes),
    }
    word = last["gate"].word if "gate" in last else None
    if alloc is not None:
        out["budget"] = alloc.to_dict()
        out["budget"]["heldout"] = None if verdict is None else verdict.to_dict()
        out["budget"]["llama_cpp"] = None if word is None else {**word.to_dict(), "kept_anyway": not word.ok}
    if source is not None:
        out["source"] = source.to_dict()
    if imatrix is not None and args.imatrix:
        out["imatrix"] = {"file": args.imatrix, "entries": len(imatrix), "chunks": imatrix.chunk_count}
    if calibration is not None:
        out["calibration"] = calibration.to_dict()
    if args.verify:
        if outcome.verify_error:
            raise StudioError(outcome.verify_error)
        v = outcome.verification

        print_notes(v.notes)
        out["verify"] = {
            "tokens": v.n_tokens,
            "top1_agreement": v.top1_agreement,
            "mean_kl": v.mean_kl,
            "max_abs_diff": v.max_abs_diff,
            "relative_max_diff": v.relative_max_diff,
            "mean_cosine": v.mean_cosine,
            "notes": list(v.notes),
            **verification_dict(v),  # Evaluate's definitions, verdict and what it was measured on
        }
        verify_text = verification_line(v)
    if args.json:
        print_json(out)
        return 0
    counts: dict[str, int] = {}
    for t in res.tensor_types.values():
        counts[t] = counts.get(t, 0) + 1
    print(
        f"wrote {res.path} ({format_bytes(res.file_bytes)}, {res.bpw:.2f} bpw, {res.n_tensors} tensors, "
        f"{res.seconds:.1f} s)"
    )
    print("types: " + ", ".join(f"{k}×{v}" for k, v in sorted(counts.items())))
    if alloc is not None:
        print(
            f"budget {alloc.budget.describe()}: predicted KL {alloc.predicted_kl:.4f}"
            + (
                f", measured {alloc.measured_kl:.4f} on the scan chunks"
                if alloc.measured_kl is not None
                else ""
            )
        )
        if verdict is not None:
            print(verdict.verdict)
        if word is not None:
            print(word.sentence if word.ok else f"KEPT ANYWAY (--keep-if-worse): {word.sentence}")
        print_notes(alloc.notes)
    for line in fallback_lines(res.fallbacks, verbose=args.verbose):
        print(line)
    if calibration is not None:
        c = calibration
        print(
            f"method {c.method}: calibrated on {c.tokens} tokens of {c.dataset} ({c.n_chunks} × {c.n_ctx}), "
            f"{c.seconds:.1f} s"
        )
        for w in c.warnings:
            print(f"warning: {w}")
    if "verify" in out:
        print(f"verify: {verify_text}")
    return 0
