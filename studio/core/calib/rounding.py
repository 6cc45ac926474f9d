"""Plan with the rounding the export will use: a calibrated correction of the sensitivity scan for GPTQ.

The scan (``sensitivity``) measures every (tensor, qtype) under llama.cpp's imatrix-weighted search, the
rounding of ``--method imatrix``. GPTQ (``--method gptq``, ``awq+gptq``, ``best``) rounds the same grid
so that the layer's *output* error ``tr((W − Ŵ) H (W − Ŵ)ᵀ)`` shrinks, and by how much depends on the
type: a coarse grid gains most. Planning with the scan as measured lets the allocator trade bytes for the
imatrix rounding's errors while the file is written with GPTQ's, so the allocation and the rounding
disagree.

``rounding_ratios`` measures the difference on a sample: the calibration text runs through the model
layer by layer once (the export's own collector sums ``2XᵀX/n`` of the sampled layers' linears), and
every sampled linear is rounded to each candidate type both ways; the ratio of GPTQ's output error to
the imatrix search's, per type (the median over the sample), is the correction. ``corrected_scan``
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from studio.core.plan.scan import Sensitivity, scan_targets
from studio.core.quant.gptq import HessianError, gptq_quantize
from studio.core.quant.gptq_lattice import LATTICE_TYPES, gptq_lattice
from studio.core.quant.grid import GRID_TYPES
from studio.core.quant.types import QTYPES
from studio.core.stats.cache import checkpoint_key

GPTQ_METHODS = frozenset({"gptq", "awq+gptq"})  # methods whose rounding the correction models
PROBE_LAYERS = 3  # decoder layers sampled: the first, the middle and the last of the proxy's layers
PROBE_CHUNKS = 8  # calibration chunks the probe runs (the CLI's default: 4096 tokens at 512)


@dataclass(frozen=True)
class RoundingRatios:
    """GPTQ's output error over the imatrix search's, per qtype, measured on a sample of linears."""

    method: str
    ratios: Mapping[str, float]  # effective qtype → median ratio (≤ 1 where GPTQ helps)
    samples: Mapping[str, tuple[float, ...]]  # effective qtype → each sampled linear's ratio
    layers: tuple[int, ...]
    tokens: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the cache and ``--json``)."""
        return {
            "method": self.method,
            "ratios": dict(self.ratios),
            "samples": {k: list(v) for k, v in self.samples.items()},
            "layers": list(self.layers),
            "tokens": self.tokens,
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
        )


class _Probe(Consumer):
    """Rounds each sampled layer's linears to every candidate type by GPTQ and by the imatrix search."""

    needs_layerwise = True

    def __init__(
        self,
        collector: ActivationCollector,
        layers: Sequence[int],
        types: Mapping[str, Sequence[str]],
        ctx: Any,
    ) -> None:
        self.collector = collector
        self.layers = set(layers)
        self.types = types  # HF name → effective qtypes
        self.ctx = ctx
        self.samples: dict[str, list[float]] = {}

    def start(self, spec: RunSpec) -> None:  # noqa: D102
        return None

    def layer_collected(self, view: LayerView) -> None:
        """GPTQ against the imatrix search for every sampled linear of this layer."""
        import torch

        if view.index not in self.layers:
            return
        sites = [s for s in view.sites if s.name in self.types and s.kind != "experts"]
        hess = self.collector.take_hessians([s.name for s in sites])
        for s in sites:
            h = hess.get(s.name)
            st = self.collector.stats_of(s.name)
            if h is None or st is None:
                continue
            w = view.weight(s).detach().to(torch.float32)
            w = (w.t() if s.kind == "conv1d" else w).contiguous().cpu()
            imx = st.mean_sq[0].astype(np.float32)
            for q in self.types[s.name]:
                self.ctx.check_cancelled()
                try:
                    rnd = gptq_lattice if q in LATTICE_TYPES else gptq_quantize  # as the export rounds
                    r = rnd(w, h[0].cpu(), q, imatrix=imx)
                except HessianError:  # a Hessian GPTQ cannot use: that sample is skipped
                    continue
                if r.error is not None and r.rtn_error and r.rtn_error > 0:
                    self.samples.setdefault(q, []).append(float(r.error) / float(r.rtn_error))

    def finish(self) -> None:  # noqa: D102
        return None


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
) -> RoundingRatios:
    """GPTQ's output error over the imatrix search's per candidate type, on a sample of decoder layers
    (``probe_layers``), calibrated on ``text`` as the export calibrates (chunks of ``n_ctx``); kept in
    ``cache_dir`` (keyed by the model's files, the text, the types and the layers)."""
    ctx = ctx or null_context()
    ckpt = _open(model, False)
    try:
        info = ckpt.info
        targets, _ = scan_targets(info, tuple(types))
        n_layers = max([t.layer + 1 for t in targets if t.layer is not None], default=0)
        picked = tuple(layers) if layers is not None else probe_layers(n_layers)
        inp = prepare_input(info.path, text, n_ctx=n_ctx, n_chunks=n_chunks, ctx=ctx)
        ck = checkpoint_key(info, "")
        key = scan_digest(
            {
                "v": 1,
                "model": str(info.path),
                "files": [ck.mtime_ns, ck.size],
                "text": inp.data.digest,
                "types": sorted(types),
                "layers": list(picked),
                "n_ctx": n_ctx,
                "n_chunks": n_chunks,
                "method": method,
            }
        )
        path = None if cache_dir is None else Path(cache_dir) / f"rounding-{key}.json"
        if path is not None and path.is_file():
            try:
                return RoundingRatios.from_dict(json.loads(path.read_text(encoding="utf-8")))
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
        collector = ActivationCollector(histogram=False, dataset=inp.data.name)
        collector.hessian_for = lambda site: site.name in names and site.kind != "experts"
        probe = _Probe(collector, picked, chosen, ctx)
        run_model(
            ckpt, inp.chunks, [collector, probe], device="cpu", dtype="float32", mode="layerwise", ctx=ctx
        )
    finally:
        ckpt.close()
    ratios = {q: float(np.median(v)) for q, v in probe.samples.items() if v}
    res = RoundingRatios(
        method, ratios, {q: tuple(v) for q, v in probe.samples.items()}, picked, inp.chunks.n_tokens
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
    "PROBE_CHUNKS",
    "PROBE_LAYERS",
    "RoundingRatios",
    "corrected_scan",
    "probe_layers",
    "rounding_ratios",
]
