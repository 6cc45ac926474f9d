"""A budget export's whole job, known before it starts: each step's peak memory and time from the model's
shapes, the calibration size and the method, so that a job whose peak will not fit is refused in one
sentence before its first step, not at its fifth after an hour of work.

The steps are those ``export --budget`` runs one after another: the calibration (the imatrix), the
sensitivity scan, GPTQ's rounding probe (gptq and awq+gptq), the held-out judgement, the export with its
method and llama.cpp's last word. The job's peak is the largest step's; its time is their sum. Memory comes
from ``studio.core.plan.job_estimate`` (each step is a layer-wise run); time from each step's work in the
units its progress bar weighs (``scan_streams.scan_work``, GPTQ's and AWQ's sweeps) at rates measured on a
2-core desktop CPU (a rough guide: a GPU takes the matrix products, a faster CPU all of it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from studio.core.calib.heldout import HELDOUT_CHUNKS, HELDOUT_CTX, LLAMA_PRESETS
from studio.core.calib.rounding import GPTQ_METHODS, PROBE_CHUNKS, PROBE_ROWS, probe_layers
from studio.core.calib.scan_proxy import measure_sets
from studio.core.calib.scan_settings import ScanSettings
from studio.core.calib.scan_streams import MATMULS, ROUND, scan_work
from studio.core.errors import CalibrationError
from studio.core.plan.job_estimate import (
    LATTICE_SECONDS,
    JobEstimate,
    estimate_calibrated,
    fit_remedy,
    lattice_seconds,
    lattice_weights,
    layer_shapes,
    smaller_calibration,
)
from studio.core.plan.plan import plan_from_preset
from studio.core.plan.scan import scan_targets, stored_narrow_head
from studio.core.quant.methods import method_info
from studio.core.units import format_bytes

__all__ = ["BudgetJob", "budget_job", "check_budget_job", "same_size_types"]

# rates on the 2-core machine (multiply-add equivalents per second), fitted on the 8B fixture's steps: the
# rounding kernels (numba, one thread), torch's matrix products (all threads), GPTQ's sweeps of a whole matrix
# and of the probe's 512-row samples (small products run far from the machine's peak), AWQ's grid
_RATES = {ROUND: 2.4e10, MATMULS: 5.0e10, "gptq": 1.6e10, "probe": 4.5e9, "awq": 3.0e10}
_AWQ_GRID = 21  # α points of AWQ's grid (``studio.core.calib.awq``)
_WRITE_COST = 250  # MAC-equivalents per value of the export's rounding (its threads share the tensors)
_HEAD_TYPES = ("Q6_K", "Q6_K", "Q4_K", "Q4_K")  # the head's types in the judged plans, as presets give them


@dataclass(frozen=True)
class BudgetJob:
    """The steps of a budget export, in order, each with its estimate."""

    steps: tuple[tuple[str, JobEstimate], ...]

    @property
    def peak(self) -> tuple[str, JobEstimate]:
        """(the step, its estimate) that holds the job's peak memory."""
        return max(self.steps, key=lambda s: s[1].peak_bytes)

    @property
    def seconds(self) -> float:
        """The whole job's time: every step's, one after another."""
        return sum(e.seconds for _, e in self.steps)

    def describe(self) -> str:
        """One line: ``about 5.6 GB at its peak (the held-out judgement: the output head), about 1 h 40 min
        on a CPU (the scan 9 min, GPTQ's probe 31 min, …)``."""
        step, est = self.peak
        parts = ", ".join(f"{name} {_duration(e.seconds)}" for name, e in self.steps)
        return (
            f"about {format_bytes(est.peak_bytes)} at its peak ({step}: {est.phase}), about "
            f"{_duration(self.seconds)} on a CPU ({parts})"
        )


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    mins = round(seconds / 60)
    return f"{mins // 60} h {mins % 60} min" if mins >= 60 else f"{mins} min"


def _passes(config: dict[str, Any], tokens: int, twice: bool) -> float:
    sh = layer_shapes(config)
    return (2 if twice else 1) * tokens * (sh.layers * sh.layer_params + sh.vocab * sh.hidden)


def _write_seconds(config: dict[str, Any]) -> float:
    """Rounding and writing every tensor of the file (the plain export: 17 s for the 2-layer 8B fixture)."""
    sh = layer_shapes(config)
    return (sh.layers * sh.layer_params + 2 * sh.vocab * sh.hidden) * _WRITE_COST / _RATES[ROUND]


def _export_seconds(
    config: dict[str, Any], method: str, tokens: int, lattice: Mapping[str, int] | None = None
) -> float:
    """The export's time: writing the file, and for a calibrated method its passes, GPTQ's sweeps (rows ×
    cols² and 0.3 cols³ per input, the head too; ``lattice``: the weights it rounds onto i-quant lattices,
    which cost per weight) and AWQ's grid (α points × rows × cols × (cols + 64))."""
    sh = layer_shapes(config)
    mats, layers, vocab, hidden = sh.mats, sh.layers, sh.vocab, sh.hidden
    m = method_info(method)
    secs = _write_seconds(config)
    if m.hessian:
        secs += _passes(config, tokens, True) / _RATES[MATMULS]
    if "gptq" in method:
        per_layer = sum(r * c * c for r, c in mats) + sum(0.3 * n**3 for n in sh.inputs)
        head = vocab * hidden * hidden + 0.3 * hidden**3
        secs += (layers * per_layer + head) / _RATES["gptq"] + lattice_seconds(lattice or {})
    if "awq" in method:
        secs += layers * sum(_AWQ_GRID * r * c * (c + 64) for r, c in mats) / _RATES["awq"]
    return secs


def _probe_seconds(config: dict[str, Any], types: Sequence[str], tokens: int) -> float:
    """GPTQ's rounding probe: each sampled layer's linears rounded to every type by GPTQ on 512 rows (onto an
    i-quant lattice at its per-weight cost)."""
    sh = layer_shapes(config)
    picked = len(probe_layers(sh.layers))
    n_types = len(types)
    sweep = sum(n_types * min(r, PROBE_ROWS) * c * c for r, c in sh.mats) + sum(0.3 * n**3 for n in sh.inputs)
    sampled = sum(min(r, PROBE_ROWS) * c for r, c in sh.mats)
    lattice = lattice_seconds(dict.fromkeys((q for q in types if q in LATTICE_SECONDS), sampled))
    return picked * (sweep / _RATES["probe"] + lattice) + _passes(config, tokens, True) / _RATES[MATMULS]


def _scan_seconds(info: Any, st: ScanSettings, tokens: int, plans: int = 0) -> float:
    targets, _ = scan_targets(info, st.types)
    n_layers = max([t.layer + 1 for t in targets if t.layer is not None], default=0)
    if plans:  # the held-out judgement: plans' streams only, the head rounded whole to each plan's type
        head = [t.name for t in targets if t.kind == "output"]
        kinds = [{h: q for h in head} for q in _HEAD_TYPES[:plans]]
        work = scan_work(targets, tokens, exact={}, plans=kinds)
    else:
        exact, errors, _ = measure_sets(targets, st, n_layers)
        work = scan_work(targets, tokens, exact=exact, errors=errors)
    return sum(cost / _RATES[kind] for kind, cost in work.items())


def budget_job(
    info: Any,
    method: str,
    *,
    calib_ctx: int,
    calib_chunks: int,
    settings: ScanSettings | None = None,
    heldout: bool = True,
    export: bool = True,
    scan: bool = True,
    device: str | None = None,
    plan_guess: Mapping[str, str] | None = None,
) -> BudgetJob:
    """The estimate of ``export --budget`` (``export=False``: ``plan --budget``) with ``method`` on the model
    of ``info``, calibrated on ``calib_chunks`` chunks of ``calib_ctx`` tokens; ``scan=False``: the scan is
    given (``--scan``); ``device`` defaults to the settings'; ``plan_guess`` (HF name → qtype): the types the
    plan will likely have, before it is made (the same-size preset's), for GPTQ's per-weight lattice sweeps."""
    cfg = dict(info.config or {})
    st = settings or ScanSettings()
    device = device or st.device
    tokens = calib_ctx * calib_chunks
    narrow = stored_narrow_head(info)
    steps: list[tuple[str, JobEstimate]] = []

    def streams(n_ctx: int, n: int) -> JobEstimate:  # a run of the scan's consumer (the scan, the judgement)
        return estimate_calibrated(
            cfg, n_ctx, n, hessian=False, head=True, device=device, outer=True, narrow_head=narrow
        )

    est = estimate_calibrated(cfg, calib_ctx, calib_chunks, hessian=False, head=False, device=device)
    steps.append(("the calibration", est))
    if scan:
        est = streams(st.n_ctx, st.n_chunks)
        secs = _scan_seconds(info, st, st.n_ctx * st.n_chunks)
        steps.append(("the scan", JobEstimate(est.peak_bytes, secs, est.phase)))
    method = method_info(method).name  # "best" is awq+gptq
    if method in GPTQ_METHODS:
        n = min(calib_chunks or PROBE_CHUNKS, PROBE_CHUNKS)
        est = estimate_calibrated(cfg, calib_ctx, n, hessian=True, head=False, device=device)
        secs = _probe_seconds(cfg, st.types, calib_ctx * n)
        steps.append(("GPTQ's probe", JobEstimate(est.peak_bytes, secs, est.phase)))
    if heldout:
        # the plan and the same-size presets, each a stream through every layer to the head, on (at most)
        # HELDOUT_CHUNKS held-out chunks and the scan's: one run where their lengths agree, else two
        runs = [(HELDOUT_CTX, HELDOUT_CHUNKS + st.n_chunks)]
        if st.n_ctx != HELDOUT_CTX:
            runs = [(HELDOUT_CTX, HELDOUT_CHUNKS), (st.n_ctx, st.n_chunks)]
        est = max((streams(n_ctx, n) for n_ctx, n in runs), key=lambda e: e.peak_bytes)
        secs = sum(_scan_seconds(info, st, n_ctx * n, plans=4) for n_ctx, n in runs)
        steps.append(("the held-out judgement", JobEstimate(est.peak_bytes, secs, est.phase)))
    if export:
        m = method_info(method)
        est = estimate_calibrated(
            cfg, calib_ctx, calib_chunks, hessian=m.hessian, head=m.hessian, device=device
        )
        lattice = lattice_weights(info, plan_guess, lambda _name: True) if plan_guess else None
        secs = _export_seconds(cfg, method, tokens, lattice)
        steps.append(("the export", JobEstimate(est.peak_bytes, secs, est.phase)))
        est = estimate_calibrated(cfg, 256, 1, hessian=False, head=True, device=device)
        # the original's logits layer by layer, the same-size preset written, llama.cpp on both files
        secs = 2 * _passes(cfg, 256, False) / _RATES[MATMULS] + _write_seconds(cfg)
        steps.append(("llama.cpp's last word", JobEstimate(est.peak_bytes, secs, est.phase)))
    return BudgetJob(tuple(steps))


def same_size_types(info: Any, budget: Any) -> Mapping[str, str] | None:
    """The types of llama.cpp's largest preset whose tensor data fits a file ``budget`` (``allocate.Budget``):
    what a plan of that size will likely hold before it is made (``budget_job(plan_guess=…)``); None for a
    bits-per-weight or memory budget, or when no preset fits. A guess for the time estimate: the tensor data
    alone, since the exact file (its metadata, a 151,936-token vocabulary) takes seconds a preset to count."""
    if getattr(getattr(budget, "kind", None), "value", None) != "file":
        return None
    plans = [plan_from_preset(info, name, imatrix=True) for name in LLAMA_PRESETS]
    fit = [(p.summary(info).total_bytes, p) for p in plans]
    fit = [(n, p) for n, p in fit if n <= budget.value]
    return dict(max(fit, key=lambda x: x[0])[1].types) if fit else None


def check_budget_job(
    job: BudgetJob,
    free_bytes: int,
    calib_ctx: int,
    calib_chunks: int,
    job_at: Callable[[int, int], BudgetJob],
) -> None:
    """Refuse (CalibrationError, one sentence) a budget export whose estimated peak is above ``free_bytes``,
    before its first step, saying which smaller calibration would fit (``job_at(ctx, chunks)``: the same job
    at another calibration size)."""
    step, est = job.peak
    if free_bytes <= 0 or est.peak_bytes <= free_bytes:
        return
    size = smaller_calibration(
        lambda c, k: job_at(c, k).peak[1].peak_bytes, free_bytes, calib_ctx, calib_chunks
    )
    what = "budget export" if any(n == "the export" for n, _ in job.steps) else "budget plan"
    raise CalibrationError(
        f"This {what} needs about {format_bytes(est.peak_bytes)} of memory at its peak ({step}: "
        f"{est.phase}), more than the {format_bytes(free_bytes)} free: close other programs, or run it with "
        f"{fit_remedy(size, calib_ctx)}; its whole run would take {_duration(job.seconds)} on a CPU."
    )
