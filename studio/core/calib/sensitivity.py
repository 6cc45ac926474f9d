"""Per-tensor sensitivity: the KL a model's output moves by when only one tensor is quantized.

For every quantizable tensor and candidate qtype the scan reports the mean KL(original ‖ perturbed)
of the next-token distributions over a few calibration chunks (llama.cpp's convention: natural log,
every position counted), the tensor's bytes at that qtype, and the imatrix-weighted quantization
error ``Σ_j imatrix_j Σ_i (W − Ŵ)²_ij`` (the expected ‖(W − Ŵ)x‖² per token). Candidates are
quantized as the export would (llama.cpp's search weighted by the imatrix of the calibration text);
a qtype whose rows the tensor cannot take is measured as its fallback.

**Exact mode** runs on the sequential layer runner (``runner.run_model``) as one consumer: the runner
moves the original chunks through the model layer by layer; ``SensitivityScan`` carries *perturbed
streams* alongside. When layer ``l`` is on the device it (1) moves every stream started in earlier
layers through layer ``l`` (batched, original weights), and (2) starts new streams for the tensors of
layer ``l``: the layer's original inputs run through the layer once with that tensor replaced by its
dequantized candidate (all candidates of one tensor in one batched call). Every stream therefore
runs only from its perturbed layer on, on a few hundred tokens, and memory stays one layer plus the
streams' differences from the original (float16). At the head, the output change is
``δ = W_head (ĥ' − ĥ)`` (bfloat16 matrix product of a small difference, float32 result) and
``KL = log Σ_v p_v e^{δ_v} − Σ_v p_v δ_v``, which needs no second full softmax. The token embedding
(tied to the output or not) and an untied output head are streams too.

**Proxy mode** measures exactly only a sample: every tensor of a few layers (first, last, and evenly
in between) at one reference qtype (its smallest candidate). Their ``gain = KL / error`` is
interpolated over layers per role (log-linear), and every other (tensor, qtype) is predicted as
``gain × error``, the error coming from a sample of rows. A few held-out pairs are measured exactly
too and reported as ``check`` (how far the proxy is from the exact KL).

``plans`` measured in the same run are streams in which every tensor takes its plan's qtype at once:
the allocator's interaction check (``studio.core.plan.allocate``).

The scan's parts: ``scan_settings`` (settings, chunks, imatrix names), ``scan_rows`` (quantizing rows),
``scan_streams`` (the exact consumer), ``scan_kl`` (KL from the logits' change), ``scan_proxy`` (the
proxy's sample and the record's assembly), ``scan_cache`` (scans kept between runs); this module runs
them and keeps every public name importable from here.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.calib.calibrate import _open, calibrate, prepare_input
from studio.core.calib.data import Chunks
from studio.core.calib.imatrix import imatrix_from_stats
from studio.core.calib.runner import run_model
from studio.core.calib.scan_cache import imatrix_digest, load_cached_scan, save_cached_scan, scan_digest
from studio.core.calib.scan_kl import kl_from_delta, torch_cat, torch_stack
from studio.core.calib.scan_proxy import assemble, gain_layers, gain_type, measure_sets
from studio.core.calib.scan_rows import quantize_rows, weighted_error
from studio.core.calib.scan_settings import (
    DEFAULT_TYPES,
    SCAN_CHUNKS,
    SCAN_CTX,
    ScanSettings,
    hf_imatrix,
    spread_chunks,
)
from studio.core.calib.scan_streams import PROXY_MIN_ROWS, PROXY_ROW_SHARE, SensitivityScan
from studio.core.errors import CalibrationError
from studio.core.export.run import check_exportable
from studio.core.jobs import JobContext, null_context
from studio.core.model.rotate import Rotation, rotation_key
from studio.core.plan.scan import (  # the scan record lives with the plans it feeds
    SCAN_VERSION,
    Mode,
    ProxyCheck,
    ScanTarget,
    Sensitivity,
    TensorSensitivity,
    TypeCost,
    scan_targets,
    sizes_only,
)
from studio.core.quant.types import QTYPES
from studio.core.stats.cache import checkpoint_key


def scan_sensitivity(
    model: str | os.PathLike[str],
    text: Any = "builtin",
    settings: ScanSettings | None = None,
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    plans: Sequence[Mapping[str, str]] = (),
    also: Sequence[Any] = (),
    cache_dir: str | os.PathLike[str] | None = None,
    stats_cache: Any = None,
    ctx: JobContext | None = None,
    executor: Any = None,
    rotation: Rotation | None = None,
) -> Sensitivity:
    """Scan ``model`` (a Hugging Face folder) on ``text`` (``"builtin"``, a file or a ``CalibrationText``).

    ``also``: more texts whose chunks (``n_chunks`` each, spread alike) the scan measures beside
    ``text``'s, e.g. texts of other kinds, so the plan does not fit one kind only; the imatrix stays
    ``text``'s. ``imatrix`` (GGUF names, as ``Imatrix``) is computed from ``text`` when not given; ``plans`` are
    measured in the same run (``Sensitivity.plan_kls``); a scan found in ``cache_dir`` (JSON files
    keyed by the model's files, the text, the settings and the imatrix) is returned without running.
    ``executor`` (``studio.core.executor``): a distributed one runs the pairs as units on a cluster
    (``studio.core.cluster.scan``), with the same results; finished units are kept in ``cache_dir``.
    ``rotation``: scan the model as ``export --rotate`` writes it (its own imatrix, cache key and head).
    """
    st = settings or ScanSettings()
    ctx = ctx or null_context()
    for q in st.types:
        if q not in QTYPES or QTYPES[q].is_float:
            raise CalibrationError(f"{q} is not a quantized GGUF type a scan can measure.")
    t0, c0 = time.monotonic(), time.process_time()
    ckpt = _open(model, False, rotation)
    if rotation is not None:
        executor = None  # a cluster's workers open the model by its path, unrotated: the scan runs here
    try:
        info = ckpt.info

        check_exportable(info)
        targets, fixed = scan_targets(info, st.types)
        if not targets:
            raise CalibrationError(f"{Path(str(info.path)).name} has no tensor a GGUF plan quantizes.")
        ctx.report(0, 1, "Tokenizing the calibration text")
        inp = prepare_input(info.path, text, n_ctx=st.calib_ctx, n_chunks=st.calib_chunks, ctx=ctx)
        if imatrix is None:
            ctx.report(0, 1, "Calibrating (importance matrix)")
            stats = calibrate(
                info.path,
                inp.data,
                n_ctx=st.calib_ctx,
                n_chunks=st.calib_chunks,
                device=st.device,
                dtype="float32",
                histogram=False,
                cache=stats_cache,
                ctx=ctx,
                rotation=rotation,
            )
            imatrix = imatrix_from_stats(stats, info)
        qw = hf_imatrix(imatrix, info)
        chunks = spread_chunks(inp.chunks, st.n_chunks, st.n_ctx)
        extra = [
            prepare_input(info.path, t, n_ctx=st.calib_ctx, n_chunks=st.calib_chunks, ctx=ctx) for t in also
        ]
        if extra:
            parts = [chunks, *(spread_chunks(e.chunks, st.n_chunks, st.n_ctx) for e in extra)]
            chunks = Chunks(
                np.ascontiguousarray(np.concatenate([c.tokens for c in parts])),
                chunks.n_ctx,
                sum(c.n_text_tokens for c in parts),
                chunks.bos,
                " + ".join(c.dataset for c in parts),
            )
        ck = checkpoint_key(info, "")
        key = scan_digest(
            {
                "v": SCAN_VERSION,
                "model": str(info.path),
                "files": [ck.mtime_ns, ck.size],
                "text": inp.data.digest,
                **({"also": [e.data.digest for e in extra]} if extra else {}),
                "settings": dataclasses.asdict(st),
                "imatrix": imatrix_digest(qw),
                "plans": [sorted(p.items()) for p in plans],
                **rotation_key(rotation),
            }
        )
        cached = load_cached_scan(cache_dir, key)
        if cached is not None:
            return cached
        n_layers = max([t.layer + 1 for t in targets if t.layer is not None], default=0)
        exact, errors, check = measure_sets(targets, st, n_layers)
        if executor is not None and executor.distributed:
            scan_on_cluster = executor.job("scan")  # studio.core.cluster.scan

            units = None if cache_dir is None else Path(cache_dir) / f"sensitivity-{key}.units"
            scan = scan_on_cluster(
                executor, ckpt, chunks, targets, st, exact=exact, errors=errors, plans=plans, imatrix=qw,
                resume_dir=units, ctx=ctx,
            )  # fmt: skip
        else:
            scan = SensitivityScan(
                targets, chunks.tokens, exact=exact, errors=errors, plans=plans, imatrix=qw, ctx=ctx
            )
            run_model(
                ckpt, chunks, [scan], device=st.device, dtype="float32", mode="layerwise", ctx=ctx.muted()
            )
    finally:
        ckpt.close()
    name = " + ".join([inp.data.name, *(e.data.name for e in extra)])
    result = assemble(info, name, st, targets, fixed, scan, check, chunks.n_tokens)
    result = dataclasses.replace(
        result,
        seconds=time.monotonic() - t0,
        cpu_seconds=time.process_time() - c0,
        key=key,
        rotation=None if rotation is None else rotation.seed,
    )
    save_cached_scan(cache_dir, key, result)
    if cache_dir is not None:  # the units a distributed scan kept for a resume are in the result now
        shutil.rmtree(Path(cache_dir) / f"sensitivity-{key}.units", ignore_errors=True)
    return result


def measure_plans(
    model: str | os.PathLike[str],
    plans: Sequence[Mapping[str, str]],
    text: Any = "builtin",
    settings: ScanSettings | None = None,
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    ctx: JobContext | None = None,
    executor: Any = None,
    rotation: Rotation | None = None,
) -> tuple[float, ...]:
    """The KL of each plan (HF name → qtype) on the scan chunks, every tensor quantized at once
    (``executor``: a distributed one measures each plan as a unit, as the scan does; ``rotation``: on the
    rotated model, as ``scan_sensitivity``)."""
    st = dataclasses.replace(settings or ScanSettings(), exact=True)
    return _run_plans(model, plans, text, st, imatrix, ctx, executor, rotation)


def measure_plans_on(
    model: str | os.PathLike[str],
    plans: Sequence[Mapping[str, str]],
    inputs: Sequence[tuple[Any, ScanSettings]],
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    ctx: JobContext | None = None,
    rotation: Rotation | None = None,
) -> tuple[tuple[float, ...], ...]:
    """The KL of each plan on each of several texts, ``((text, settings), …)``, in one run: every plan's
    tensors are quantized once and the texts' chunks (of one length) go through the model together.
    Returns one tuple of plan KLs per text."""
    ctx = ctx or null_context()
    if not inputs:
        return ()
    ckpt = _open(model, False, rotation)
    try:
        info = ckpt.info
        targets, _ = scan_targets(info, inputs[0][1].types)
        parts = []
        for text, st in inputs:
            inp = prepare_input(info.path, text, n_ctx=st.calib_ctx, n_chunks=st.calib_chunks, ctx=ctx)
            parts.append(spread_chunks(inp.chunks, st.n_chunks, st.n_ctx))
        if len({c.n_ctx for c in parts}) != 1:
            raise CalibrationError("Texts measured in one run need chunks of one length.")
        first = parts[0]
        chunks = Chunks(
            np.ascontiguousarray(np.concatenate([c.tokens for c in parts])),
            first.n_ctx,
            sum(c.n_text_tokens for c in parts),
            first.bos,
            " + ".join(c.dataset for c in parts),
        )
        qw = hf_imatrix(imatrix or {}, info)
        scan = SensitivityScan(
            targets,
            chunks.tokens,
            exact={},
            plans=plans,
            imatrix=qw,
            groups=[c.n_chunks for c in parts],
            ctx=ctx,
        )
        run_model(ckpt, chunks, [scan], device=inputs[0][1].device, dtype="float32", mode="layerwise",
                  ctx=ctx.muted())  # fmt: skip
    finally:
        ckpt.close()
    return tuple(tuple(scan.plan_group_kl[i][g] for i in range(len(plans))) for g in range(len(parts)))


def _run_plans(
    model: Any,
    plans: Sequence[Mapping[str, str]],
    text: Any,
    st: ScanSettings,
    imatrix: Any,
    ctx: Any,
    executor: Any = None,
    rotation: Rotation | None = None,
) -> tuple[float, ...]:
    ctx = ctx or null_context()
    ckpt = _open(model, False, rotation)
    if rotation is not None:
        executor = None  # the workers would open the model unrotated
    try:
        info = ckpt.info
        targets, _ = scan_targets(info, st.types)
        inp = prepare_input(info.path, text, n_ctx=st.calib_ctx, n_chunks=st.calib_chunks, ctx=ctx)
        chunks = spread_chunks(inp.chunks, st.n_chunks, st.n_ctx)
        qw = hf_imatrix(imatrix or {}, info)
        if executor is not None and executor.distributed:
            on_cluster = executor.job("scan")  # studio.core.cluster.scan
            scan = on_cluster(
                executor, ckpt, chunks, targets, st, exact={}, errors={}, plans=plans, imatrix=qw, ctx=ctx
            )
            return tuple(scan.plan_kl)
        scan = SensitivityScan(targets, chunks.tokens, exact={}, plans=plans, imatrix=qw, ctx=ctx)
        run_model(ckpt, chunks, [scan], device=st.device, dtype="float32", mode="layerwise", ctx=ctx.muted())
    finally:
        ckpt.close()
    return tuple(scan.plan_kl)


__all__ = [
    "DEFAULT_TYPES",
    "PROXY_MIN_ROWS",
    "PROXY_ROW_SHARE",
    "SCAN_CHUNKS",
    "SCAN_CTX",
    "Mode",
    "ProxyCheck",
    "ScanSettings",
    "ScanTarget",
    "Sensitivity",
    "SensitivityScan",
    "TensorSensitivity",
    "TypeCost",
    "gain_layers",
    "gain_type",
    "hf_imatrix",
    "kl_from_delta",
    "measure_plans",
    "measure_plans_on",
    "quantize_rows",
    "scan_sensitivity",
    "scan_targets",
    "sizes_only",
    "spread_chunks",
    "torch_cat",
    "torch_stack",
    "weighted_error",
]
