"""What ``sensitivity``, ``plan`` and ``export --budget`` share: the scan's arguments, the scan, the budget plan."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

from studio.commands._check import SCAN_KEYS
from studio.commands._cluster import open_cluster
from studio.core import hardware, safejson
from studio.core.calib.budget_job import budget_job, check_budget_job, same_size_types
from studio.core.calib.data import BUILTIN, calibration_sources, guess_chunks
from studio.core.calib.pipeline import calibrate_then_scan, scan_imatrix
from studio.core.calib.rounding import GPTQ_METHODS, PROBE_CHUNKS, corrected_scan, rounding_ratios
from studio.core.calib.scan_cache import default_cache_dir
from studio.core.calib.scan_settings import default_types
from studio.core.calib.sensitivity import (
    ScanSettings,
    Sensitivity,
    measure_plans,
)
from studio.core.calib.stored_types import with_stored_copies
from studio.core.errors import StudioError
from studio.core.model.rotate import RotatedCheckpoint, rotation_from, rotation_of
from studio.core.plan.allocate import allocate, check_budget, parse_budget
from studio.core.plan.job_estimate import calibration_estimate_line, estimate_calibrated, thin_calibration
from studio.core.plan.plan import with_method
from studio.core.quant.methods import method_info
from studio.core.quant.types import QTYPES
from studio.core.textfile import read_untrusted


def _types(spec: str | None) -> tuple[str, ...] | None:
    if not spec:
        return None
    return tuple(t.strip().upper() for t in spec.split(",") if t.strip())


def scanned_info(ck: Any, args: argparse.Namespace) -> Any:
    """The ``ModelInfo`` the scan and the plan work on: ``ck``'s, or with ``--rotate`` the rotated model's
    (``studio.core.model.rotate``: its tensors, an untied head included, and the rotation they are read
    through); a family the rotation does not cover is refused in one sentence."""
    rotation = rotation_from(bool(getattr(args, "rotate", False)), getattr(args, "rotate_seed", 0))
    return ck.info if rotation is None else RotatedCheckpoint(ck, rotation).info


def settings_of(args: argparse.Namespace, device: str | None = None, info: Any = None) -> Any:
    """The ``ScanSettings`` the arguments describe (without ``--types``: the default menu for ``info``'s
    model, which leaves out the ternary and 1-2-bit types unless it was trained for them); the device is
    ``--device``'s unless ``device`` names one."""
    device = device or getattr(args, "device", None) or "cpu"
    return ScanSettings(
        types=_types(args.types) or default_types(getattr(info, "config", None)),
        exact=bool(args.exact),
        n_ctx=args.scan_ctx,
        n_chunks=args.scan_chunks,
        calib_ctx=args.calib_ctx,
        calib_chunks=args.calib_chunks,
        device=device if device in ("cpu", "cuda", "mps") else "cpu",
    )


def calibration(args: argparse.Namespace, info: Any, ctx: Any, text: Any = None) -> Any:
    """The imatrix of the calibration text (``text``: a ``CalibrationText`` in its place, e.g. the text less
    its held-out end), kept in the scan cache folder (unless ``--no-cache``): the first step of
    ``calibrate_then_scan``, for the commands that also plan with it."""
    return scan_imatrix(
        info,
        text if text is not None else args.calib_text or BUILTIN,
        calib_ctx=args.calib_ctx,
        calib_chunks=args.calib_chunks,
        ctx=ctx,
        cache=not args.no_cache,
        device=settings_of(args, info=info).device,
    )[0]


def run_scan(args: argparse.Namespace, info: Any, ctx: Any, imatrix: Any = None, text: Any = None) -> Any:
    """The scan the arguments ask for: read from ``--scan``, or run on ``text`` (default the calibration
    text; cached unless ``--no-cache``)."""
    if getattr(args, "scan", None):
        what = f"The sensitivity scan {args.scan}"
        data = read_untrusted(args.scan, "sensitivity scan", StudioError, kind="json")
        scan = Sensitivity.from_dict(safejson.loads(data, what, StudioError, keys=SCAN_KEYS))
        if Path(scan.model).resolve() != Path(info.path).resolve():
            raise StudioError(f"The scan {args.scan} was made for {scan.model}, not for {info.path}.")
        rot = rotation_of(info)
        want = None if rot is None else rot.seed
        if scan.rotation != want:  # the other model's KLs (and, on a tied model, no untied head)
            made = "unrotated" if scan.rotation is None else f"rotated (seed {scan.rotation})"
            asked = "unrotated" if want is None else f"rotated (seed {want})"
            raise StudioError(
                f"The scan {args.scan} measured the {made} model and this plan is for the {asked} one; "
                "scan again with the same --rotate and --rotate-seed."
            )
        return scan
    executor = open_cluster(args)
    try:
        run = calibrate_then_scan(
            info,
            text if text is not None else args.calib_text or BUILTIN,
            settings_of(args, info=info),
            imatrix=imatrix,
            also=tuple(getattr(args, "scan_also", None) or ()),
            cache=not args.no_cache,
            ctx=ctx,
            executor=executor,
        )
        return run.scan
    finally:
        executor.close()


def _candidates(args: argparse.Namespace, types: tuple[str, ...]) -> tuple[str, ...]:
    """The scanned ``types`` less ``--exclude``."""
    excluded = set(_types(args.exclude) or ())
    unknown = [q for q in excluded if q not in types]
    if unknown:
        raise StudioError(f"--exclude names {unknown[0]}, which the scan did not measure.")
    cands = tuple(q for q in types if q not in excluded)
    if not cands:
        raise StudioError("--exclude leaves no qtype to choose from.")
    return cands


def check_budget_args(args: argparse.Namespace, info: Any, method: str | None = None) -> Any:
    """Refuse a malformed budget, or one below what the candidates allow, before calibrating or scanning;
    returns the all-F16 allocation when the budget holds the F16 file (then nothing needs a scan)."""
    budget = parse_budget(args.budget, ctx_len=args.ctx)
    types = settings_of(args, info=info).types
    bad = next((q for q in types if q not in QTYPES or QTYPES[q].is_float), None)
    if bad is not None:
        raise StudioError(f"--types names {bad}, which is not a quantized GGUF type.")
    return check_budget(
        info, budget, _candidates(args, types), exclude=_types(args.exclude) or (), method=method
    )


def _chunks_hint(args: argparse.Namespace, method: str) -> int:
    """The calibration's chunks: ``--calib-chunks``, else about as many as the text holds
    (``data.guess_chunks``; the built-in text follows the user's for the methods that mix it in)."""
    if args.calib_chunks:
        return int(args.calib_chunks)
    own = getattr(args, "calib_text", None)
    src = calibration_sources(own, method, own_only=bool(getattr(args, "calib_only", False)))
    return guess_chunks(src, int(args.calib_ctx))


def check_budget_memory(args: argparse.Namespace, info: Any, method: str | None, *, export: bool) -> Any:
    """The whole budget run's estimate (``studio.core.calib.budget_job``): refused in one sentence before
    any work when its peak is above the free RAM (``QUANT_STUDIO_FREE_RAM`` overrides the figure)."""
    m = method or "imatrix"
    chunks = _chunks_hint(args, m)
    settings = settings_of(args, info=info)
    # the export's GPTQ sweeps onto i-quant lattices cost per weight: guessed from the same-size preset
    guess = (
        same_size_types(info, parse_budget(args.budget, ctx_len=args.ctx))
        if export and "gptq" in method_info(m).name
        else None
    )

    def job_at(calib_ctx: int, calib_chunks: int) -> Any:
        return budget_job(
            info,
            m,
            calib_ctx=calib_ctx,
            calib_chunks=calib_chunks,
            settings=settings,
            heldout=not getattr(args, "no_heldout", False),
            export=export,
            scan=not getattr(args, "scan", None),
            plan_guess=guess,
        )

    job = job_at(int(args.calib_ctx), chunks)
    check_budget_job(job, hardware.ram()[1], int(args.calib_ctx), chunks, job_at)
    warn_thin_calibration(args, info, m)
    return job


def _on_cpu(args: argparse.Namespace) -> bool:
    # the estimates' times are a CPU's: on a GPU they would mislead
    return str(getattr(args, "device", "cpu") or "cpu").split(":")[0] not in ("cuda", "mps")


def budget_preface(args: argparse.Namespace, job: Any, *, export: bool) -> str:
    """The line said before a budget run's first step (``ProgressLine(preface=…)``): its whole estimate,
    ``Budget export: about 5.6 GB at its peak (…), about 1 h 40 min on a CPU (…).``; "" on a GPU."""
    if not _on_cpu(args):
        return ""
    return f"{'Budget export' if export else 'Budget plan'}: {job.describe()}."


def calibration_preface(
    args: argparse.Namespace, info: Any, methods: Any, lattice: dict[str, int] | None = None
) -> str:
    """The line said before a calibrated export's first step: the Export dialog's estimate
    (``job_estimate.calibration_estimate_line``) for the heaviest of ``methods`` (a GPTQ or AWQ one holds
    Hessians), with ``lattice`` (the plan's weights GPTQ rounds onto i-quant lattices); "" on a GPU, for
    round-to-nearest, or when the estimate is above the free RAM (the job is refused in one sentence instead)."""
    ms = sorted(set(methods), key=lambda m: ("gptq" not in m and "awq" not in m, m))
    if not ms or not method_info(ms[0]).calibrated or not _on_cpu(args):
        return ""
    cfg, ctx = dict(info.config or {}), int(args.calib_ctx)
    n = _chunks_hint(args, ms[0])
    m = method_info(ms[0])
    est = estimate_calibrated(cfg, ctx, n, hessian=m.hessian, head=m.hessian)
    free = hardware.ram()[1]
    if 0 < free < est.peak_bytes:
        return ""
    guessed = not args.calib_chunks  # from the text's size: the tokenizer decides the real count
    return calibration_estimate_line(cfg, ms[0], ctx, n, "cpu", guessed=guessed, lattice=lattice)


def warn_thin_calibration(args: argparse.Namespace, info: Any, method: str) -> None:
    """Say on stderr, before any work, when ``method`` would fit GPTQ to fewer calibration tokens than the
    model is wide (``job_estimate.thin_calibration``)."""
    line = thin_calibration(dict(info.config or {}), method, int(args.calib_ctx), _chunks_hint(args, method))
    if line:
        print(f"warning: {line}", file=sys.stderr)


def allocation(
    args: argparse.Namespace,
    info: Any,
    scan: Any,
    imatrix: Any,
    method: str | None,
    ctx: Any,
    text: Any = None,
) -> Any:
    """The budget plan for ``--budget`` (with ``--exclude`` and ``--measure``)."""
    budget = parse_budget(args.budget, ctx_len=args.ctx)
    cands = _candidates(args, scan.types)
    alloc = allocate(
        info,
        scan,
        budget,
        candidates=cands,
        imatrix=imatrix,
        method=method,
        exclude=_types(args.exclude) or (),
    )
    rot = rotation_of(info)
    if rot is not None:  # the plan names the rotated model's tensors: say how to export it
        note = f"Planned for the rotated model (--rotate --rotate-seed {rot.seed}): its plan file is exported with the same two options."
        alloc = dataclasses.replace(alloc, notes=(*alloc.notes, note))
    if method not in (None, "imatrix", "rtn"):
        # the plan carries its method, so the export rounds as planned (gptq, awq, awq+gptq); before, a
        # budget plan kept the default "rtn" and --method best wrote llama.cpp's unweighted rounding
        alloc = dataclasses.replace(alloc, plan=with_method(alloc.plan, info, method))
    if args.measure:
        with contextlib.closing(open_cluster(args)) as executor:
            (kl,) = measure_plans(
                info.path,
                [dict(alloc.plan.types)],
                text if text is not None else args.calib_text or BUILTIN,
                settings_of(args, info=info),
                imatrix=imatrix,
                ctx=ctx,
                executor=executor,
                rotation=rotation_of(info),
            )
        alloc = dataclasses.replace(alloc, measured_kl=kl)
    return alloc


def for_rounding(
    args: argparse.Namespace, info: Any, scan: Any, text: Any, method: str, ctx: Any
) -> tuple[Any, str]:
    """(the scan as the export's rounding will see it, a note): for gptq and awq+gptq each decoder tensor's
    KL is scaled by GPTQ's output error over the imatrix search's for its type, measured on a sample of
    layers (``studio.core.calib.rounding``); other methods keep the scan as measured. A GGUF original's
    stored types cost no error where the export copies them (``studio.core.calib.stored_types``)."""
    scan, note = _for_gptq(args, info, scan, text, method, ctx)
    scan, copied = with_stored_copies(scan, info.path, method)
    return scan, " ".join(n for n in (note, copied) if n)


def _for_gptq(
    args: argparse.Namespace, info: Any, scan: Any, text: Any, method: str, ctx: Any
) -> tuple[Any, str]:
    if method not in GPTQ_METHODS:
        return scan, ""
    ctx.report(0, 1, "Measuring GPTQ's rounding on a sample of layers")
    ratios = rounding_ratios(
        info.path,
        text if text is not None else args.calib_text or BUILTIN,
        _candidates(args, scan.types) if getattr(args, "budget", None) else scan.types,
        method=method,
        n_ctx=args.calib_ctx,
        # a sample: the first chunks of the text (half to fit GPTQ on, 4096 tokens at 512, half to judge
        # it on); the export itself calibrates on all of them
        n_chunks=min(args.calib_chunks or PROBE_CHUNKS, PROBE_CHUNKS),
        cache_dir=None if args.no_cache else default_cache_dir(),
        ctx=ctx,
        rotation=rotation_of(info),
    )
    if not ratios.ratios:
        return scan, ""
    shown = ", ".join(f"{q} ×{r:.2f}" for q, r in sorted(ratios.ratios.items(), key=lambda x: x[1]))
    note = (
        f"Planned for {method}'s rounding: each layer tensor's KL scaled by GPTQ's output error over the "
        f"imatrix search's for its type, measured on layers {', '.join(map(str, ratios.layers))}, on "
        f"calibration chunks GPTQ was not fitted to ({shown})."
    )
    return corrected_scan(scan, ratios), note
