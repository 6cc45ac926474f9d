"""Calibration's chunks as independent units on an executor.

Every chunk of the calibration text goes through the model alone (batch 1) in process too, so a
chunk's activations do not depend on the chunks run beside it. A unit runs the studio's own layer
runner and activation collector (``run_model``, ``ActivationCollector``) over a few consecutive
chunks on a worker, keeping each chunk's sums apart; the head merges them chunk by chunk in text
order from zero (``merge_input_stats``, ``HiddenAccumulator.merge``), which adds the same numbers in
the same order as the in-process run: the statistics (and the imatrix) are the same.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from studio.core.calib.accumulators import HiddenAccumulator, merge_input_stats
from studio.core.calib.calibrate import CalibrationInput, _open
from studio.core.calib.collect import ActivationCollector, ActivationStats
from studio.core.calib.data import Chunks
from studio.core.calib.runner import Consumer, RunInfo, RunSpec, run_model
from studio.core.executor import Executor, Unit
from studio.core.jobs import JobContext, null_context

CHUNKS_PER_UNIT = 4  # at most: a unit pays the model's set-up and its layers' loads once


def calibrate_on_cluster(
    executor: Executor,
    model: str,
    inp: CalibrationInput,
    *,
    histogram: bool,
    process_output: bool,
    device: str,
    dtype: str,
    mode: str,
    ctx: JobContext | None = None,
) -> ActivationStats:
    """``calibrate``'s statistics with its chunks run as units on ``executor`` (module docstring)."""
    ctx = ctx or null_context()
    t0 = time.monotonic()
    n = inp.chunks.n_chunks
    per = max(1, min(CHUNKS_PER_UNIT, -(-n // max(1, 2 * executor.workers))))  # ≥ 2 units per worker
    groups = [list(range(a, min(n, a + per))) for a in range(0, n, per)]
    units = [
        Unit(
            (
                model,
                np.ascontiguousarray(inp.chunks.tokens[g]),
                inp.chunks.n_ctx,
                histogram,
                process_output,
                device,
                dtype,
                mode,
            ),
            len(g),
            f"chunks {g[0] + 1}-{g[-1] + 1}",
        )  # fmt: skip
        for g in groups
    ]
    parts: list[Any] = [None] * len(groups)
    for i, res in executor.run(calib_unit, units, ctx, what="calibration chunks"):
        parts[i] = res
    chunks = [c for p in parts for c in p["chunks"]]  # text order
    first = parts[0]
    inputs: dict[str, Any] = {}
    merged: dict[int, Any] = {}  # sites that read one tensor share one statistics object, as in process
    for name, group in first["chunks"][0]["share"].items():
        if group not in merged:
            merged[group] = merge_input_stats([c["inputs"][name] for c in chunks])
        inputs[name] = merged[group]
    hidden = []
    for layer, width in first["hidden"]:
        acc = HiddenAccumulator(layer, width, "cpu")
        for c in chunks:
            acc.merge(c["hidden"][layer])
        hidden.append(acc.result())
    info: RunInfo = first["info"]
    info = RunInfo(
        info.mode, info.device, info.dtype, info.n_layers, n, inp.chunks.n_tokens, time.monotonic() - t0,
        info.recomputed_layers, info.peak_layer_bytes,
    )  # fmt: skip
    sites = tuple(s for s in first["sites"] if s.name in inputs)
    workers = {p["worker"] for p in parts}
    ctx.log(
        f"{len(units)} calibration units on {len(workers)} worker{'s' * (len(workers) != 1)} of the "
        f"{executor.label}."
    )
    return ActivationStats(
        first["model"], inp.data.name, inp.chunks.n_ctx, n, sites, inputs, tuple(hidden), info, inp.warnings
    )


class _PerChunk(Consumer):
    """Feeds one activation collector per chunk (so each chunk's sums stay apart) and keeps each
    chunk's hidden-state sums per layer."""

    def __init__(self, n_chunks: int, histogram: bool, head: bool) -> None:
        self.collectors = [ActivationCollector(histogram=histogram) for _ in range(n_chunks)]
        self.hidden: list[dict[int, HiddenAccumulator]] = [{} for _ in range(n_chunks)]
        self.wants_head = head

    def start(self, spec: RunSpec) -> None:
        for c in self.collectors:
            c.start(spec)

    def observe(self, site: Any, x: Any, chunk: int, expert: int = 0) -> None:
        self.collectors[chunk].observe(site, x, chunk, expert)

    def layer_collected(self, view: Any) -> None:
        for c in self.collectors:
            c.layer_collected(view)

    def layer_output(self, layer: int, chunk: int, hidden: Any) -> None:
        accs = self.hidden[chunk]
        if layer not in accs:
            accs[layer] = HiddenAccumulator(layer, int(hidden.shape[-1]), hidden.device)
        accs[layer].add(hidden)


def calib_unit(
    model: str,
    tokens: np.ndarray,
    n_ctx: int,
    histogram: bool,
    process_output: bool,
    device: str,
    dtype: str,
    mode: str,
) -> dict[str, Any]:
    """Chunks ``tokens`` through the model (a worker), each chunk's statistics apart."""
    rec = _PerChunk(int(tokens.shape[0]), histogram, process_output)
    ckpt = _open(model, False)
    try:
        chunks = Chunks(np.asarray(tokens), n_ctx, int(tokens.size), None, "")
        info = run_model(ckpt, chunks, [rec], device=device, dtype=dtype, mode=mode)
    finally:
        ckpt.close()
    out = []
    for col, hid in zip(rec.collectors, rec.hidden, strict=True):
        st = col.result(info)
        ids: dict[int, int] = {}
        out.append(
            {
                "inputs": dict(st.inputs),
                "share": {k: ids.setdefault(id(v), len(ids)) for k, v in st.inputs.items()},
                "hidden": {i: _to_cpu(a) for i, a in hid.items()},
            }
        )
    st0 = rec.collectors[0].result(info)
    hidden = [(i, int(a.absmax.shape[0])) for i, a in sorted(rec.hidden[0].items())]
    return {"chunks": out, "sites": st0.sites, "model": st0.model, "info": info, "hidden": hidden,
            "worker": os.getpid()}  # fmt: skip


def _to_cpu(acc: HiddenAccumulator) -> HiddenAccumulator:
    acc.sums, acc.absmax = acc.sums.cpu(), acc.absmax.cpu()
    return acc


__all__ = ["calib_unit", "calibrate_on_cluster"]
