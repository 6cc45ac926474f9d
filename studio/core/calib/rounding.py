"""Plan with the rounding the export will use: a calibrated correction of the sensitivity scan for GPTQ.

The scan (``sensitivity``) measures every (tensor, qtype) under llama.cpp's imatrix-weighted search, the
rounding of ``--method imatrix``. GPTQ (``--method gptq``, ``awq+gptq``, ``best``) rounds the same grid
so that the layer's *output* error ``tr((W − Ŵ) H (W − Ŵ)ᵀ)`` shrinks, and by how much depends on the
type: a coarse grid gains most. Planning with the scan as measured lets the allocator trade bytes for the
imatrix rounding's errors while the file is written with GPTQ's, so the allocation and the rounding
disagree.

``rounding_ratios`` measures the difference on a sample: the calibration text runs through the model
layer by layer once, and every sampled linear (``PROBE_ROWS`` of its rows, spread) is rounded to each
candidate type both ways. GPTQ and the imatrix search are fitted on half of the chunks (the even ones:
their ``2XᵀX/n`` and imatrix) and judged on the other half (the odd ones' input rows, at most
``JUDGE_TOKENS`` of them): the ratio of GPTQ's output error to the imatrix search's
there, per type (the median over the sample), is the correction. Judged on the chunks it was fitted to,
GPTQ looked far better than it is on other text (Q8_0 ×0.11, Q5_0 ×0.16 in sample on the demo), and the
allocator, trusting that, moved tensors from Q8_0 down to Q5_0; the in-sample ratios are kept beside the
held-out ones (``fitted``) to show the gap. ``corrected_scan``
multiplies each decoder tensor's KL by its type's ratio (the KL of one tensor is proportional to its
output error to first order: the scan's proxy predicts it as gain × error); the token embedding and a
tied head are not GPTQ-rounded by the export and stay as measured. AWQ's scales are not in the sample:
awq+gptq is corrected as gptq.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.atomic import write_atomic
from studio.core.calib.calibrate import _open, prepare_input
from studio.core.calib.collect import ActivationCollector
from studio.core.calib.runner import Consumer, LayerView, RunSpec, run_model
from studio.core.calib.scan_cache import scan_digest
from studio.core.calib.scan_proxy import gain_layers
from studio.core.jobs import JobContext, null_context
from studio.core.model.rotate import Rotation, rotation_key
from studio.core.plan.scan import Sensitivity, scan_targets
from studio.core.quant.gptq import FactorCache, HessianError, gptq_quantize, output_error
from studio.core.quant.gptq_lattice import LATTICE_TYPES, gptq_lattice
from studio.core.quant.grid import GRID_TYPES
from studio.core.quant.types import QTYPES
from studio.core.stats.cache import checkpoint_key

GPTQ_METHODS = frozenset({"gptq", "awq+gptq"})  # methods whose rounding the correction models
PROBE_LAYERS = 3  # decoder layers sampled: the first, the middle and the last of the proxy's layers
PROBE_CHUNKS = 16  # calibration chunks the probe runs: 8 to fit (4096 tokens at 512), 8 to judge on
# output rows of a linear the probe rounds: every method rounds rows independently against the same Hessian,
# so the errors' ratio is a sum over rows that a spread sample estimates; all 14336 rows of an 8B gate_proj
# cost 28× the time for a ratio the same to a few per cent
PROBE_ROWS = 512
# held-out input rows (tokens) the probe judges on: kept as rows, not as their n × n sum, which at an 8B's
# 14336-wide down_proj input was 0.8 GB in float32 where 4096 rows are 0.23 GB
JUDGE_TOKENS = 4096
PROBE_KIND = "probe"  # the probe's kind of work for the ETA (``WorkMeter``)


@dataclass(frozen=True)
class RoundingRatios:
    """GPTQ's output error over the imatrix search's, per qtype, measured on a sample of linears."""

    method: str
    ratios: Mapping[str, float]  # effective qtype → median ratio (≤ 1 where GPTQ helps)
    samples: Mapping[str, tuple[float, ...]]  # effective qtype → each sampled linear's ratio
    layers: tuple[int, ...]
    tokens: int
    fitted: Mapping[str, float] = field(default_factory=dict)  # the same on the chunks GPTQ was fitted to

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the cache and ``--json``)."""
        return {
            "method": self.method,
            "ratios": dict(self.ratios),
            "samples": {k: list(v) for k, v in self.samples.items()},
            "layers": list(self.layers),
            "tokens": self.tokens,
            "fitted": dict(self.fitted),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RoundingRatios:
        """Inverse of ``to_dict``."""
        return cls(
            str(d["method"]),
            {str(k): float(v) for k, v in d["ratios"].items()},
            {str(k): tuple(float(x) for x in v) for k, v in d["samples"].items()},
            tuple(int(x) for x in d["layers"]),
            int(d["tokens"]),
            {str(k): float(v) for k, v in d.get("fitted", {}).items()},
        )


class _SomeChunks(Consumer):
    """Passes the rows of the chunks ``keep`` picks to ``inner`` (a collector), and its layer ends."""

    def __init__(self, inner: ActivationCollector, keep: Callable[[int], bool]) -> None:
        self.inner = inner
        self.keep = keep
        # the run's memory check counts Hessians where a consumer sums them: wrapped, the probe's fitted
        # sums went uncounted and a run estimated without them was not refused where it did not fit
        self.hessian_for = inner.hessian_for

    def start(self, spec: RunSpec) -> None:  # noqa: D102
        self.inner.start(spec)

    def observe(self, site: Any, x: Any, chunk: int, expert: int = 0) -> None:  # noqa: D102
        if self.keep(chunk):
            self.inner.observe(site, x, chunk, expert)

    def layer_collected(self, view: LayerView) -> None:  # noqa: D102
        self.inner.layer_collected(view)


class _HeldRows(Consumer):
    """The judging chunks' inputs of the sampled linears as rows (tokens × n, float32, the first
    ``JUDGE_TOKENS`` of each input), shared by the linears that read the same input: an output error
    ``tr(E H Eᵀ)`` is ``‖E Xᵀ‖²`` up to the factor 2/n, which a ratio drops."""

    def __init__(self, wanted: Callable[[Any], bool], keep: Callable[[int], bool]) -> None:
        self.wanted = wanted
        self.keep = keep
        self._rows: dict[str, list[Any]] = {}
        self._last: tuple[Any, int, int, list[Any]] | None = None

    def start(self, spec: RunSpec) -> None:  # noqa: D102
        self._rows.clear()
        self._last = None

    def observe(self, site: Any, x: Any, chunk: int, expert: int = 0) -> None:  # noqa: D102
        if not self.keep(chunk) or site.kind == "experts" or not self.wanted(site):
            return
        last = self._last
        if last is not None and last[0] is x and last[1] == x._version and last[2] == chunk:
            self._rows.setdefault(site.name, last[3])  # the same input as the linear before
            return
        parts = self._rows.setdefault(site.name, [])
        room = JUDGE_TOKENS - sum(int(p.shape[0]) for p in parts)
        if room > 0:
            import torch

            parts.append(x.detach().reshape(-1, int(x.shape[-1]))[:room].to("cpu", torch.float32, copy=True))
        self._last = (x, x._version, chunk, parts)

    def layer_collected(self, view: LayerView) -> None:  # noqa: D102
        self._last = None

    def take(self, names: Sequence[str]) -> dict[str, Any]:
        """Remove the named linears' rows: one tensor per input, shared by the linears that read it."""
        import torch

        out: dict[str, Any] = {}
        made: dict[int, Any] = {}
        for name in names:
            parts = self._rows.pop(name, None)
            if parts:
                if id(parts) not in made:
                    made[id(parts)] = torch.cat(parts) if len(parts) > 1 else parts[0]
                out[name] = made[id(parts)]
        return out


def _judged_error(w: Any, q: Any, judge: Any, rows: bool) -> float:
    """The output error of ``q`` for ``w`` on the judging data: ``‖(W − Q) Xᵀ‖²`` on held-out rows, or
    ``tr((W − Q) H (W − Q)ᵀ)`` on a Hessian."""
    if not rows:
        return output_error(w, q, judge)
    return float(((w - q) @ judge.T).double().square().sum())


class _Probe(Consumer):
    """Rounds each sampled layer's linears to every candidate type by GPTQ and by the imatrix search,
    both fitted on ``fit``'s chunks, and compares their output errors on ``held``'s."""

    needs_layerwise = True

    def __init__(
        self,
        fit: ActivationCollector,
        held: ActivationCollector | _HeldRows,
        layers: Sequence[int],
        types: Mapping[str, Sequence[str]],
        ctx: Any,
    ) -> None:
        self.fit = fit
        self.held = held
        self.layers = set(layers)
        self.types = types  # HF name → effective qtypes
        self.ctx = ctx
        self.samples: dict[str, list[float]] = {}
        self.fitted: dict[str, list[float]] = {}
        self.spec: RunSpec | None = None

    def start(self, spec: RunSpec) -> None:  # noqa: D102
        self.spec = spec

    def work_parts(self, site: Any, spec: RunSpec) -> Mapping[str, float]:
        """Rounding a sampled linear to each of its types twice (GPTQ, the imatrix search) and judging both:
        per type rows × columns² (the sweep), the inverse factor (columns³, made once per input and column
        order) spread over the types; the bar moves type by type (at 8B widths the probe is minutes a layer,
        and the bar stood still through it)."""
        qs = self.types.get(site.name, ())
        if site.layer not in self.layers or not qs or site.kind == "experts":
            return {}
        return {PROBE_KIND: len(qs) * self._type_cost(site)}

    def _type_cost(self, site: Any) -> float:
        rows, cols = float(min(site.out_features, PROBE_ROWS)), float(site.in_features)
        return rows * cols * cols + 0.3 * cols**3 / max(1, len(self.types.get(site.name, ())))

    def layer_collected(self, view: LayerView) -> None:
        """GPTQ against the imatrix search for every sampled linear of this layer."""
        if view.index not in self.layers:
            return
        sites = [s for s in view.sites if s.name in self.types and s.kind != "experts"]
        # one input at a time (q/k/v, o, gate/up, down): its Hessians are taken from the sums, used by the
        # linears that read it and let go; taken all at once, every input's fitted and judging Hessians sat
        # beside the 14336-wide down_proj input's (the 8B fixture's best export peaked at 7.7 GB here)
        for group in self.fit.hessian_groups([s.name for s in sites]):
            self._round_group(view, [s for s in sites if s.name in group], group)

    def _round_group(self, view: LayerView, sites: list[Any], names: list[str]) -> None:
        """GPTQ against the imatrix search for the linears ``sites`` that read one input."""
        import torch

        from studio.core.quant.blocks import dequantize, quantize  # numba's kernels: only when probing

        hess = self.fit.take_hessians(names)
        rows = isinstance(self.held, _HeldRows)
        judge = self.held.take(names) if rows else hess
        linears = []
        sites_by = {s.name: s for s in sites}
        for s in sites:
            h, hj = hess.get(s.name), judge.get(s.name)
            st = self.fit.stats_of(s.name)
            if h is None or hj is None or st is None:
                continue
            w = view.weight(s).detach()
            w = sample_rows(w.t() if s.kind == "conv1d" else w).to(torch.float32).contiguous().cpu()
            # the same Hessian objects for the linears that share them
            j = hj if rows else hj[0].cpu()
            linears.append((s.name, w, h[0].cpu(), j, st.mean_sq[0].astype(np.float32)))
        # type by type, every linear of the input: the factor of the one shared Hessian is made once per
        # column order (the grids', the lattices') and only the last is kept; kept for every order at once,
        # the 14336-wide down_proj's factors were 0.8 GB each beside its Hessians (the probe peaked at 6.6 GB)
        factors = FactorCache(keep=1)
        order = sorted({q for n, *_ in linears for q in self.types[n]}, key=lambda q: q in LATTICE_TYPES)
        for q in order:
            for name, w, hc, hjc, imx in linears:
                if q not in self.types[name]:
                    continue
                self.ctx.check_cancelled()
                try:
                    rnd = gptq_lattice if q in LATTICE_TYPES else gptq_quantize  # as the export rounds
                    r = rnd(w, hc, q, imatrix=imx, factors=factors)
                except HessianError:  # a Hessian GPTQ cannot use: that sample is skipped
                    continue
                if r.error is not None and r.rtn_error and r.rtn_error > 0:
                    self.fitted.setdefault(q, []).append(float(r.error) / float(r.rtn_error))
                shape = tuple(w.shape)
                q_gptq = torch.from_numpy(dequantize(r.data, q, shape))
                q_imx = torch.from_numpy(dequantize(quantize(w.numpy(), q, imx), q, shape))
                e_imx = _judged_error(w, q_imx, hjc, rows)
                if e_imx > 0:
                    self.samples.setdefault(q, []).append(_judged_error(w, q_gptq, hjc, rows) / e_imx)
                meter = getattr(self.spec, "meter", None)
                if meter is not None:
                    n = self.spec.n_layers
                    site = sites_by[name]
                    what = f"layer {view.index + 1}/{n}: rounding probe {name} at {q}"
                    meter.site_some(self, site, self._type_cost(site), what, PROBE_KIND)

    def finish(self) -> None:  # noqa: D102
        return None


def sample_rows(w: Any, k: int | None = None) -> Any:
    """``k`` (``PROBE_ROWS``) of ``w``'s rows, spread evenly from the first to the last (all when it has
    no more)."""
    k = PROBE_ROWS if k is None else k
    rows = int(w.shape[0])
    if rows <= k:
        return w
    return w[np.unique(np.round(np.linspace(0, rows - 1, k)).astype(np.int64)).tolist()]


def probe_layers(n_layers: int, k: int = PROBE_LAYERS) -> tuple[int, ...]:
    """``k`` of the proxy's sampled layers, spread from the first to the last."""
    pool = gain_layers(n_layers)
    if len(pool) <= k:
        return pool
    idx = np.unique(np.round(np.linspace(0, len(pool) - 1, k)).astype(int))
    return tuple(pool[i] for i in idx)


def rounding_ratios(
    model: str | os.PathLike[str],
    text: Any,
    types: Sequence[str],
    *,
    method: str = "gptq",
    n_ctx: int = 512,
    n_chunks: int | None = None,
    layers: Sequence[int] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    ctx: JobContext | None = None,
    rotation: Rotation | None = None,
) -> RoundingRatios:
    """GPTQ's output error over the imatrix search's per candidate type, on a sample of decoder layers
    (``probe_layers``), calibrated on ``text`` as the export calibrates (chunks of ``n_ctx``); kept in
    ``cache_dir`` (keyed by the model's files, the text, the types and the layers); ``rotation``: on the
    model as ``export --rotate`` writes it."""
    ctx = ctx or null_context()
    ckpt = _open(model, False, rotation)
    try:
        info = ckpt.info
        targets, _ = scan_targets(info, tuple(types))
        n_layers = max([t.layer + 1 for t in targets if t.layer is not None], default=0)
        picked = tuple(layers) if layers is not None else probe_layers(n_layers)
        inp = prepare_input(info.path, text, n_ctx=n_ctx, n_chunks=n_chunks, ctx=ctx)
        ck = checkpoint_key(info, "")
        key = scan_digest(
            {
                # 2: judged on chunks GPTQ was not fitted to; 3: their sums in float32; 4: rows sampled,
                # judged on input rows
                "v": 4,
                "model": str(info.path),
                "files": [ck.mtime_ns, ck.size],
                "text": inp.data.digest,
                "types": sorted(types),
                "layers": list(picked),
                "n_ctx": n_ctx,
                "n_chunks": n_chunks,
                # gptq and awq+gptq probe the same rounding (AWQ's scales are not in the sample): one
                # measurement serves both, so a plan made with one reuses the other's half hour
                "rounding": "gptq",
                **rotation_key(rotation),
            }
        )
        path = None if cache_dir is None else Path(cache_dir) / f"rounding-{key}.json"
        if path is not None and path.is_file():
            try:
                cached = RoundingRatios.from_dict(json.loads(path.read_text(encoding="utf-8")))  # noqa: TID251 - a cache file the studio wrote (key-named, in its cache folder)
                return dataclasses.replace(cached, method=method)
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a damaged cache file: measure again
        chosen = {
            # the types the export rounds with GPTQ here: the block grids (gptq_quantize) and the lattice
            # i-quants (gptq_lattice); the others (ternary, MXFP4, Q1_0) keep the imatrix search's KL,
            # uncorrected; before, any of them ended the probe
            t.name: tuple(
                dict.fromkeys(
                    q
                    for q in t.effective
                    if not QTYPES[q].is_float and (q in GRID_TYPES or q in LATTICE_TYPES)
                )
            )
            for t in targets
            if t.layer in picked
        }
        names = set(chosen)

        def wanted(site: Any) -> bool:
            return site.name in names and site.kind != "experts"

        fit = ActivationCollector(histogram=False, hessian_for=wanted, dataset=inp.data.name)
        held: ActivationCollector | _HeldRows
        if inp.chunks.n_chunks >= 2:  # fitted on the even chunks, judged on the odd ones' rows
            held = _HeldRows(wanted, lambda c: c % 2 == 1)
            feed: list[Consumer] = [_SomeChunks(fit, lambda c: c % 2 == 0), held]
        else:  # one chunk: nothing to spare, judged in sample
            feed, held = [fit], fit
        probe = _Probe(fit, held, picked, chosen, ctx)
        run_model(ckpt, inp.chunks, [*feed, probe], device="cpu", dtype="float32", mode="layerwise", ctx=ctx)
    finally:
        ckpt.close()
    ratios = {q: float(np.median(v)) for q, v in probe.samples.items() if v}
    fitted = {q: float(np.median(v)) for q, v in probe.fitted.items() if v}
    res = RoundingRatios(
        method, ratios, {q: tuple(v) for q, v in probe.samples.items()}, picked, inp.chunks.n_tokens, fitted
    )
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(res.to_dict()))
        except OSError:
            pass  # without a cache the next plan measures again
    return res


def corrected_scan(scan: Sensitivity, ratios: RoundingRatios) -> Sensitivity:
    """``scan`` with every decoder tensor's KL at each type scaled by that type's ratio (types without a
    ratio, the token embedding and the output head as measured); the record's method says so."""
    tensors = []
    for t in scan.tensors:
        if t.layer is None:
            tensors.append(t)
            continue
        by_type = {}
        for q, c in t.by_type.items():
            r = ratios.ratios.get(c.effective)
            ok = r is not None and math.isfinite(r) and r > 0
            by_type[q] = dataclasses.replace(c, kl=c.kl * r) if ok else c
        tensors.append(dataclasses.replace(t, by_type=by_type))
    return dataclasses.replace(scan, tensors=tuple(tensors), method=ratios.method)


__all__ = [
    "GPTQ_METHODS",
    "JUDGE_TOKENS",
    "PROBE_CHUNKS",
    "PROBE_LAYERS",
    "PROBE_ROWS",
    "RoundingRatios",
    "corrected_scan",
    "probe_layers",
    "rounding_ratios",
    "sample_rows",
]
