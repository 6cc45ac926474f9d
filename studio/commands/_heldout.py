"""What ``plan --budget`` and ``export --budget`` share for held-out judgement: the options, the split of the
calibration text, and the judgement of the plan against llama.cpp's preset of the same size."""

from __future__ import annotations

import argparse
from typing import Any

from studio.commands._scan import _candidates, _types, settings_of
from studio.core.calib.calibrate import load_tokenizer
from studio.core.calib.data import BUILTIN, ChatFormat, calibration_sources, load_calibration, tokenize
from studio.core.calib.heldout import HELDOUT_CTX, UNGUARDED_NOTE, guarded_scan, preset_plans, texts
from studio.core.calib.heldout import judge as judge_plan
from studio.core.errors import CalibrationError, QuantizationError, StudioError
from studio.core.plan.allocate import parse_budget
from studio.core.quant.methods import check_method


def split(args: argparse.Namespace, info: Any, ctx: Any) -> tuple[Any, Any, str]:
    """(text the imatrix and the scan use, held-out text or None, a note): ``--heldout-text`` beside the whole
    calibration text, else the calibration text less its held-out end (None with ``--no-heldout``, or when
    the text is too short to spare a quarter). The note ("" when there is nothing to say) tells how much of
    the calibration is the user's own text and why there is no held-out judgement when that is so."""
    # gptq and awq+gptq calibrate on the user's text followed by the built-in text unless --calib-only
    method = check_method(getattr(args, "method", None) or "imatrix")
    own = getattr(args, "calib_text", None)
    src = calibration_sources(own, method, own_only=bool(getattr(args, "calib_only", False)))
    if getattr(args, "no_heldout", False):
        return src, None, ""
    if args.heldout_text:
        fit, held = texts(info.path, src, args.heldout_text, ctx=ctx)
        return fit, held, ""
    tok = load_tokenizer(info.path)
    whole = load_calibration(src, ChatFormat.of_tokenizer(tok, info.path.name), ctx)
    ctx_len = int(getattr(args, "calib_ctx", 512) or 512)
    need = max(2, getattr(args, "calib_chunks", None) or 2) * ctx_len  # what the calibration will cut
    try:
        fit, held = texts(info.path, whole, ctx=ctx)
        n_held = len(tokenize(tok, held))
        short = len(tokenize(tok, fit)) < need or n_held < 2 * HELDOUT_CTX
    except CalibrationError:  # too short to cut at all
        n_held, short = 0, True
    if short:
        # too short to spare a quarter: the whole text as before, and a note that says so
        why = (
            f"no held-out judgement: the quarter held out would be {n_held} tokens and a judgement needs "
            f"{2 * HELDOUT_CTX}; give --heldout-text FILE to judge the plan on another text"
        )
        return whole, None, share_note(tok, whole, own, why)
    return fit, held, share_note(tok, fit, own, "")


def share_note(tok: Any, data: Any, own: Any, why: str) -> str:
    """One sentence: how many of the calibration's tokens are the user's text (a mix adds the built-in one),
    and ``why`` (e.g. why there is no held-out judgement); "" without a text of the user's or anything to say."""
    if own is None or str(own) == BUILTIN:
        return f"Calibrated on the built-in text; {why}." if why else ""
    n_all = len(tokenize(tok, data))
    if not data.parts:
        return f"Calibrated on your text alone ({n_all:,} tokens); {why}." if why else ""
    mine = len(tokenize(tok, data.parts[0]))
    rest = " + ".join(p.name for p in data.parts[1:])
    pct = 100.0 * mine / max(1, n_all)
    return (
        f"Calibrated on {mine:,} tokens of your text and {n_all - mine:,} of {rest} ({pct:.1f} % yours)"
        + (f"; {why}." if why else ".")
    )


def judge(
    args: argparse.Namespace,
    info: Any,
    alloc: Any,
    held: Any,
    fit: Any,
    imatrix: Any,
    method: str,
    ctx: Any,
    presets: Any = None,
) -> Any:
    """The plan judged on ``held`` against the same-size preset (None without a held-out text)."""
    if held is None:
        return None
    if imatrix is None:
        raise StudioError("The held-out judgement needs the scan's imatrix.")
    ctx.report(0, 1, "Judging the plan on held-out text")
    return judge_plan(
        info.path,
        info,
        alloc,
        held,
        imatrix=imatrix,
        scan_text=fit,
        settings=settings_of(args, info=info),
        method=method,
        presets=presets,
        ctx=ctx,
    )


def guard(args: argparse.Namespace, info: Any, scan: Any, imatrix: Any) -> tuple[Any, Any, str]:
    """(the scan with the token embedding and output kept at least at the same-size preset's types, llama.cpp's
    presets for this model, the note that says so): see ``studio.core.calib.heldout.guard_edges``."""
    presets = preset_plans(info, imatrix=imatrix)
    budget = parse_budget(args.budget, ctx_len=args.ctx)
    cands, ex = _candidates(args, scan.types), _types(args.exclude) or ()
    scan, note = guarded_scan(info, scan, budget, presets, candidates=cands, exclude=ex)
    return scan, presets, note


def allocate_guarded(scan: Any, guarded: Any, note: str, allocate: Any) -> tuple[Any, str]:
    """(``allocate(guarded)``, ``note``), or where the guard leaves no plan within the budget (the candidate
    types cannot reach the preset's sizes elsewhere) ``allocate(scan)`` with the note that says so."""
    try:
        return allocate(guarded), note
    except QuantizationError:
        if guarded is scan:
            raise
        return allocate(scan), UNGUARDED_NOTE
