"""Calibrate & quantize: a plan's methods run on the layer runner, then the export writes the GGUF file.

``export_calibrated(model, out, plan)`` is the one entry point (the CLI's ``export --method`` and the
window's Calibrate & Quantize job call it):

* a plan whose methods are all ``rtn`` is a plain export;
* ``imatrix`` only: one calibration run collects the activation statistics of the float model (what
  llama-imatrix does) and the export weights llama.cpp's search with them;
* ``gptq``, ``awq``, ``awq+gptq``: ``MethodConsumer`` rides on the sequential runner. When every
  chunk went through a decoder layer it takes that layer's Hessians and statistics from the
  ``ActivationCollector``, rescales the layer with AWQ where asked, quantizes every tensor of the
  layer with its method, puts the GGUF bytes in a ``TensorSpool`` and gives the layer the dequantized
  weights, so the next layer is calibrated on what the quantized model really computes. The export
  then writes the spooled tensors as they are and quantizes the rest (embeddings) itself.

Faults, each one sentence in ``CalibratedExport.warnings``: a Hessian that is not positive definite
(retried with larger damping, else the tensor falls back to the imatrix search), fewer calibration
tokens than twice a tensor's columns, a GPU out of memory (smaller lazy batches, then the tensor on the
CPU). NaN activations stop the run (``CalibrationError``); a cancel stops it at the next column batch
and leaves no file under the final name.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core import hardware
from studio.core.calib import awq
from studio.core.calib.calibrate import _open, prepare_input
from studio.core.calib.collect import ActivationCollector
from studio.core.calib.data import BUILTIN, MIXED_METHODS, CalibrationText, calibration_sources
from studio.core.calib.imatrix import imatrix_from_stats
from studio.core.calib.runner import Consumer, LayerView, LinearSite, RunInfo, RunSpec, run_model
from studio.core.calib.spool import TensorSpool
from studio.core.export.run import _resolve_plan, check_exportable, export_gguf
from studio.core.export.source_copy import StoredSource, copied_note, stored_source
from studio.core.gguf import writer
from studio.core.gguf.arch import Transform, apply_transform, head_counts, permute_rows
from studio.core.gguf.layout import layout
from studio.core.jobs import JobContext, JobSpan, null_context
from studio.core.model.gguf_source import unpermute_rows
from studio.core.model.rotate import Rotation
from studio.core.plan.job_estimate import check_fits, estimate_calibrated
from studio.core.quant.gptq import FactorCache, GptqOptions, HessianError
from studio.core.quant.methods import Encoded, SiteStats, gptq, imatrix, method_info
from studio.core.quant.types import FLOAT_TYPES

CALIB_SHARE = 0.9  # of the progress bar; the export takes the rest


@dataclass(frozen=True)
class CalibOptions:
    """Settings of the calibrated methods."""

    gptq: GptqOptions = field(default_factory=GptqOptions)
    awq_grid: int = 20  # α steps in [0, 1]


@dataclass(frozen=True)
class TensorReport:
    """How one tensor was quantized."""

    name: str
    qtype: str
    method: str  # the method that really ran (a fallback shows here)
    seconds: float
    error: float | None = None  # GPTQ's output error (tr(E H Eᵀ)); None when not measured
    rtn_error: float | None = None

    @property
    def gain(self) -> float | None:
        """Output error relative to llama.cpp's codes (None when not measured)."""
        if self.error is None or not self.rtn_error:
            return None
        return self.error / self.rtn_error


@dataclass(frozen=True)
class LayerReport:
    """One decoder layer (None: the output head): the time its methods took and its tensors."""

    layer: int | None
    seconds: float
    tensors: tuple[TensorReport, ...]
    awq_alphas: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class CalibratedExport:
    """What a calibrated export wrote and how the calibration went."""

    export: Any  # studio.core.export.run.ExportResult
    method: str
    dataset: str
    n_ctx: int
    n_chunks: int
    tokens: int
    run: RunInfo | None
    layers: tuple[LayerReport, ...]
    warnings: tuple[str, ...]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the CLI's ``--json``)."""
        return {
            "method": self.method,
            "dataset": self.dataset,
            "ctx": self.n_ctx,
            "chunks": self.n_chunks,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "calibration_seconds": round(self.run.seconds, 3) if self.run else None,
            "device": self.run.device if self.run else None,
            "layers": [
                {
                    "layer": lr.layer,
                    "seconds": round(lr.seconds, 3),
                    "awq_alpha": dict(lr.awq_alphas),
                    "tensors": [
                        {
                            "name": t.name,
                            "type": t.qtype,
                            "method": t.method,
                            "gain": None if t.gain is None else round(t.gain, 4),
                        }
                        for t in lr.tensors
                    ],
                }
                for lr in self.layers
            ],
            "warnings": list(self.warnings),
        }


# ------------------------------------------------------------------------------------------ consumer


def _free(device: Any) -> None:
    import torch

    gc.collect()
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


_SLAB_ROWS = 16384  # rows rounded at once: bounds the working copies of a tall matrix (the head)
# the Hessian's inverse factor against the sweep's matrix products: fitted on the 8B fixture, where the
# head's GPTQ (128256 × 4096, in slabs) took 0.94 of a decoder layer's (131 s against 140 s; 0.7 made it
# 0.57, and the ETA after the first layer of a 2-layer run came out 26 % short)
_INVERSE_WEIGHT = 0.3
ROUND, AWQ_GRID = (
    "round",
    "awq",
)  # the consumer's kinds of work: rounding (a GPTQ sweep, a search), AWQ's grid
_RESCALE_BLOCK = 1 << 24  # values of a Hessian divided at once by AWQ's scales (64 MB of float32)
_SEARCH_CANDIDATES = 64  # scale candidates a block search tries, for the progress's cost model


def _too_few(tokens: int, cols: int, name: str) -> str:
    return (
        f"The calibration has {tokens} tokens, fewer than twice the {cols} input columns of {name}: its "
        "Hessian is poorly estimated; use a longer text or more chunks."
    )


def rescaled_hessian(hess: Any, s: Any) -> Any:
    """``hess / (s sᵀ)``, the Hessian of the input ``x / s`` (AWQ's column scales), a block of rows at a time:
    the outer product ``s sᵀ`` of a 14336-wide input is another 0.8 GB (the same values either way)."""
    import torch

    sd = s.to(hess.device, torch.float32)
    out = torch.empty(hess.shape, dtype=torch.promote_types(hess.dtype, torch.float32), device=hess.device)
    per = max(1, _RESCALE_BLOCK // max(1, int(hess.shape[-1])))
    for a in range(0, int(hess.shape[0]), per):
        out[a : a + per] = hess[a : a + per] / (sd[a : a + per, None] * sd[None, :])
    return out


def _divide_by_scales(hess: dict[str, tuple[Any, int]], scales: Mapping[str, Any]) -> None:
    """Replace, in ``hess``, the Hessian of every site AWQ scaled by ``rescaled_hessian``: once per shared
    input and scales (q/k/v, gate/up), each raw one let go as soon as its sites have theirs. Kept until
    the layer was rounded, the raw Hessians sat beside the rescaled ones (at 8B widths 1 GB, which put
    awq+gptq's peak at 6.45 GB)."""
    groups: list[tuple[Any, Any, list[str]]] = []
    for name, (h, _n) in hess.items():
        sc = scales.get(name)
        if sc is None:
            continue
        g = next((g for g in groups if g[0] is h and g[1] is sc), None)
        if g is None:
            groups.append((h, sc, [name]))
        else:
            g[2].append(name)
    while groups:
        raw, sc, names = groups.pop(0)
        new = rescaled_hessian(raw, sc)
        del raw
        for name in names:
            hess[name] = (new, hess[name][1])


class MethodConsumer(Consumer):
    """Quantizes every tensor of each decoder layer with the plan's method once the layer is collected."""

    needs_layerwise = True

    def __init__(
        self,
        plan: Any,
        layout: Any,
        config: dict[str, Any],
        model_type: str,
        collector: ActivationCollector,
        spool: Any,
        options: CalibOptions | None = None,
        ctx: JobContext | None = None,
        read: Callable[[str], Any] | None = None,
        executor: Any = None,
        stored: StoredSource | None = None,
    ) -> None:
        self.plan = plan
        self.stored = (
            stored  # the GGUF a converted folder came from: its tensors stored in their planned type
        )
        self.copied = 0
        self.executor = executor  # a distributed one rounds a layer's tensors as units (cluster.quantize)
        self.read = read  # checkpoint name -> torch tensor (the output head's weight)
        self._hess_layers: set[int | None] = set()
        self.lay = layout
        self.by_hf = layout.by_hf()
        self.config = config
        self.model_type = model_type
        self.collector = collector
        self.spool = spool
        self.options = options or CalibOptions()
        self.ctx = (ctx or null_context()).span(0.0, 1.0)
        self.warnings: list[str] = []
        self.layers: list[LayerReport] = []
        self.spec: RunSpec | None = None
        # per layer: GPTQ's inverse factors, one per shared input (q/k/v, gate/up), so the linears that
        # read it do not factor the same matrix again
        self._factors = FactorCache()
        self._now = ""  # what the meter says is running (a slab's progress line repeats it)
        head = next((t for t in layout.tensors if t.gguf_name == "output.weight"), None)
        self.head_name = head.hf_name if head is not None else None
        self.wants_head = bool(
            self.head_name
            and plan.type_of(self.head_name) not in FLOAT_TYPES
            and method_info(plan.method_of(self.head_name)).calibrated
        )

    # -- which tensors need what
    def _method(self, name: str) -> Any:
        return method_info(self.plan.method_of(name)) if name in self.plan.types else method_info("rtn")

    changes_weights = True

    def work(self, site: LinearSite, spec: RunSpec) -> float:
        """Rounding's cost and AWQ's grid's (``work_parts``) together."""
        return sum(self.work_parts(site, spec).values())

    def work_parts(self, site: LinearSite, spec: RunSpec) -> Mapping[str, float]:
        """Rounding's cost: a GPTQ sweep is rows × columns² (plus the inverse, columns³), a search
        rows × columns × its candidates; AWQ's grid, each point of which rounds the linear and measures its
        output error on the Hessian (rows × columns²), apart: it runs at another speed."""
        if site.name not in self.by_hf or site.kind == "experts" or self._qtype(site.name) is None:
            return {}
        if site.layer is None and not self.wants_head:
            return {}
        m = self._method(site.name)
        rows, cols = float(site.out_features), float(site.in_features)
        sweep = m.rounding is gptq
        cost = rows * cols * cols + _INVERSE_WEIGHT * cols**3 if sweep else rows * cols * _SEARCH_CANDIDATES
        parts = {ROUND: cost}
        if m.awq and site.layer is not None:
            parts[AWQ_GRID] = self._awq_cost(site)
        return parts

    def _awq_cost(self, site: LinearSite) -> float:
        """AWQ's grid on ``site``: per point a search and the output error (rows × columns × (columns +
        the search's candidates))."""
        rows, cols = float(site.out_features), float(site.in_features)
        return self.options.awq_grid * rows * cols * (cols + _SEARCH_CANDIDATES)

    def needs_hessian(self, site: LinearSite) -> bool:
        """Sites whose Hessian the collector must sum: every site of a layer with a GPTQ or AWQ tensor."""
        return site.kind != "experts" and site.layer in self._hess_layers

    def start(self, spec: RunSpec) -> None:
        """Check that the run covers the plan's tensors; warn about too few tokens."""
        self.spec = spec
        self._hess_layers = {
            s.layer for s in spec.sites if s.name in self.by_hf and self._method(s.name).hessian
        }
        tokens = spec.n_chunks * spec.n_ctx
        warned: set[int] = set()
        for s in spec.sites:
            if s.name not in self.by_hf:
                continue
            if self._method(s.name).hessian and tokens < 2 * s.in_features and s.in_features not in warned:
                warned.add(s.in_features)
                self.warnings.append(_too_few(tokens, s.in_features, s.name))

    def layer_collected(self, view: LayerView) -> None:
        """AWQ (where asked), then each tensor's method; the layer keeps the dequantized weights."""
        t0 = time.monotonic()
        n = self.spec.n_layers if self.spec else 0
        sites = [s for s in view.sites if s.name in self.by_hf and s.kind != "experts"]
        for s in view.sites:
            if s.kind == "experts" and s.name in self.by_hf:
                self._note(f"{s.name}: fused experts are quantized by the export without calibration.")
        hess = self.collector.take_hessians([s.name for s in sites])
        self._factors = FactorCache()  # the last layer's are not used again
        scales, alphas, changed = self._awq(view, sites, hess)
        pre: dict[str, Any] = {}
        if self.executor is not None and self.executor.distributed:
            round_layer = self.executor.job("round_layer")  # studio.core.cluster.quantize

            pre = round_layer(self, self.executor, sites, view, hess, scales)
        _divide_by_scales(hess, scales)
        reports = []
        meter = self.spec.meter if self.spec else None
        for s in sites:
            self.ctx.check_cancelled()
            what = f"layer {view.index + 1}/{n}: {self.plan.method_of(s.name)} {s.name}"
            self._now = what
            if meter is not None:
                meter.note(what)
            w = view.weight(s)
            touched = s.name[len(view.prefix) :] in changed
            reports.append(
                self._site(s, w, hess.get(s.name), scales.get(s.name), touched, view, pre.get(s.name))
            )
            if meter is not None:
                meter.site_done(self, s, what)
            self._release_unread(hess, s, sites)
        for rel in changed:  # norms AWQ divided: float tensors of the file
            name = view.checkpoint_name(rel)
            if name in self.by_hf and name not in self.spool:
                self._spool_float(self.by_hf[name], view.param(rel).detach().float().cpu().numpy())
        self.layers.append(LayerReport(view.index, time.monotonic() - t0, tuple(reports), tuple(alphas)))
        # this layer's inverse factors and Hessians go now, not when the next layer is rounded:
        # held through the next layer's collection they sat beside its float64 Hessians (at 8B widths
        # 1 GB of factors beside 1.9 GB being summed: layer 2 of a GPTQ export peaked 2.8 GB above layer 1)
        self._factors = FactorCache()
        hess.clear()

    def _release_unread(
        self, hess: dict[str, tuple[Any, int]], done: LinearSite, sites: list[LinearSite]
    ) -> None:
        """Let go of ``done``'s inverse factor when no site after it reads the same Hessian: held to the
        layer's end, ``down_proj``'s (0.8 GB at 8B widths) sat beside its output errors."""
        h = hess.get(done.name)
        if h is None:
            return
        later = sites[sites.index(done) + 1 :]
        if not any(hess.get(s.name, (None,))[0] is h[0] for s in later):
            self._factors.release(h[0])

    def finish(self) -> None:
        """The output head (when it has a calibrated method and its own weight)."""
        if not self.wants_head or self.spec is None or self.head_name is None or self.read is None:
            return
        site = next((s for s in self.spec.sites_of(None) if s.name == self.head_name), None)
        if site is None:
            return
        t0 = time.monotonic()
        # the last layer's inverse factors (0.8 GB for a 14336-wide input) go first
        self._factors = FactorCache()
        hess = self.collector.take_hessians([site.name])
        h = hess.get(site.name)
        w = self.read(site.name)
        if h is not None:
            w = w.to(h[0].device)
        meter = self.spec.meter
        what = f"output head: {self.plan.method_of(site.name)} {site.name}"
        self._now = what
        if meter is not None:
            meter.note(what)
        rep = self._site(site, w, h, None, False, None)
        if meter is not None:
            meter.site_done(self, site, what)
        self.layers.append(LayerReport(None, time.monotonic() - t0, (rep,)))

    def _note(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)
            self.ctx.log(msg)

    # -- AWQ
    def _awq(
        self, view: LayerView, sites: list[LinearSite], hess: dict[str, tuple[Any, int]]
    ) -> tuple[dict[str, Any], list[tuple[str, float]], set[str]]:
        """Search and fold the AWQ scales of the layer's groups; (column scales per site, α per group,
        layer-relative paths of the parameters that changed)."""
        if not any(self._method(s.name).awq for s in sites):
            return {}, [], set()
        groups, why = awq.layer_groups(view.module, self.model_type, self.config)
        if why:
            self._note(f"{why}; layer {view.index} is quantized without AWQ's scales.")
            return {}, [], set()
        by_rel = {s.name[len(view.prefix) :].removesuffix(".weight"): s for s in sites}
        choices = []
        for g in groups:
            members = [by_rel.get(lin) for lin in g.linears]
            if any(m is None for m in members) or not any(self._method(m.name).awq for m in members):
                continue
            first = members[0]
            h = hess.get(first.name)
            st = self.collector.stats_of(first.name)
            if h is None or st is None:
                continue
            qtypes = [self._qtype(m.name) for m in members]
            ws = [view.weight(m).detach() for m in members]
            imx = st.mean_sq[0].astype(np.float32)
            choice = awq.search_group(
                g, ws, qtypes, h[0], st.mean_abs, imx, grid=self.options.awq_grid, ctx=self.ctx,
                on_point=self._awq_progress(view, g, members),
            )  # fmt: skip
            choices.append((g, members, choice))
        scales: dict[str, Any] = {}
        alphas = []
        changed: set[str] = set()
        for g, members, choice in choices:  # every search saw the float layer; fold afterwards
            changed.update(awq.fold(view, choice))
            alphas.append((g.prev, choice.alpha))
            for m in members:
                scales[m.name] = choice.scales
        return scales, alphas, changed

    def _awq_progress(self, view: LayerView, g: Any, members: list[Any]) -> Callable[[int, int], None] | None:
        """The bar's steps through one group's AWQ grid: each point is its share of the members' search cost
        (``work``); at 8B widths a layer's search is minutes, and the bar stood still through it."""
        meter = self.spec.meter if self.spec else None
        if meter is None:
            return None
        n = self.spec.n_layers if self.spec else 0
        what = f"layer {view.index + 1}/{n}: awq {', '.join(g.linears)}"

        def step(done: int, total: int) -> None:
            self._now = what
            for m in members:
                cost = 0.0
                if self._method(m.name).awq and self._qtype(m.name) is not None:
                    cost = self._awq_cost(m)
                meter.site_some(self, m, cost / total, f"{what} (α {done}/{total})", AWQ_GRID)

        return step

    def _spool_float(self, tm: Any, x: np.ndarray) -> None:
        from studio.core.quant.blocks import quantize

        qtype = self.plan.type_of(tm.hf_name)
        v = apply_transform(np.ascontiguousarray(x, dtype=np.float32), tm, self.config)
        data = v if qtype == "F32" else quantize(v.reshape(-1, tm.n_per_row), qtype)
        self.spool.put(tm.hf_name, data, qtype)

    def _qtype(self, name: str) -> str | None:
        t = self.plan.type_of(name)
        return None if t in FLOAT_TYPES else t

    # -- one tensor
    def _site(
        self,
        site: LinearSite,
        param: Any,
        h: tuple[Any, int] | None,
        s: Any,
        touched: bool,
        view: LayerView | None,
        rounded: tuple[Any, str] | None = None,
    ) -> TensorReport:
        """Quantize one weight with its method, spool it, and (in a layer) give the layer its dequantized values."""
        import torch

        from studio.core.quant.blocks import dequantize

        t0 = time.monotonic()
        tm = self.by_hf[site.name]
        qtype = self._qtype(site.name)
        w = param.detach()
        if site.kind == "conv1d":
            w = w.t()
        # a tall matrix (the head) stays in its stored dtype: ``_round`` takes float32 slabs of it
        w = w.contiguous() if int(w.shape[0]) > _SLAB_ROWS else w.to(torch.float32).contiguous()
        if qtype is None:
            if touched:  # AWQ changed a tensor kept in a float type: write its new values
                self._spool_float(tm, w.float().cpu().numpy())
            return TensorReport(site.name, self.plan.type_of(site.name), "float", time.monotonic() - t0)
        method = self._method(site.name)
        st = self.collector.stats_of(site.name)
        imx = None if st is None else st.mean_sq[0].astype(np.float32)
        hess = None if h is None else h[0]
        if s is not None:  # the layer's input is x / s now (its Hessian is divided in ``layer_collected``)
            sn = s.double().cpu().numpy()
            imx = None if imx is None else (imx / sn**2).astype(np.float32)
        stats = SiteStats(site.name, st.tokens if st else 0, imx, hess, self.options.gptq, self._factors)
        copy = None if (s is not None or touched) else self._stored_copy(site, tm, qtype, w)
        if copy is not None:
            rounded = copy
        enc, used = rounded if rounded is not None else self._round(method, w, stats, qtype)
        if view is not None:
            new = torch.from_numpy(dequantize(enc.data, qtype, tuple(w.shape)))
            view.set_weight(site, new.t() if site.kind == "conv1d" else new)
        data = enc.data
        if tm.transform in (Transform.PERMUTE_Q, Transform.PERMUTE_K):
            n_head, n_kv = head_counts(self.config)
            data = np.ascontiguousarray(
                permute_rows(data, n_head if tm.transform is Transform.PERMUTE_Q else n_kv)
            )
        self.spool.put(site.name, data, qtype)
        return TensorReport(site.name, qtype, used, time.monotonic() - t0, enc.error, enc.rtn_error)

    def _stored_copy(self, site: LinearSite, tm: Any, qtype: str, w: Any) -> tuple[Encoded, str] | None:
        """The source GGUF's bytes of this tensor (rows in the checkpoint's order) when it stores it as
        ``qtype`` with exactly the values ``w`` holds: rounding them again would only add error."""
        if self.stored is None or self.stored.candidate(tm.gguf_name, qtype, tuple(tm.shape)) is None:
            return None
        heads = 0
        if tm.transform in (Transform.PERMUTE_Q, Transform.PERMUTE_K):
            n_head, n_kv = head_counts(self.config)
            heads = n_head if tm.transform is Transform.PERMUTE_Q else n_kv

        def blocks() -> Any:  # the values in the file's row order, a slab at a time
            if heads:
                yield permute_rows(w.float().cpu().numpy(), heads)
                return
            for a in range(0, int(w.shape[0]), _SLAB_ROWS):
                yield w[a : a + _SLAB_ROWS].float().cpu().numpy()

        raw = self.stored.copy_of(tm.gguf_name, qtype, tuple(tm.shape), blocks())
        if raw is None:
            return None
        if heads:  # ``_site`` permutes the rows into the file's order again
            raw = unpermute_rows(raw, heads)
        self.copied += 1
        return Encoded(raw, qtype, 0.0, None, ()), "copy"

    def _round(self, method: Any, w: Any, stats: SiteStats, qtype: str) -> tuple[Any, str]:
        """The method's encoding in slabs of rows (every method rounds rows independently, so a
        128k-row output head costs the working copies of ``_SLAB_ROWS`` rows, not of the whole)."""

        rows = int(w.shape[0])
        if rows <= _SLAB_ROWS:
            return self._round_slab(method, w, stats, qtype)
        parts, used = [], method.name
        starts = range(0, rows, _SLAB_ROWS)
        site = next((x for x in self.spec.sites if x.name == stats.name), None) if self.spec else None
        meter = self.spec.meter if self.spec else None
        for k, a in enumerate(starts):
            self.ctx.check_cancelled()
            enc, u = self._round_slab(method, w[a : a + _SLAB_ROWS].float().contiguous(), stats, qtype)
            parts.append(enc)
            used = u if u != method.name else used
            if meter is not None and site is not None:  # the bar and the ETA move slab by slab
                meter.site_part(
                    self,
                    site,
                    len(starts) - k,
                    f"{self._now}: rows {a + len(enc.data):,} of {rows:,}",
                )
        errs = [e.error for e in parts]
        rtns = [e.rtn_error for e in parts]
        return Encoded(
            np.concatenate([e.data for e in parts]),
            qtype,
            None if any(e is None for e in errs) else float(sum(errs)),
            None if any(e is None for e in rtns) else float(sum(rtns)),
            tuple(dict.fromkeys(n for e in parts for n in e.notes)),
        ), used

    def _round_slab(self, method: Any, w: Any, stats: SiteStats, qtype: str) -> tuple[Any, str]:
        """The method's encoding, with the faults handled: OOM retries, singular Hessians."""
        import torch

        dev = w.device
        try:
            try:
                return method.rounding(w, stats, qtype, self.ctx), method.name
            except torch.OutOfMemoryError:
                _free(dev)
            opts = stats.options or GptqOptions()
            for bs in (opts.block_size // 2, opts.block_size // 4):
                if bs < 16:
                    break
                try:
                    smaller = dataclasses.replace(stats, options=dataclasses.replace(opts, block_size=bs))
                    enc = method.rounding(w, smaller, qtype, self.ctx)
                    self._note(
                        f"{stats.name}: {dev} ran out of memory; quantized again with batches of {bs} columns."
                    )
                    return enc, method.name
                except torch.OutOfMemoryError:
                    _free(dev)
            self._note(
                f"{stats.name}: {dev} ran out of memory; this tensor was quantized on the CPU instead."
            )
            hcpu = None if stats.hessian is None else stats.hessian.cpu()
            return method.rounding(
                w.cpu(), dataclasses.replace(stats, hessian=hcpu), qtype, self.ctx
            ), method.name
        except HessianError as err:
            self._note(f"{stats.name}: {err} It was quantized with the imatrix search instead.")
            return imatrix(w, stats, qtype, self.ctx), "imatrix"


# ------------------------------------------------------------------------------------------ pipeline


def _export_device(device: str) -> str:
    """Where the export quantizes what the run did not: the run's GPU, else the CPU ("auto" too)."""
    d = (device or "cpu").lower()
    return d if d.startswith("cuda") or d == "mps" else "cpu"


def _imatrix_only(plan: Any) -> bool:
    return all(method_info(plan.method_of(n)).name in ("rtn", "imatrix") for n in plan.types)


def plan_sources(plan: Any, own: Any, *, own_only: bool = False) -> Any:
    """What a calibrated export of ``plan`` calibrates on (``calibration_sources``): the user's text ``own``
    followed by the built-in text when any tensor is rounded by one of the ``MIXED_METHODS``."""
    mixed = next((m for m in MIXED_METHODS if any(plan.method_of(n) == m for n in plan.types)), None)
    return calibration_sources(own, mixed, own_only=own_only)


def check_calibration_memory(config: dict[str, Any], chunks: Any, plan: Any, device: str) -> None:
    """Refuse, in one sentence, a calibration of ``plan`` whose estimated peak memory is above the free RAM
    (``studio.core.plan.job_estimate``), before it starts."""

    methods = {method_info(plan.method_of(n)) for n in plan.types}
    hessian = any(m.hessian for m in methods)

    def estimate(n_ctx: int, n_chunks: int) -> Any:
        return estimate_calibrated(
            config, n_ctx, n_chunks, hessian=hessian, head=hessian, device=_export_device(device)
        )

    est = estimate(chunks.n_ctx, chunks.n_chunks)
    check_fits(est, hardware.ram()[1], chunks.n_ctx, chunks.n_chunks, lambda c, k: estimate(c, k).peak_bytes)


def export_calibrated(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    plan: Any,
    *,
    text: str | os.PathLike[str] | CalibrationText = BUILTIN,
    n_ctx: int = 512,
    n_chunks: int | None = None,
    device: str = "auto",
    dtype: str = "float32",
    options: CalibOptions | None = None,
    ctx: JobContext | None = None,
    validate: Callable[[Path], None] | None = None,
    allow_pickle: bool = False,
    executor: Any = None,
    rotation: Rotation | None = None,
) -> CalibratedExport:
    """Calibrate ``model`` on ``text`` for the methods of ``plan`` (a Plan or a preset name) and export it.

    ``device``: where layers run and GPTQ sweeps (auto, cpu, cuda, mps); ``dtype``: the precision of
    the layer forward passes (float32 by default: the Hessians are as exact as the data allows).
    ``executor`` (``studio.core.executor``): a distributed one rounds each layer's tensors as units on a
    cluster, with the same bytes. ``rotation``: calibrate and export the rotated model
    (``studio.core.model.rotate``; the export checks it against the original first).
    """

    ctx = ctx or null_context()
    t0 = time.monotonic()
    out_p = Path(out).expanduser()
    ckpt = _open(model, allow_pickle, rotation)
    try:
        info = ckpt.info
        check_exportable(info)
        writer.check_output_path(out_p, inputs=tuple({t.file for t in info.tensors}) + (info.path,))
        plan = _resolve_plan(plan, info)
        export_device = _export_device(device)
        if not plan.calibrated:
            res = export_gguf(
                info.path, out_p, plan, device=export_device, ctx=ctx, validate=validate, rotation=rotation
            )
            return CalibratedExport(res, plan.method, "", 0, 0, 0, None, (), (), time.monotonic() - t0)
        calib = ctx.span(0.0, CALIB_SHARE)
        calib.report(0, 1, "Tokenizing the calibration text")
        inp = prepare_input(info.path, text, n_ctx=n_ctx, n_chunks=n_chunks, ctx=calib)
        warnings = list(inp.warnings)
        lay = layout(info)
        check_calibration_memory(info.config, inp.chunks, plan, device)
        if _imatrix_only(plan):
            return _export_with_imatrix(
                ckpt, out_p, plan, inp, device, dtype, ctx, calib, validate, t0, warnings, rotation
            )
        with TensorSpool(out_p) as spool:
            collector = ActivationCollector(histogram=False, dataset=inp.data.name)
            consumer = MethodConsumer(
                plan,
                lay,
                info.config,
                str(info.model_type),
                collector,
                spool,
                options,
                calib,
                ckpt.read_torch,
                executor,
                None if rotation is not None else stored_source(info.path),
            )
            collector.hessian_for = consumer.needs_hessian
            collector.wants_head = consumer.wants_head
            run = run_model(
                ckpt,
                inp.chunks,
                [collector, consumer],
                device=device,
                dtype=dtype,
                ctx=calib,
                mode="layerwise",
            )
            warnings += consumer.warnings
            if consumer.copied and consumer.stored is not None:
                warnings.append(copied_note(consumer.copied, consumer.stored))
            ctx.check_cancelled()
            res = export_gguf(
                info.path,
                out_p,
                plan,
                device=export_device,
                ctx=ctx.span(CALIB_SHARE, 1.0),
                validate=validate,
                precomputed=spool,
                allow_pickle=allow_pickle,
                rotation=rotation,
            )
        return _result(res, plan, inp, run, tuple(consumer.layers), warnings, t0)
    finally:
        ckpt.close()


def _export_with_imatrix(
    ckpt: Any,
    out: Path,
    plan: Any,
    inp: Any,
    device: str,
    dtype: str,
    ctx: JobContext,
    calib: JobSpan,
    validate: Callable[[Path], None] | None,
    t0: float,
    warnings: list[str],
    rotation: Rotation | None = None,
) -> CalibratedExport:
    """``imatrix`` (and ``rtn``) tensors only: the float model's statistics, as llama-imatrix collects them."""
    info = ckpt.info
    collector = ActivationCollector(histogram=False, dataset=inp.data.name)
    run = run_model(ckpt, inp.chunks, [collector], device=device, dtype=dtype, ctx=calib)
    stats = collector.result(run, inp.warnings)
    im = imatrix_from_stats(stats, info)
    lay = layout(info)
    chosen: Any = im
    if any(
        plan.method_of(t.hf_name) == "rtn" and plan.type_of(t.hf_name) not in FLOAT_TYPES for t in lay.tensors
    ):
        chosen = {
            t.gguf_name: im[t.gguf_name]
            for t in lay.tensors
            if plan.method_of(t.hf_name) == "imatrix" and t.gguf_name in im
        }
    export_device = _export_device(device)
    res = export_gguf(
        info.path,
        out,
        plan,
        device=export_device,
        imatrix=chosen,
        ctx=ctx.span(CALIB_SHARE, 1.0),
        validate=validate,
        rotation=rotation,
    )
    return _result(res, plan, inp, run, (), warnings, t0)


def _result(
    res: Any, plan: Any, inp: Any, run: Any, layers: tuple, warnings: list[str], t0: float
) -> CalibratedExport:
    c = inp.chunks
    return CalibratedExport(
        res,
        plan.method,
        inp.data.name,
        c.n_ctx,
        c.n_chunks,
        c.n_tokens,
        run,
        layers,
        tuple(warnings),
        time.monotonic() - t0,
    )


__all__ = [
    "plan_sources",
    "CalibOptions",
    "CalibratedExport",
    "LayerReport",
    "MethodConsumer",
    "TensorReport",
    "export_calibrated",
]
