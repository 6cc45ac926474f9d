"""Held-out judgement of budget plans: does a plan chosen on one text still beat llama.cpp's preset on text
the scan never saw?

A budget plan is chosen from a sensitivity scan of the calibration text (``sensitivity``), so its
prediction and its measured KL on the scan's chunks both come from that text. The judge measures the
plan and llama.cpp's preset of the same size on a *held-out* text, every tensor quantized at once (the
scan's plan streams, ``measure_plans``): the last quarter of the calibration text, cut off before the
imatrix and the scan see it (``split_text``), or a second text the user gives (``--heldout-text``),
ideally of another kind. A plan whose held-out KL is not below the preset's is never offered as better:
``Judgement.verdict`` says so in one sentence and recommends the preset with calibrated rounding.

The guard (``guard_edges``): the token embedding and output head are kept at least at the types
llama.cpp's same-size preset gives them. The scan perturbs the embedding only in the rows of the tokens
its chunks hold (a few hundred of tens of thousands), so text of another kind meets rows it never
measured; in the issue's case the allocator traded it down to Q5_0 for many small gains elsewhere. On the
demo with prose → code (``bench/heldout.py``) it was not under-estimated (code / scan 0.66–0.86) while early
layers' tensors grew 1.3–1.7×: the guard is a precaution, the layer-wise shift is what remains.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from studio.core.calib.calibrate import load_tokenizer
from studio.core.calib.data import CalibrationText, ChatFormat, load_calibration, mix, tokenize
from studio.core.calib.sensitivity import ScanSettings, measure_plans, measure_plans_on
from studio.core.errors import CalibrationError
from studio.core.gguf.layout import layout
from studio.core.jobs import JobContext, null_context
from studio.core.model.rotate import Rotation, rotation_of
from studio.core.plan.allocate import BudgetKind, allocate
from studio.core.plan.gguf_file import export_file_bytes
from studio.core.plan.plan import plan_from_preset
from studio.core.quant.types import fallback_type, tensor_bytes
from studio.core.units import format_bytes

HELDOUT_SHARE = 0.25  # the end of the calibration text kept from the imatrix and the scan
HELDOUT_CTX = 128  # tokens per held-out chunk (as the scan's chunks)
HELDOUT_CHUNKS = 16  # at most this many chunks (2048 tokens)
LLAMA_PRESETS = (
    # the i-quant presets too (issue 37): a budget of llama.cpp's IQ3_XXS file is judged against that file,
    # not told "no llama.cpp preset fits"; the ternary and 1-2-bit ones are for models trained for them
    "IQ1_S",
    "IQ1_M",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ2_M",
    "Q2_K_S",
    "Q2_K",
    "IQ3_XXS",
    "IQ3_XS",
    "IQ3_S",
    "Q3_K_S",
    "IQ3_M",
    "Q3_K_M",
    "Q3_K_L",
    "IQ4_XS",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "Q8_0",
)
BEST_METHOD = "awq+gptq"  # the calibrated rounding recommended with a preset


def split_text(
    data: CalibrationText, share: float = HELDOUT_SHARE
) -> tuple[CalibrationText, CalibrationText]:
    """``data`` cut in two at a paragraph (or line) break near ``1 − share`` of its characters: (the part
    to calibrate and scan on, the held-out end)."""
    if not 0.0 < share < 1.0:
        raise CalibrationError(f"The held-out share must lie between 0 and 1, not {share}.")
    if data.parts:
        # a mix (the user's text, then the built-in one): the held-out end is cut from the first part only,
        # so the judgement is on the user's own kind of text and none of it is calibrated on
        fit, held = split_text(data.parts[0], share)
        return mix([fit, *data.parts[1:]]), held
    text = data.text
    at = int(len(text) * (1.0 - share))
    cut = -1
    for sep in ("\n\n", "\n", " "):
        # the break nearest the cut, within a tenth of the text either side
        lo, hi = max(0, at - len(text) // 10), min(len(text), at + len(text) // 10)
        before, after = text.rfind(sep, lo, at), text.find(sep, at, hi)
        cands = [c for c in (before, after) if c > 0]
        if cands:
            cut = min(cands, key=lambda c: abs(c - at))
            break
    cut = cut if cut > 0 else at
    fit, held = text[:cut], text[cut:].lstrip()
    if not fit.strip() or not held.strip():
        raise CalibrationError(f"The calibration text {data.name} is too short to keep a part held out.")
    return (
        CalibrationText(f"{data.name} (first {100 - round(100 * share)} %)", fit, data.parse_special),
        CalibrationText(f"{data.name} (held-out last {round(100 * share)} %)", held, data.parse_special),
    )


def texts(
    model_dir: str | os.PathLike[str],
    text: Any,
    heldout: Any = None,
    *,
    share: float = HELDOUT_SHARE,
    ctx: JobContext | None = None,
) -> tuple[CalibrationText, CalibrationText]:
    """(calibration text, held-out text) for ``model_dir``: ``heldout`` (a file, ``"builtin"`` or a
    ``CalibrationText``) beside the whole of ``text``, or without it the end of ``text`` cut off."""

    def load(src: Any) -> CalibrationText:
        if isinstance(src, CalibrationText):
            return src
        tok = load_tokenizer(model_dir)
        return load_calibration(src, ChatFormat.of_tokenizer(tok, os.path.basename(str(model_dir))), ctx)

    data = load(text)
    if heldout is not None:
        return data, load(heldout)
    return split_text(data, share)


def heldout_settings(base: Any = None) -> Any:
    """The ``ScanSettings`` held-out measurements run with: the scan's types, chunks of ``HELDOUT_CTX``."""
    st = base or ScanSettings()
    return dataclasses.replace(
        st, exact=True, n_ctx=HELDOUT_CTX, n_chunks=HELDOUT_CHUNKS, calib_ctx=HELDOUT_CTX, calib_chunks=None
    )


@dataclass(frozen=True)
class PresetPoint:
    """A llama.cpp preset on the held-out axis: its file size and its KL on the held-out text."""

    name: str
    file_bytes: int
    heldout_kl: float
    types: Mapping[str, str]


@dataclass(frozen=True)
class Judgement:
    """A budget plan judged on held-out text beside llama.cpp's preset of the same size."""

    predicted_kl: float  # the scan's sum over tensors
    scan_kl: float | None  # the plan on the scan's chunks, every tensor quantized at once
    heldout_kl: float  # the plan on the held-out text
    heldout: str  # the held-out text's name
    heldout_tokens: int
    preset: PresetPoint | None  # the largest preset whose file fits the plan's budget (None: none fits)
    method: str = "imatrix"
    seconds: float = 0.0  # what the judgement cost (its one run)

    @property
    def beats_preset(self) -> bool | None:
        """Whether the plan's held-out KL is below the preset's (None without a preset to compare)."""
        if self.preset is None:
            return None
        return self.heldout_kl < self.preset.heldout_kl

    @property
    def ratio(self) -> float | None:
        """The plan's held-out KL over the preset's."""
        if self.preset is None or not self.preset.heldout_kl:
            return None
        return self.heldout_kl / self.preset.heldout_kl

    @property
    def verdict(self) -> str:
        """One sentence: how the plan fares on held-out text against the preset (and what to do if it loses)."""
        if self.preset is None:
            return (
                f"Held-out KL {self.heldout_kl:.4f} on {self.heldout}; no llama.cpp preset fits this budget."
            )
        p = self.preset
        if self.beats_preset:
            return (
                f"On held-out text ({self.heldout}) the plan's KL {self.heldout_kl:.4f} is "
                f"{100 * (1 - (self.ratio or 0)):.0f} % below llama.cpp's {p.name} ({p.heldout_kl:.4f}, "
                f"{format_bytes(p.file_bytes)})."
            )
        return (
            f"No budget plan beats llama.cpp's {p.name} ({format_bytes(p.file_bytes)}) on held-out text "
            f"(KL {self.heldout_kl:.4f} against {p.heldout_kl:.4f}); use --preset {p.name} --method "
            f"{BEST_METHOD} (the preset with calibrated rounding) instead."
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``plan --json``, ``export --json``)."""
        return {
            "predicted_kl": self.predicted_kl,
            "scan_kl": self.scan_kl,
            "heldout_kl": self.heldout_kl,
            "heldout": self.heldout,
            "heldout_tokens": self.heldout_tokens,
            "seconds": round(self.seconds, 1),
            "preset": None
            if self.preset is None
            else {
                "name": self.preset.name,
                "file_bytes": self.preset.file_bytes,
                "heldout_kl": self.preset.heldout_kl,
            },
            "beats_preset": self.beats_preset,
            "ratio": self.ratio,
            "verdict": self.verdict,
            "recommend": None
            if self.beats_preset is not False or self.preset is None
            else {"preset": self.preset.name, "method": BEST_METHOD},
        }


def check_judged(plan_kl: float, preset: PresetPoint | None) -> None:
    """CalibrationError in one sentence when the plan's or the preset's held-out KL is not finite: a NaN
    compares as neither better nor worse, so a judgement on it says nothing."""
    if not math.isfinite(plan_kl):
        raise CalibrationError(
            f"The plan's KL on held-out text came out {plan_kl}; its file is not judged and should not be used."
        )
    if preset is not None and not math.isfinite(preset.heldout_kl):
        raise CalibrationError(f"llama.cpp's {preset.name} measured {preset.heldout_kl} on held-out text.")


def preset_plans(
    info: Any, presets: Sequence[str] = LLAMA_PRESETS, *, imatrix: Any = None
) -> list[tuple[str, int, dict[str, str]]]:
    """(name, exact file bytes, HF name → qtype) of each llama.cpp preset for ``info``, smallest file first
    (as the export writes it with an imatrix: llama.cpp then guards a few tensors)."""
    out = []
    for name in presets:
        plan = plan_from_preset(info, name, imatrix=True)
        out.append((name, export_file_bytes(info, plan, imatrix=imatrix), dict(plan.types)))
    return sorted(out, key=lambda x: x[1])


SAME_SIZE = 1.005  # a preset within 0.5 % above the budget is "the same size" (metadata differs by a few kB)


def same_size_preset(
    presets: Sequence[tuple[str, int, Mapping[str, str]]], limit_bytes: int
) -> tuple[str, int, Mapping[str, str]] | None:
    """The largest preset whose file fits ``limit_bytes`` (within ``SAME_SIZE``: llama.cpp's own file at a
    budget of its size may be a few kB smaller than the studio's with its metadata; None when none fits)."""
    fit = [p for p in presets if p[1] <= limit_bytes * SAME_SIZE]
    return max(fit, key=lambda p: p[1]) if fit else None


def measure_heldout(
    model: str | os.PathLike[str],
    plans: Sequence[Mapping[str, str]],
    heldout: CalibrationText,
    *,
    imatrix: Mapping[str, Any] | None,
    settings: Any = None,
    ctx: JobContext | None = None,
    rotation: Rotation | None = None,
) -> tuple[tuple[float, ...], int]:
    """(KL of each plan on ``heldout``, tokens measured), every tensor quantized at once, in one run
    (``rotation``: on the model as ``export --rotate`` writes it)."""
    st, n_tok = heldout_chunks(model, heldout, settings)
    kls = measure_plans(
        model, list(plans), heldout, st, imatrix=imatrix, ctx=ctx or null_context(), rotation=rotation
    )
    return kls, n_tok


def heldout_chunks(
    model: str | os.PathLike[str], heldout: CalibrationText, settings: Any = None
) -> tuple[Any, int]:
    """(the settings that measure ``heldout``: up to ``HELDOUT_CHUNKS`` chunks of ``HELDOUT_CTX``, tokens
    measured)."""
    st = heldout_settings(settings)
    n = len(tokenize(load_tokenizer(model), heldout))
    chunks = max(2, min(HELDOUT_CHUNKS, n // st.calib_ctx))
    return dataclasses.replace(st, n_chunks=chunks), chunks * st.n_ctx


def judge(
    model: str | os.PathLike[str],
    info: Any,
    alloc: Any,
    heldout: CalibrationText,
    *,
    imatrix: Mapping[str, Any] | None,
    scan_text: Any = None,
    settings: Any = None,
    method: str = "imatrix",
    presets: Sequence[tuple[str, int, Mapping[str, str]]] | None = None,
    ctx: JobContext | None = None,
) -> Judgement:
    """Measure ``alloc``'s plan (an ``Allocation``) and the same-size preset on ``heldout``; with
    ``scan_text`` also the plan on the scan's chunks (unless the allocation already carries it). A rotated
    ``info`` (``studio.core.model.rotate``) is measured rotated, the preset too."""
    ctx = ctx or null_context()
    rot = rotation_of(info)
    t0 = time.monotonic()
    pres = preset_plans(info, imatrix=imatrix) if presets is None else list(presets)
    preset = (
        same_size_preset(pres, int(alloc.limit_bytes))
        if alloc.budget.kind.value == "file"
        else (same_size_preset(pres, int(alloc.file_bytes)))
    )
    plans = [dict(alloc.plan.types)] + ([dict(preset[2])] if preset is not None else [])
    scan_kl = alloc.measured_kl
    base = settings or ScanSettings()
    held_st, n_tok = heldout_chunks(model, heldout, base)
    if scan_kl is None and scan_text is not None and base.n_ctx == held_st.n_ctx:
        # one run: the plans' tensors quantized once, the held-out and the scan's chunks side by side
        kls, scan_kls = measure_plans_on(
            model, plans, [(heldout, held_st), (scan_text, base)], imatrix=imatrix, ctx=ctx, rotation=rot
        )
        scan_kl = scan_kls[0]
    else:
        kls, n_tok = measure_heldout(
            model, plans, heldout, imatrix=imatrix, settings=settings, ctx=ctx, rotation=rot
        )
        if scan_kl is None and scan_text is not None:
            (scan_kl,) = measure_plans(
                model, [dict(alloc.plan.types)], scan_text, settings, imatrix=imatrix, ctx=ctx, rotation=rot
            )
    point = None if preset is None else PresetPoint(preset[0], preset[1], kls[1], dict(preset[2]))
    check_judged(kls[0], point)
    return Judgement(
        alloc.predicted_kl, scan_kl, kls[0], heldout.name, n_tok, point, method, time.monotonic() - t0
    )


def preset_heldout_points(
    model: str | os.PathLike[str],
    info: Any,
    heldout: CalibrationText,
    *,
    imatrix: Mapping[str, Any] | None,
    presets: Sequence[str] = LLAMA_PRESETS,
    settings: Any = None,
    ctx: JobContext | None = None,
) -> tuple[PresetPoint, ...]:
    """llama.cpp's presets on the held-out axis: each one's file size and KL on ``heldout`` (one run; a
    rotated ``info``'s presets rotated too)."""
    pres = preset_plans(info, presets, imatrix=imatrix)
    kls, _ = measure_heldout(
        model, [p[2] for p in pres], heldout, imatrix=imatrix, settings=settings, ctx=ctx,
        rotation=rotation_of(info),
    )  # fmt: skip
    return tuple(PresetPoint(n, b, k, dict(t)) for (n, b, t), k in zip(pres, kls, strict=True))


def judge_against_points(
    model: str | os.PathLike[str],
    types: Mapping[str, str],
    limit_bytes: int,
    heldout: CalibrationText,
    points: Sequence[PresetPoint],
    *,
    imatrix: Mapping[str, Any] | None,
    predicted_kl: float | None,
    scan_text: Any,
    settings: Any = None,
    method: str = "imatrix",
    ctx: JobContext | None = None,
    rotation: Rotation | None = None,
) -> tuple[float, Judgement]:
    """(the plan's KL on the scan's chunks, its ``Judgement``) for a plan (HF name → qtype) whose presets
    were measured on ``heldout`` already (``preset_heldout_points``): one run measures the plan on the
    held-out and the scan's chunks together (two when their chunk lengths differ); ``rotation``: on the
    model as ``export --rotate`` writes it."""
    base = settings or ScanSettings()
    held_st, n_tok = heldout_chunks(model, heldout, base)
    if base.n_ctx == held_st.n_ctx:
        (held_kl,), (scan_kl,) = measure_plans_on(
            model, [dict(types)], [(heldout, held_st), (scan_text, base)], imatrix=imatrix, ctx=ctx,
            rotation=rotation,
        )  # fmt: skip
    else:
        one = {"imatrix": imatrix, "ctx": ctx, "rotation": rotation}
        (held_kl,) = measure_plans(model, [dict(types)], heldout, held_st, **one)
        (scan_kl,) = measure_plans(model, [dict(types)], scan_text, base, **one)
    fit = [p for p in points if p.file_bytes <= limit_bytes * SAME_SIZE]
    preset = max(fit, key=lambda p: p.file_bytes) if fit else None
    check_judged(held_kl, preset)
    return scan_kl, Judgement(predicted_kl or 0.0, scan_kl, held_kl, heldout.name, n_tok, preset, method)


# ------------------------------------------------------------------------------------------ the guard

EDGE_TENSORS = ("token_embd.weight", "output.weight")  # rows picked by token id: the scan sees few of them


def _floor_cost(t: Any, q: str, n_per_row: int | None) -> tuple[str, int, float | None]:
    """(the type ``t`` really gets when ``q`` is asked, its bytes, its measured error or None): the scan's
    own candidate when it has one (it was scanned as written, fallback applied), else ``q``'s fallback
    for rows of ``n_per_row`` sized from the tensor's weights."""
    c = t.by_type.get(q)
    eff = c.effective if c is not None else q
    if c is None and n_per_row:
        eff = fallback_type(q, n_per_row).qtype
    c = c if c is not None else next((v for v in t.by_type.values() if v.effective == eff), None)
    if c is not None:
        err = c.error if c.usable and c.error is not None and math.isfinite(c.error) else None
        return eff, c.bytes, err
    shape = (t.n_params // n_per_row, n_per_row) if n_per_row else (t.n_params,)
    return eff, tensor_bytes(eff, shape), None


def at_least_as_good(c: Any, floor: tuple[str, int, float | None]) -> bool:
    """Whether candidate ``c`` (a ``TypeCost``) is at least as good as ``floor`` (``_floor_cost``): by
    measured error where both were measured (the error is what "good" means; bits mislead across
    families, and Q2_0's 2.5 bits rank above IQ2's while its error is a collapse), else by bytes with the
    real fallback applied. An unusable candidate never is."""
    if not c.usable:
        return False
    eff, nbytes, err = floor
    if c.effective == eff:
        return True
    if err is not None and c.error is not None and math.isfinite(c.error):
        return c.error <= err
    return c.bytes >= nbytes


def guard_edges(scan: Any, floor: Mapping[str, str], n_per_row: Mapping[str, int] | None = None) -> Any:
    """``scan`` with the token embedding and the output head (``EDGE_TENSORS``) limited to candidates at
    least as good as the type ``floor`` gives them (HF name → qtype, e.g. llama.cpp's preset of the same
    size; ``at_least_as_good``: measured error, else bytes with the fallback that the row length
    ``n_per_row[name]`` gives).

    Why: the scan perturbs the embedding only in the rows of the tokens its chunks hold (a few hundred of
    tens of thousands), and a tied head only at their positions, so text of another kind meets rows and
    contexts it never measured (``bench/heldout.py`` compares each tensor's KL on the scan's chunks with
    its KL on held-out text). The allocator may still give them more.
    """
    rows = dict(n_per_row or {})
    tensors = []
    for t in scan.tensors:
        q = floor.get(t.name)
        if t.gguf_name not in EDGE_TENSORS or q is None:
            tensors.append(t)
            continue
        least = _floor_cost(t, q, rows.get(t.name))
        kept = {k: c for k, c in t.by_type.items() if at_least_as_good(c, least)}
        if not kept:  # nothing as good was scanned: keep the largest usable candidate
            usable = [c for c in t.by_type.values() if c.usable] or list(t.by_type.values())
            best = max(usable, key=lambda c: c.bytes)
            kept = {best.qtype: best}
        tensors.append(dataclasses.replace(t, by_type=kept))
    return dataclasses.replace(scan, tensors=tuple(tensors))


def guard_for(
    scan: Any, limit_bytes: int, presets: Sequence[tuple[str, int, Mapping[str, str]]], info: Any = None
) -> tuple[Any, str]:
    """``scan`` guarded (``guard_edges``) at the types llama.cpp's preset of ``limit_bytes`` gives the token
    embedding and output head, and the note that says so ("" and the scan unchanged when no preset fits)."""
    preset = same_size_preset(presets, limit_bytes)
    if preset is None:
        return scan, ""
    edges = {
        t.name: preset[2][t.name] for t in scan.tensors if t.gguf_name in EDGE_TENSORS and t.name in preset[2]
    }
    if not edges:
        return scan, ""
    kinds = ", ".join(
        f"{next(t.gguf_name for t in scan.tensors if t.name == n)} {q}" for n, q in edges.items()
    )
    note = (
        f"Kept at least at llama.cpp's {preset[0]} types ({kinds}): the scan sees only the embedding rows of "
        "its calibration tokens, and text of another kind needs the rest."
    )
    rows = {} if info is None else {tm.hf_name: tm.n_per_row for tm in layout(info).tensors}
    return guard_edges(scan, edges, rows), note


UNGUARDED_NOTE = (
    "The token embedding and output could not be kept at llama.cpp's same-size preset's types within this "
    "budget with these candidate types; planned without that guard."
)


def guarded_scan(
    info: Any,
    scan: Any,
    budget: Any,
    presets: Sequence[tuple[str, int, Mapping[str, str]]],
    *,
    candidates: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
) -> tuple[Any, str]:
    """``guard_for`` at ``budget`` (an ``allocate.Budget``): a file budget's bytes, else the file size of
    the unguarded plan."""
    if budget.kind is BudgetKind.FILE:
        limit = int(budget.value)
    else:
        limit = allocate(info, scan, budget, candidates=candidates, exclude=exclude).file_bytes
    return guard_for(scan, limit, presets, info)


__all__ = [
    "BEST_METHOD",
    "EDGE_TENSORS",
    "HELDOUT_SHARE",
    "UNGUARDED_NOTE",
    "LLAMA_PRESETS",
    "Judgement",
    "check_judged",
    "PresetPoint",
    "heldout_chunks",
    "heldout_settings",
    "judge",
    "judge_against_points",
    "measure_heldout",
    "preset_heldout_points",
    "preset_plans",
    "at_least_as_good",
    "guard_edges",
    "guard_for",
    "guarded_scan",
    "same_size_preset",
    "split_text",
    "texts",
]
