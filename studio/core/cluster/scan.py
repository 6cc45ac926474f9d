"""The sensitivity scan's (tensor, type) pairs as independent units on an executor.

In process the scan carries every perturbed stream through the model in one layer-by-layer run
(``studio.core.calib.sensitivity``). Here the head runs the original model once, layer by layer, and
puts each layer's input hidden states into the object store (once per layer, ``Executor.share``);
then the pairs are submitted as a few units per worker (``_tasks``): each unit holds the candidates
of every tensor of some starting points (decoder layers, the token embedding, the output head), the
starting points dealt largest first to the unit with the least work, and each plan is a unit of its
own. A unit runs the scan's own consumer (``SensitivityScan``, so every number is computed by the
same code) from its earliest layer to the head, starting each tensor's streams at its layer, on a
worker that reads the checkpoint through the same lazy reader (one layer's weights at a time) from a
path it can see, and reads the original's hidden states of each layer and its logits from the
object store. The head assembles the KLs in the scan's tensor order.

Proxy errors (a random sample of rows per tensor) are computed on the head during its pass, in the
same order as in process, so a proxy scan is the same scan wherever its pairs ran.

Resuming: with a cache folder each finished unit is kept (``sensitivity-KEY.units/``, one JSON file
per unit, written atomically); a rerun of the same scan after a lost cluster submits only the pairs
not measured yet (cut into units for the cluster it runs on, which may have another size).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.atomic import write_atomic
from studio.core.calib import runner as R
from studio.core.calib.calibrate import _open
from studio.core.calib.data import Chunks
from studio.core.calib.runner import Consumer, LayerView, RunSpec, run_model
from studio.core.calib.sensitivity import ScanSettings, ScanTarget, SensitivityScan, scan_targets
from studio.core.errors import CalibrationError
from studio.core.executor import ClusterError, Executor, Unit
from studio.core.jobs import JobContext, null_context
from studio.core.units import format_bytes


@dataclass
class ClusterScan:
    """What the scan's assembly reads: KL and error per (tensor, qtype), and each plan's KL."""

    kl: dict[tuple[str, str], float] = field(default_factory=dict)
    err: dict[tuple[str, str], float] = field(default_factory=dict)
    plan_kl: list[float] = field(default_factory=list)
    resumed: int = 0  # pairs (and plans) taken from a previous, interrupted run
    workers: dict[int, int] = field(default_factory=dict)  # worker pid → its peak resident bytes
    unit_seconds: list[float] = field(default_factory=list)  # each unit's time on its worker


UNITS_PER_WORKER = 3  # units per worker: few enough that a unit's fixed costs (its head, its layers'
# loads) stay small against its streams, enough to balance the workers and to resume after a loss


@dataclass(frozen=True)
class _Task:
    key: str
    start: int  # the earliest starting point: -1 the token embedding, n_layers the output head only
    exact: Mapping[str, tuple[str, ...]]
    plans: tuple[int, ...]

    @property
    def weight(self) -> int:
        return sum(len(v) for v in self.exact.values()) + len(self.plans)


def _start_of(t: ScanTarget, n_layers: int) -> int:
    return -1 if t.kind == "embedding" else n_layers if t.kind == "output" else int(t.layer or 0)


def _tasks(
    targets: Sequence[ScanTarget],
    exact: Mapping[str, Sequence[str]],
    plans: Sequence[int],
    n_layers: int,
    n_units: int,
) -> list[_Task]:
    """The pairs of ``exact`` and the ``plans`` as at most ``n_units`` units (plus one per plan).

    A starting point's streams cost (pairs × layers still to go); the starting points are dealt to the
    units largest first, each to the unit with the least work so far, so the units are about even and
    the longest start first. A unit carries the streams of all its starting points in one run, as the
    scan does in process: its head's fixed costs and its layers' loads are paid once per unit.
    """
    by_start: dict[int, dict[str, tuple[str, ...]]] = {}
    for t in targets:
        qs = tuple(exact.get(t.name, ()))
        if qs:
            by_start.setdefault(_start_of(t, n_layers), {})[t.name] = qs
    work = {s: sum(map(len, ex.values())) * (n_layers - max(s, 0) + 1) for s, ex in by_start.items()}
    bins: list[tuple[int, list[int]]] = [(0, []) for _ in range(max(1, min(n_units, len(by_start))))]
    for s in sorted(by_start, key=lambda s: (-work[s], s)):
        i = min(range(len(bins)), key=lambda i: (bins[i][0], i))
        bins[i] = (bins[i][0] + work[s], [*bins[i][1], s])
    out = [_Task(f"plan-{i}", -1, {}, (i,)) for i in plans]
    for _work, starts in sorted(bins, key=lambda b: -b[0]):
        if not starts:
            continue
        ex = {n: qs for s in sorted(starts) for n, qs in by_start[s].items()}
        digest = hashlib.sha256(json.dumps(sorted(ex.items())).encode()).hexdigest()[:12]
        out.append(_Task(f"pairs-{digest}", min(starts), ex, ()))
    return out


class _Recorder(Consumer):
    """The head's pass: each layer's input hidden states (per chunk) and the logits, into the store."""

    needs_layerwise = True
    wants_head = True

    def __init__(self, executor: Executor, ctx: JobContext) -> None:
        self.ex = executor
        self.ctx = ctx
        self.states: list[Any] = []
        self._logits: dict[int, Any] = {}
        self.logits_ref: Any = None
        self.n_layers = 0

    def start(self, spec: RunSpec) -> None:
        self.n_layers = spec.n_layers

    def layer_collected(self, view: LayerView) -> None:
        self.states.append(self.ex.share([x.detach().cpu() for x in view.inputs]))
        self.ctx.report(
            view.index + 1, self.n_layers + 1, f"original: layer {view.index + 1}/{self.n_layers}"
        )

    def logits(self, chunk: int, logits: Any) -> None:
        self._logits[chunk] = logits.detach().cpu()

    def finish(self) -> None:
        self.logits_ref = self.ex.share([self._logits[c] for c in sorted(self._logits)])
        self._logits.clear()


# ------------------------------------------------------------------------------------------ head


def scan_on_cluster(
    executor: Executor,
    ckpt: Any,
    chunks: Any,
    targets: Sequence[ScanTarget],
    st: ScanSettings,
    *,
    exact: Mapping[str, Sequence[str]],
    errors: Mapping[str, Sequence[str]],
    plans: Sequence[Mapping[str, str]],
    imatrix: Mapping[str, np.ndarray],
    resume_dir: Path | None = None,
    ctx: JobContext | None = None,
) -> ClusterScan:
    """The scan's measurements with its pairs run as units on ``executor`` (see the module docstring)."""
    ctx = ctx or null_context()
    n_layers = max([t.layer + 1 for t in targets if t.layer is not None], default=0)
    out = ClusterScan(plan_kl=[float("nan")] * len(plans))
    # a resume keeps pairs, not units: a rerun on another cluster (another unit count) still resumes
    _load_units(resume_dir, out)
    total = sum(len(qs) for qs in exact.values()) + len(plans)
    left = {n: tuple(q for q in qs if (n, q) not in out.kl) for n, qs in exact.items()}
    left_plans = [i for i, v in enumerate(out.plan_kl) if v != v]  # NaN: not measured yet
    todo = _tasks(targets, left, left_plans, n_layers, executor.workers * UNITS_PER_WORKER)
    out.resumed = total - sum(t.weight for t in todo)
    if out.resumed:
        ctx.log(f"Resuming the scan: {out.resumed} of {total} pairs were measured before.")
    # in process the pairs quantized whole (measured or in a plan) draw no sample: leave them out here
    # too, so the proxy's row samples are drawn in the same order and give the same errors
    full = {(n, q) for n, qs in exact.items() for q in qs} | {(n, q) for p in plans for n, q in p.items()}
    sampled = {n: tuple(q for q in qs if (n, q) not in full) for n, qs in errors.items()}
    head = SensitivityScan(targets, chunks.tokens, exact={}, errors=sampled, imatrix=imatrix, ctx=ctx)
    rec = _Recorder(executor, ctx)
    run_model(ckpt, chunks, [rec, head], device=st.device, dtype="float32", mode="layerwise", ctx=ctx.muted())
    out.err.update(head.err)
    if not todo:
        return out
    job = {
        "model": str(ckpt.info.path),
        "types": tuple(st.types),
        "tokens": np.ascontiguousarray(chunks.tokens),
        "n_ctx": int(chunks.n_ctx),
        "device": st.device,
        "imatrix": executor.share(dict(imatrix)),
        "plans": executor.share([dict(p) for p in plans]),
        "final": executor.share(head._last),
        "logits": rec.logits_ref,
    }
    job_ref = executor.share(job)
    units = [
        Unit((job_ref, t.start, rec.states[max(t.start, 0) :], dict(t.exact), t.plans), t.weight, t.key)
        for t in todo
    ]
    try:
        for i, res in executor.run(
            scan_unit, units, ctx, what="scan pairs", done_before=out.resumed, total=total
        ):
            _merge(out, res)
            _save_unit(resume_dir, todo[i].key, res)
            pid, rss = res.get("worker", (0, 0))
            out.workers[int(pid)] = max(out.workers.get(int(pid), 0), int(rss))
            out.unit_seconds.append(float(res.get("seconds", 0.0)))
    except ClusterError as err:
        if resume_dir is None or type(err).__name__ != "ClusterLost":
            raise
        raise type(err)(
            f"{str(err).rstrip('.')}; the finished pairs are kept in the scan cache, so running the same "
            "scan again resumes from them."
        ) from None

    peaks = ", ".join(format_bytes(b) for _, b in sorted(out.workers.items()))
    ctx.log(
        f"{len(units)} units on {len(out.workers)} worker{'s' * (len(out.workers) != 1)} of the {executor.label} "
        f"({sum(out.unit_seconds):.1f} s of worker time); peak memory per worker: {peaks}."
    )
    return out


def _merge(out: ClusterScan, res: Mapping[str, Any]) -> None:
    for n, q, v in res["kl"]:
        out.kl[(n, q)] = float(v)
    for n, q, v in res["err"]:
        out.err[(n, q)] = float(v)
    for i, v in res["plan_kl"]:
        out.plan_kl[int(i)] = float(v)


def _load_units(resume_dir: Path | None, out: ClusterScan) -> None:
    """Merge every unit a previous run of this scan finished (one that cannot be read is measured again)."""
    if resume_dir is None or not resume_dir.is_dir():
        return
    for f in sorted(resume_dir.glob("*.json")):
        try:
            res = json.loads(f.read_text(encoding="utf-8"))  # noqa: TID251 - resume files are written by the scan's own workers
            part = ClusterScan(plan_kl=[float("nan")] * len(out.plan_kl))
            _merge(part, res)
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        out.kl.update(part.kl)
        out.err.update(part.err)
        for i, v in enumerate(part.plan_kl):
            if v == v:
                out.plan_kl[i] = v


def _save_unit(resume_dir: Path | None, key: str, res: Mapping[str, Any]) -> None:
    if resume_dir is None:
        return
    try:
        resume_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(resume_dir / f"{key}.json", json.dumps(res))
    except OSError:
        pass  # without it a rerun measures this unit again


# ------------------------------------------------------------------------------------------ worker


def _resolve(x: Any) -> Any:
    """A shared value: a Ray object reference is fetched, anything else is the value itself."""
    if type(x).__name__ == "ObjectRef":
        import ray

        return ray.get(x)
    return x


class _WorkerModel:
    """The model on a worker, as the layer runner sets it up: skeleton on the meta device, embeddings,
    final norm and head loaded, each layer's arguments (mask, positions) captured; layers are loaded one
    at a time by the units. Kept between the units of one scan (building it costs seconds)."""

    def __init__(self, path: str, device: str, tokens: np.ndarray, n_ctx: int) -> None:
        import torch
        from transformers import AutoConfig

        self.ckpt = _open(path, False)
        info = self.ckpt.info
        dev, dt = R._resolve(device, "float32")
        config = AutoConfig.from_pretrained(str(info.path), trust_remote_code=False)
        config._experts_implementation = "eager"
        n = int(getattr(config, "num_hidden_layers", 0) or info.n_layers or 0)
        try:
            sk = R._build_skeleton(info, config, n)
        except R.SkeletonError as err:
            raise CalibrationError(f"{info.path.name} cannot be run layer by layer: {err}.") from None
        self.sk, self.n = sk, len(sk.layers)
        self.mat = R._Materializer(sk, self.ckpt, dev, dt)
        layer_prefix = sk.layers_path + "."
        self.mat.load([p for p in sk.names if not p.startswith(layer_prefix)])
        if sk.tied_head and sk.head_path:
            R._set_param(sk.model, f"{sk.head_path}.weight", sk.model.get_input_embeddings().weight)
        self.mat.buffers_to_device(sk.model)
        sites = []
        for i, layer in enumerate(sk.layers):
            sites += R._sites_in(sk.model, f"{sk.layers_path}.{i}", layer, i)
        if sk.head_path:
            hm = sk.model.get_submodule(sk.head_path)
            sites.append(
                R.LinearSite(f"{sk.head_path}.weight", sk.head_path, None, hm.in_features, hm.out_features)
            )
        self.spec = R.RunSpec(
            str(info.path),
            R.RunnerMode.LAYERWISE,
            dev,
            str(dt).replace("torch.", ""),
            self.n,
            int(getattr(sk.model.config, "hidden_size", 0) or 0),
            int(tokens.shape[0]),
            n_ctx,
            tuple(sites),
            True,
            R.OuterView(sk, dev, True),
        )
        chunks = Chunks(np.asarray(tokens), n_ctx, int(tokens.size), None, "")
        with torch.no_grad():
            _, self.layer_args = R._capture_inputs(
                sk, chunks, dev, R.RunMeter(null_context()), null_context(), 0.0
            )
        self.info = info

    def run(self, scan: SensitivityScan, start: int, states: Sequence[Any], final: Any, logits: Any) -> None:
        """``scan`` from layer ``start`` (-1: the embedding) to the head, on the original's states."""
        import torch

        sk = self.sk
        with torch.no_grad():
            scan.start(self.spec)
            for k, i in enumerate(range(max(start, 0), self.n)):
                inputs = _resolve(states[k])
                paths = R._layer_paths(sk, i)
                try:
                    self.mat.load(paths)
                    layer = sk.layers[i]
                    self.mat.buffers_to_device(layer)
                    view = LayerView(
                        i,
                        layer,
                        self.spec.sites_of(i),
                        sk.model,
                        f"{sk.layers_path}.{i}.",
                        sk.names,
                        args=self.layer_args[i],
                        inputs=inputs,
                    )
                    scan.layer_collected(view)
                finally:
                    self.mat.unload(paths)
            if start >= self.n:
                scan._last = _resolve(final)
            for c, lg in enumerate(_resolve(logits)):
                scan.logits(c, lg)
            scan.finish()

    def close(self) -> None:
        self.ckpt.close()


# one model per worker process: the units of a scan reuse it (a new scan of another model replaces it)
_WORKER: dict[tuple[Any, ...], _WorkerModel] = {}


def _worker_model(job: Mapping[str, Any]) -> _WorkerModel:
    key = (job["model"], job["device"], job["n_ctx"], hashlib.sha256(job["tokens"].tobytes()).hexdigest())
    wm = _WORKER.get(key)
    if wm is None:
        for old in _WORKER.values():
            old.close()
        _WORKER.clear()
        wm = _WORKER[key] = _WorkerModel(job["model"], job["device"], job["tokens"], job["n_ctx"])
    return wm


def scan_unit(
    job: Any, start: int, states: Sequence[Any], exact: Mapping[str, Sequence[str]], plan_ids: Sequence[int]
) -> dict[str, Any]:
    """One unit: the KL (and error) of every pair in ``exact`` (tensors starting at ``start``) and of
    the plans ``plan_ids``, measured from layer ``start`` to the head. Runs on a worker."""
    t0 = time.monotonic()
    job = _resolve(job)
    wm = _worker_model(job)
    targets, _ = scan_targets(wm.info, job["types"])
    imatrix = _resolve(job["imatrix"])
    names = set(exact)
    all_plans = _resolve(job["plans"]) if plan_ids else []
    plans = [all_plans[i] for i in plan_ids]
    qw = dict(imatrix) if plans else {k: v for k, v in imatrix.items() if k in names}
    scan = SensitivityScan(targets, job["tokens"], exact=exact, plans=plans, imatrix=qw)
    wm.run(scan, start, states, job["final"], job["logits"])
    return {
        "kl": [[n, q, v] for (n, q), v in scan.kl.items()],
        "err": [[n, q, v] for (n, q), v in scan.err.items() if n in names or plans],
        "plan_kl": [[i, v] for i, v in zip(plan_ids, scan.plan_kl, strict=True)],
        "seconds": time.monotonic() - t0,
        "worker": [os.getpid(), _peak_rss()],
    }


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (0 where the platform does not say)."""
    try:
        import resource  # the Ray worker's side, and POSIX only (absent on Windows)

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        return 0


__all__ = ["ClusterScan", "scan_on_cluster", "scan_unit"]
