"""What ``plan --budget`` and ``export --budget`` share for held-out judgement: the options, the split of the
calibration text, and the judgement of the plan against llama.cpp's preset of the same size."""

from __future__ import annotations

import argparse
from typing import Any

from studio.commands._scan import _candidates, _types, settings_of
from studio.core.calib.calibrate import load_tokenizer
from studio.core.calib.data import ChatFormat, calibration_sources, load_calibration, tokenize
from studio.core.calib.heldout import HELDOUT_CTX, guarded_scan, preset_plans, texts
from studio.core.calib.heldout import judge as judge_plan
from studio.core.errors import StudioError
from studio.core.plan.allocate import parse_budget
from studio.core.quant.methods import check_method


def split(args: argparse.Namespace, info: Any, ctx: Any) -> tuple[Any, Any]:
    """(text the imatrix and the scan use, held-out text or None): ``--heldout-text`` beside the whole
    calibration text, else the calibration text less its held-out end (None with ``--no-heldout``, or when
    the text is too short to spare a quarter)."""
    # awq+gptq calibrates on the user's text followed by the built-in text unless --calib-only
    method = check_method(getattr(args, "method", None) or "imatrix")
    src = calibration_sources(
        getattr(args, "calib_text", None), method, own_only=bool(getattr(args, "calib_only", False))
    )
    if getattr(args, "no_heldout", False):
        return src, None
    if args.heldout_text:
        return texts(info.path, src, args.heldout_text, ctx=ctx)
    fit, held = texts(info.path, src, ctx=ctx)
    tok = load_tokenizer(info.path)
    ctx_len = int(getattr(args, "calib_ctx", 512) or 512)
    need = max(2, getattr(args, "calib_chunks", None) or 2) * ctx_len  # what the calibration will cut
    if len(tokenize(tok, fit)) < need or len(tokenize(tok, held)) < 2 * HELDOUT_CTX:
        # too short to spare a quarter: the whole text as before, no judgement
        return load_calibration(src, ChatFormat.of_tokenizer(tok, info.path.name), ctx), None
    return fit, held


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
