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
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.atomic import write_atomic
from studio.core.calib.calibrate import _open, calibrate, prepare_input
from studio.core.calib.data import Chunks
from studio.core.calib.imatrix import imatrix_from_stats
from studio.core.calib.runner import Consumer, LayerView, LinearSite, RunSpec, run_model
from studio.core.errors import CalibrationError
from studio.core.export.run import check_exportable
from studio.core.gguf.layout import layout
from studio.core.jobs import JobContext, null_context
from studio.core.plan.scan import (  # the scan record lives with the plans it feeds
    LOW_BIT_SCAN_TYPES,
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
from studio.core.quant.types import QTYPES, tensor_bytes
from studio.core.stats.cache import checkpoint_key
from studio.core.units import format_eta

DEFAULT_TYPES: tuple[str, ...] = (
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "IQ4_XS",
    "IQ4_NL",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    *LOW_BIT_SCAN_TYPES,
)
"""Candidate qtypes of a scan (Q2_K … Q8_0, IQ4_XS, IQ4_NL, the legacy 32-weight types and the low-bit ones)."""

SCAN_CTX = 128  # tokens per scan chunk: short chunks keep the perturbed streams cheap
SCAN_CHUNKS = 2
PROXY_ROW_SHARE = 1 / 16  # rows of a tensor quantized to estimate its error in proxy mode
PROXY_MIN_ROWS = 64
_BATCH_TOKENS = 8192  # tokens per batched layer call (bounds the activations' memory)
_DELTA_DTYPE = "float16"  # streams store h' − h: small differences keep their precision in float16
_F16_MAX = 65000.0
_HEAD_GROUP = 16  # streams whose final norm runs in one call at the head


# ------------------------------------------------------------------------------------------ quantizing


def _rows_of(w: Any, site: LinearSite | None) -> Any:
    """The weight as GGUF rows (float32 numpy, rows × n_per_row)."""
    x = w.detach().float().cpu()
    if site is not None and site.kind == "conv1d":
        x = x.T
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]).numpy())


def _from_rows(rows: np.ndarray, like: Any, site: LinearSite | None) -> Any:
    import torch

    t = torch.from_numpy(rows)
    if site is not None and site.kind == "conv1d":
        return t.reshape(like.shape[1], like.shape[0]).T.contiguous()
    return t.reshape(like.shape)


def quantize_rows(rows: np.ndarray, qtype: str, qw: np.ndarray | None) -> np.ndarray:
    """``rows`` quantized to ``qtype`` (with the importance ``qw`` per column) and decoded again."""
    from studio.core.quant.blocks import dequantize, quantize

    q = quantize(rows, qtype, qw if qtype != "Q8_0" else None)
    return dequantize(q, qtype, rows.shape)


def weighted_error(rows: np.ndarray, deq: np.ndarray, qw: np.ndarray | None) -> float:
    """``Σ_j qw_j Σ_i (rows − deq)²_ij`` (unweighted without ``qw``)."""
    d = (rows.astype(np.float64) - deq) ** 2
    col = d.sum(0)
    if qw is None:
        return float(col.sum())
    return float((col * np.asarray(qw, dtype=np.float64)).sum())


# ------------------------------------------------------------------------------------------ streams


@dataclass(eq=False)
class _Stream:
    """A perturbed copy of the scan chunks: ``delta`` is h' − h entering the current layer (None: no
    difference yet)."""

    key: tuple[Any, ...]  # ("t", tensor, qtype) or ("p", plan index)
    delta: Any = None  # torch (C, T, H), float16 (float32 where float16 would overflow)
    head: Any = None  # the head's weight for this stream (tied embedding or output quantized), or None
    plan: Mapping[str, str] | None = None


def _pack(delta: Any) -> Any:
    import torch

    # float16 holds |x| ≤ 65504; one max over the float32 values decides (a NaN fails the comparison)
    # instead of a check of the float16 copy, which torch does not vectorise on the CPU
    top = float(delta.detach().abs().amax()) if delta.numel() else 0.0
    return delta.to(torch.float16) if top <= _F16_MAX else delta.float()


def _pack_many(deltas: Any) -> list[Any]:
    """``_pack`` of each ``deltas[i]`` with one max and one conversion for the whole batch."""
    import torch

    top = deltas.detach().abs().amax(tuple(range(1, deltas.dim()))).tolist()
    d16 = deltas.to(torch.float16)
    # float16 rows are views of one tensor, freed once every stream of the group has moved on
    return [d16[i] if m <= _F16_MAX else deltas[i].float().clone() for i, m in enumerate(top)]


class SensitivityScan(Consumer):
    """The scan's consumer (see the module docstring).

    ``exact``: tensor → effective qtypes whose KL is measured; ``errors``: tensor → qtypes whose
    imatrix-weighted error is wanted (a ``row_share`` of the rows, at least ``min_rows``; measured
    candidates use every row); ``plans``: assignments (tensor → qtype) measured as one stream each;
    ``imatrix``: HF tensor name → importance per column (what the export uses); ``chunk_ids``: the
    run's token ids (chunks × tokens), which the embedding's streams start from.
    """

    needs_layerwise = True
    wants_head = True

    def __init__(
        self,
        targets: Sequence[ScanTarget],
        chunk_ids: Any,
        *,
        exact: Mapping[str, Sequence[str]],
        errors: Mapping[str, Sequence[str]] | None = None,
        plans: Sequence[Mapping[str, str]] = (),
        imatrix: Mapping[str, np.ndarray] | None = None,
        row_share: float = PROXY_ROW_SHARE,
        min_rows: int = PROXY_MIN_ROWS,
        seed: int = 0,
        ctx: JobContext | None = None,
    ) -> None:
        self.targets = {t.name: t for t in targets}
        self.chunk_ids = chunk_ids
        self.exact = {k: tuple(v) for k, v in exact.items() if v}
        self.errors = {k: tuple(v) for k, v in (errors or {}).items() if v}
        self.plans = [dict(p) for p in plans]
        self.imatrix = dict(imatrix or {})
        self.row_share = row_share
        self.min_rows = min_rows
        self.rng = np.random.default_rng(seed)
        self.ctx = ctx or null_context()
        self.kl: dict[tuple[str, str], float] = {}
        self.err: dict[tuple[str, str], float] = {}
        self.plan_kl: list[float] = [float("nan")] * len(self.plans)
        self._spec: RunSpec | None = None
        self._streams: list[_Stream] = []
        self._ref: dict[int, Any] = {}
        self._last: Any = None
        self._units = 1
        self._done = 0
        self._t0 = time.monotonic()

    # -- progress: one unit per stream and layer it goes through, plus the head
    def _plan_work(self, n_layers: int) -> int:
        n = 0
        for name, qs in self.exact.items():
            t = self.targets[name]
            start = 0 if t.layer is None else t.layer
            n += len(qs) * (n_layers - start + 1) if t.kind != "output" else len(qs)
        return max(1, n + len(self.plans) * (n_layers + 1))

    def _step(self, n: int, msg: str) -> None:
        self._done += n
        el = time.monotonic() - self._t0
        left = el / self._done * max(0, self._units - self._done) if self._done else None
        self.ctx.report(min(self._done, self._units), self._units, f"{msg} · ETA {format_eta(left)}")

    # -- quantizing
    def _qw(self, name: str) -> np.ndarray | None:
        v = self.imatrix.get(name)
        return None if v is None else np.asarray(v, dtype=np.float32).reshape(-1)

    def _quantized(
        self, name: str, rows: np.ndarray, qtype: str, full: bool
    ) -> tuple[np.ndarray | None, float]:
        """(dequantized rows or None, weighted error): every row when ``full``, a sample otherwise."""
        qw = self._qw(name)
        n_rows, n_cols = rows.shape
        if qw is not None and qw.size != n_cols and qw.size % n_cols == 0:
            # experts: each block of rows takes its own expert's importance
            n_exp = qw.size // n_cols
            per = n_rows // n_exp
            deq = np.empty_like(rows)
            err = 0.0
            for e in range(n_exp):
                sl = slice(e * per, (e + 1) * per)
                v = qw[e * n_cols : (e + 1) * n_cols]
                deq[sl] = quantize_rows(rows[sl], qtype, v)
                err += weighted_error(rows[sl], deq[sl], v)
            return deq, err
        if full:
            deq = quantize_rows(rows, qtype, qw)
            return deq, weighted_error(rows, deq, qw)
        k = min(n_rows, max(self.min_rows, int(math.ceil(n_rows * self.row_share))))
        idx = np.sort(self.rng.choice(n_rows, size=k, replace=False)) if k < n_rows else np.arange(n_rows)
        sub = np.ascontiguousarray(rows[idx])
        return None, weighted_error(sub, quantize_rows(sub, qtype, qw), qw) * (n_rows / k)

    def _wanted(self, name: str) -> list[str]:
        """Effective qtypes of ``name`` that need the whole tensor quantized (measured or in a plan)."""
        want = set(self.exact.get(name, ())) | {p[name] for p in self.plans if name in p}
        return sorted(q for q in want if not QTYPES[q].is_float)

    def _errors_only(self, name: str, rows: np.ndarray) -> None:
        for q in self.errors.get(name, ()):
            if (name, q) not in self.err:
                self.ctx.check_cancelled()
                _, self.err[(name, q)] = self._quantized(name, rows, q, False)

    # -- consumer
    def start(self, spec: RunSpec) -> None:
        """Check the run; start the plans' streams and those of the token embedding."""
        import torch

        if spec.outer is None or not spec.head:
            raise CalibrationError(
                "The sensitivity scan needs the layer-by-layer runner with the output head."
            )
        self._spec = spec
        self._units = self._plan_work(spec.n_layers)
        self._t0 = time.monotonic()
        plan_streams = [_Stream(("p", i), plan=p) for i, p in enumerate(self.plans)]
        self._streams.extend(plan_streams)
        outer = spec.outer
        emb = next((t for t in self.targets.values() if t.kind == "embedding"), None)
        if emb is None or outer.embedding is None:
            return
        p = outer.param(outer.embedding)
        rows = _rows_of(p, None)
        wanted = self._wanted(emb.name)
        ids = torch.as_tensor(np.asarray(self.chunk_ids), device=p.device)
        h0 = outer.embed(ids) if wanted else None
        for q in wanted:
            self.ctx.check_cancelled()
            deq, self.err[(emb.name, q)] = self._quantized(emb.name, rows, q, True)
            new = torch.from_numpy(deq).reshape(p.shape).to(device=p.device, dtype=p.dtype)
            delta = _pack(outer.embed(ids, {outer.embedding: new}) - h0)
            head = new if outer.tied else None
            if q in self.exact.get(emb.name, ()):
                self._streams.append(_Stream(("t", emb.name, q), delta, head))
            for s in plan_streams:
                if s.plan.get(emb.name) == q:
                    s.delta, s.head = delta, head
            self._step(1, f"token embedding at {q}")
        self._errors_only(emb.name, rows)

    def layer_collected(self, view: LayerView) -> None:
        """Move the streams through this layer, then start the streams of its tensors."""
        ctx = self.ctx
        h_in = torch_cat(view.inputs)  # (C, T, H)
        h_out = view.forward(h_in)
        sites = {s.name: s for s in view.sites}
        names = [n for n in sites if n in self.targets]
        deq: dict[tuple[str, str], Any] = {}
        for name in names:
            site = sites[name]
            w = view.weight(site)
            rows = _rows_of(w, site)
            for q in self._wanted(name):
                ctx.check_cancelled()
                d, self.err[(name, q)] = self._quantized(name, rows, q, True)
                deq[(name, q)] = _from_rows(d, w, site).to(device=w.device, dtype=w.dtype)
            self._errors_only(name, rows)
        # 1. streams from earlier layers through the original layer, batched
        carried = [s for s in self._streams if s.delta is not None and s.plan is None]
        self._advance(view, carried, h_in, h_out)
        # plans: every tensor of this layer at its plan's qtype
        for s in self._streams:
            if s.plan is None:
                continue
            mine = [(sites[n], deq[(n, s.plan[n])]) for n in names if (n, s.plan.get(n, "F32")) in deq]
            if s.delta is None and not mine:
                continue
            ctx.check_cancelled()
            x = h_in if s.delta is None else h_in + s.delta.to(h_in.dtype)
            with contextlib.ExitStack() as stack:
                for site, value in mine:
                    stack.enter_context(view.swapped(site, value))
                s.delta = _pack(view.forward(x) - h_out)
        # 2. new streams: every candidate of one tensor in one batched call
        for name in names:
            qs = [q for q in self.exact.get(name, ()) if (name, q) in deq]
            if not qs:
                continue
            ctx.check_cancelled()
            ys = _each_weight(view, sites[name], [deq[(name, q)] for q in qs], h_in)
            for q, d in zip(qs, _pack_many(torch_stack(ys) - h_out), strict=True):
                self._streams.append(_Stream(("t", name, q), d))
        n_new = sum(len([q for q in self.exact.get(n, ()) if (n, q) in deq]) for n in names)
        n_plan = sum(1 for s in self._streams if s.plan is not None)
        n = self._spec.n_layers if self._spec else 0
        self._step(len(carried) + n_new + n_plan, f"layer {view.index + 1}/{n}")
        self._last = h_out

    def _advance(self, view: LayerView, streams: list[_Stream], h_in: Any, h_out: Any) -> None:
        import torch

        if not streams:
            return
        c, t = int(h_in.shape[0]), int(h_in.shape[1])
        per = max(1, _BATCH_TOKENS // (c * t))
        for a in range(0, len(streams), per):
            self.ctx.check_cancelled()
            group = streams[a : a + per]
            # whole-group tensor operations: per-stream small ones cost more in dispatch than in work
            x = torch.stack([s.delta.to(h_in.dtype) for s in group]) + h_in
            y = view.forward(x.reshape(len(group) * c, t, -1)).reshape(len(group), c, t, -1)
            for s, d in zip(group, _pack_many(y - h_out), strict=True):
                s.delta = d

    @staticmethod
    def _fast_kl(p: Any, mvec: Any, wb: Any, head_w: Any, hh: Any, h2: Any, head: Any) -> float:
        """KL of one stream through a linear head: δ = W(ĥ' − ĥ) (+ (Ŵ − W)ĥ' for a quantized head)."""
        import torch

        n = p.shape[0]
        dh = (h2 - hh).reshape(n, -1)
        # products of small differences keep their precision in bfloat16
        delta = (dh.to(torch.bfloat16) @ wb.T).float()
        shift = (dh.float() * mvec).sum(-1)
        if head is not None:
            dw = (head - head_w).to(torch.bfloat16)
            delta += (h2.reshape(n, -1).to(torch.bfloat16) @ dw.T).float()
            shift = None  # the head's own change moves the mean too: measured from δ
        return kl_from_delta(p, delta, shift, owned=True)

    def logits(self, chunk: int, logits: Any) -> None:
        """Keep the original's logits of every chunk."""
        self._ref[chunk] = logits

    def finish(self) -> None:
        """The head: the KL of every stream against the original."""
        import torch

        spec = self._spec
        assert spec is not None and spec.outer is not None
        outer = spec.outer
        ref = torch.stack([self._ref[c] for c in sorted(self._ref)])  # (C, T, V)
        hidden = self._last
        hh = outer.head_input(hidden)
        head_name = outer.head or (outer.embedding if outer.tied else None)
        head_w = outer.param(head_name) if head_name else None
        fast = head_w is not None and _head_is_linear(hh, head_w, ref)
        wb = head_w.detach().to(torch.bfloat16) if fast else None
        out = next((t for t in self.targets.values() if t.kind == "output"), None)
        if out is not None and head_w is not None:
            rows = _rows_of(head_w, None)
            for q in self._wanted(out.name):
                self.ctx.check_cancelled()
                d, self.err[(out.name, q)] = self._quantized(out.name, rows, q, True)
                new = torch.from_numpy(d).reshape(head_w.shape).to(head_w.dtype)
                if q in self.exact.get(out.name, ()):
                    self._streams.append(_Stream(("t", out.name, q), None, new))
                for s in self._streams:
                    if s.plan is not None and s.plan.get(out.name) == q:
                        s.head = new
            self._errors_only(out.name, rows)
        # the original's distribution once, in float32; m = pᵀW gives each stream's mean logit change
        # Σ_v p_v δ_v = m·(ĥ' − ĥ) without a pass over the vocabulary
        p = torch.softmax(ref.float(), -1).reshape(-1, ref.shape[-1])
        mvec = (p @ head_w.detach().float()) if fast else None
        streams = list(self._streams)
        for a in range(0, len(streams), _HEAD_GROUP):
            self.ctx.check_cancelled()
            group = streams[a : a + _HEAD_GROUP]
            moved = [s for s in group if s.delta is not None]
            h2s = {}
            if moved:  # the final norm of every moved stream of the group in one call
                x = torch.cat([hidden + s.delta.to(hidden.dtype) for s in moved], 0)
                for s, h2 in zip(moved, outer.head_input(x).split(int(hidden.shape[0])), strict=True):
                    h2s[id(s)] = h2
            for s in group:
                self.ctx.check_cancelled()
                kl = 0.0
                if s.delta is not None or s.head is not None:
                    h2 = h2s.get(id(s), hh)
                    if fast:
                        kl = self._fast_kl(p, mvec, wb, head_w, hh, h2, s.head)
                    else:
                        kl = kl_from_delta(p, (outer.logits(h2, weight=s.head) - ref).reshape(p.shape))
                if s.key[0] == "t":
                    self.kl[(s.key[1], s.key[2])] = kl
                else:
                    self.plan_kl[s.key[1]] = kl
                self._step(1, "output head")
        self._streams.clear()
        self._ref.clear()


def torch_cat(parts: Sequence[Any]) -> Any:
    """``torch.cat`` along the batch axis (a lazy import for module-level helpers)."""
    import torch

    return torch.cat(list(parts), 0)


def torch_stack(parts: Sequence[Any]) -> Any:
    """``torch.stack`` (a lazy import for module-level helpers)."""
    import torch

    return torch.stack(list(parts))


def kl_from_delta(p: Any, delta: Any, shift: Any = None, *, owned: bool = False) -> float:
    """Mean over positions of KL(p ‖ softmax(log p + δ)) (``p`` and ``δ``: positions × vocabulary).

    ``KL = log Σ p e^δ − Σ p δ`` is unchanged when a constant is taken from δ per position; with the
    mean ``Σ p δ`` taken off (``shift`` when the caller knows it) the two terms no longer cancel, so
    float32 keeps ~1e-5 relative precision where the uncentred sum needed float64 (and four times the
    memory traffic). ``owned``: ``delta`` is a scratch float32 tensor that may be overwritten.
    """
    import torch

    v = p.shape[-1]
    pf = p.reshape(-1, 1, v).float()
    d = delta.reshape(-1, v)
    d = d if owned and d.dtype == torch.float32 else d.to(torch.float32, copy=True)

    def dot(x: Any) -> Any:  # Σ_v p_v x_v per position, one pass
        return torch.bmm(pf, x.unsqueeze(2)).reshape(-1)

    d -= (dot(d) if shift is None else shift.reshape(-1).float()).unsqueeze(1)
    r = dot(d)
    s = dot(d.expm1_())
    kl = torch.log1p(s.double()) - r.double()
    if not bool(torch.isfinite(kl).all()):  # a change beyond float32's exp range: the float64 form
        return _kl_float64(p, delta)
    return float(kl.clamp_min(0).mean())


def _kl_float64(p: Any, delta: Any) -> float:
    import torch

    d = delta.double().reshape(-1, p.shape[-1])
    m = d.amax(-1, keepdim=True)
    pd = p.double().reshape(d.shape)
    lse = torch.log((pd * torch.exp(d - m)).sum(-1)) + m.squeeze(-1)
    return float((lse - (pd * d).sum(-1)).clamp_min(0).mean())


def _head_is_linear(hh: Any, w: Any, ref: Any) -> bool:
    """Whether the logits are ``ĥ Wᵀ`` (no soft-capping, no scaling), so that δ = W(ĥ' − ĥ) holds."""
    import torch

    z = hh.float() @ w.float().T
    scale = float(ref.abs().amax()) or 1.0
    return bool(torch.allclose(z, ref.float(), atol=1e-4 * scale, rtol=1e-4))


def _each_weight(view: LayerView, site: LinearSite, weights: Sequence[Any], h_in: Any) -> list[Any]:
    """The layer's outputs for ``h_in`` once per candidate weight of ``site``.

    Linear sites run all candidates in one call: the inputs are repeated and a forward hook gives
    each copy the product with its own weight. Fused experts take one call per candidate.
    """
    import torch

    k = len(weights)
    if site.kind == "experts" or k == 1:
        outs = []
        for w in weights:
            with view.swapped(site, w):
                outs.append(view.forward(h_in))
        return outs
    mod = view.submodule(site)
    stack = torch.stack(list(weights))  # (k, out, in); GPT-2 Conv1D (k, in, out)
    c = int(h_in.shape[0])

    def hook(m: Any, args: tuple[Any, ...], out: Any) -> Any:
        x = args[0].reshape(k, -1, args[0].shape[-1])
        y = torch.bmm(x, stack if site.kind == "conv1d" else stack.transpose(1, 2))
        if getattr(m, "bias", None) is not None:
            y = y + m.bias
        return y.reshape(out.shape)

    handle = mod.register_forward_hook(hook)
    try:
        y = view.forward(h_in.repeat(k, 1, 1))
    finally:
        handle.remove()
    return list(y.reshape(k, c, *y.shape[1:]))


# ------------------------------------------------------------------------------------------ the scan


class _Muted(JobContext):
    """The runner's own progress is dropped (the scan reports its streams); cancel goes through."""

    def __init__(self, parent: JobContext) -> None:
        super().__init__()
        self._parent = parent

    def report(self, done: int, total: int, msg: str = "") -> None:  # noqa: D401
        return None

    def check_cancelled(self) -> None:
        self._parent.check_cancelled()

    @property
    def cancelled(self) -> bool:
        return self._parent.cancelled


def spread_chunks(chunks: Any, n_chunks: int, n_ctx: int) -> Any:
    """``n_chunks`` chunks of ``n_ctx`` tokens taken evenly across ``chunks`` (each chunk's first
    ``n_ctx`` tokens, BOS first as before), so a few short chunks still mix the calibration text."""
    if n_ctx > chunks.n_ctx:
        raise CalibrationError(
            f"Scan chunks of {n_ctx} tokens do not fit calibration chunks of {chunks.n_ctx}; use --scan-ctx "
            f"{chunks.n_ctx} or less."
        )
    if n_chunks < 1:
        raise CalibrationError(f"At least one scan chunk is needed, not {n_chunks}.")
    n = min(n_chunks, chunks.n_chunks)
    idx = np.unique(np.round(np.linspace(0, chunks.n_chunks - 1, n)).astype(int))
    return Chunks(
        np.ascontiguousarray(chunks.tokens[idx, :n_ctx]),
        n_ctx,
        chunks.n_text_tokens,
        chunks.bos,
        chunks.dataset,
    )


def gain_layers(n_layers: int) -> tuple[int, ...]:
    """The layers whose tensors the proxy measures: the first and third, every fifth, the third-last
    and the last (under 12 layers: the first three, the last two and every fourth).

    A stream costs the layers after its own, so early picks are dear: on SmolLM2-135M (30 layers) this
    set costs 26 % fewer stream-layers than the first three, last two and every fourth, and predicts the
    exact scan's other 966 pairs as well (median |ln ratio| 0.175 against 0.173, rank correlation 0.977
    against 0.978).
    """
    if n_layers <= 0:
        return ()
    if n_layers < 12:  # shallow: streams are cheap; the first three, the last two and every fourth
        picks = {0, 1, 2, n_layers - 2, n_layers - 1, *range(0, n_layers, 4)}
    else:
        picks = {0, 2, n_layers - 3, n_layers - 1, *range(5, n_layers, 5)}
    return tuple(sorted(i for i in picks if 0 <= i < n_layers))


_SLOW_SEARCH = frozenset({"IQ4_NL", "IQ4_XS"})  # 15 scale trials per block: ~7× the others' time


def gain_type(t: ScanTarget) -> str:
    """The qtype at which the proxy measures a tensor's gain: its smallest, unless that is an IQ4 type
    and a legacy 4- or 5-bit one is a candidate too. The gain KL / error hardly depends on the type (on
    SmolLM2-135M the other 966 pairs are predicted alike: median |ln ratio| 0.178 from Q4_0 gains, 0.175
    from IQ4_NL ones), and the whole-tensor quantization of the sample is the proxy's dearest step."""
    eff = t.effective
    if eff[0] not in _SLOW_SEARCH:
        return eff[0]
    return next((q for q in ("Q4_0", "Q5_0") if q in eff), eff[0])


def _interp_log(xs: Sequence[int], ys: Sequence[float], x: int) -> float:
    """Log-linear interpolation of positive ``ys`` at ``x`` (the nearest end outside the range)."""
    pts = sorted((a, b) for a, b in zip(xs, ys, strict=True) if b > 0 and math.isfinite(b))
    if not pts:
        return float("nan")
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= x <= x1:
            f = (x - x0) / (x1 - x0) if x1 > x0 else 0.0
            return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
    return pts[-1][1]


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _imatrix_digest(imatrix: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(imatrix):
        h.update(k.encode())
        h.update(np.ascontiguousarray(imatrix[k], dtype=np.float32).tobytes())
    return h.hexdigest()[:24]


def hf_imatrix(imatrix: Mapping[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
    """An imatrix keyed by GGUF names (``Imatrix``) re-keyed by the HF tensor names a scan uses."""
    out = {}
    for tm in layout(info).tensors:
        if tm.gguf_name in imatrix:
            out[tm.hf_name] = np.asarray(imatrix[tm.gguf_name], dtype=np.float32)
    return out


@dataclass(frozen=True)
class ScanSettings:
    """How a scan runs: candidates, mode, the chunks it measures on and the imatrix's calibration."""

    types: tuple[str, ...] = DEFAULT_TYPES
    exact: bool = False
    n_ctx: int = SCAN_CTX
    n_chunks: int = SCAN_CHUNKS
    calib_ctx: int = 512
    calib_chunks: int | None = None
    device: str = "cpu"
    check_pairs: int = 2  # proxy: held-out pairs per role measured exactly as a check


def scan_sensitivity(
    model: str | os.PathLike[str],
    text: Any = "builtin",
    settings: ScanSettings | None = None,
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    plans: Sequence[Mapping[str, str]] = (),
    cache_dir: str | os.PathLike[str] | None = None,
    stats_cache: Any = None,
    ctx: JobContext | None = None,
    executor: Any = None,
) -> Sensitivity:
    """Scan ``model`` (a Hugging Face folder) on ``text`` (``"builtin"``, a file or a ``CalibrationText``).

    ``imatrix`` (GGUF names, as ``Imatrix``) is computed from ``text`` when not given; ``plans`` are
    measured in the same run (``Sensitivity.plan_kls``); a scan found in ``cache_dir`` (JSON files
    keyed by the model's files, the text, the settings and the imatrix) is returned without running.
    ``executor`` (``studio.core.executor``): a distributed one runs the pairs as units on a cluster
    (``studio.core.cluster.scan``), with the same results; finished units are kept in ``cache_dir``.
    """
    st = settings or ScanSettings()
    ctx = ctx or null_context()
    for q in st.types:
        if q not in QTYPES or QTYPES[q].is_float:
            raise CalibrationError(f"{q} is not a quantized GGUF type a scan can measure.")
    t0, c0 = time.monotonic(), time.process_time()
    ckpt = _open(model, False)
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
            )
            imatrix = imatrix_from_stats(stats, info)
        qw = hf_imatrix(imatrix, info)
        chunks = spread_chunks(inp.chunks, st.n_chunks, st.n_ctx)
        ck = checkpoint_key(info, "")
        key = _digest(
            {
                "v": SCAN_VERSION,
                "model": str(info.path),
                "files": [ck.mtime_ns, ck.size],
                "text": inp.data.digest,
                "settings": dataclasses.asdict(st),
                "imatrix": _imatrix_digest(qw),
                "plans": [sorted(p.items()) for p in plans],
            }
        )
        cached = _load_cached(cache_dir, key)
        if cached is not None:
            return cached
        n_layers = max([t.layer + 1 for t in targets if t.layer is not None], default=0)
        exact, errors, check = _measure_sets(targets, st, n_layers)
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
                ckpt, chunks, [scan], device=st.device, dtype="float32", mode="layerwise", ctx=_Muted(ctx)
            )
    finally:
        ckpt.close()
    result = _assemble(info, inp.data.name, st, targets, fixed, scan, check, chunks.n_tokens)
    result = dataclasses.replace(
        result, seconds=time.monotonic() - t0, cpu_seconds=time.process_time() - c0, key=key
    )
    _save_cached(cache_dir, key, result)
    if cache_dir is not None:  # the units a distributed scan kept for a resume are in the result now
        shutil.rmtree(Path(cache_dir) / f"sensitivity-{key}.units", ignore_errors=True)
    return result


def _measure_sets(
    targets: Sequence[ScanTarget], st: ScanSettings, n_layers: int
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], list[tuple[str, str]]]:
    """(tensor → qtypes measured exactly, tensor → qtypes whose error is estimated, check pairs)."""
    if st.exact:
        return {t.name: t.effective for t in targets}, {}, []
    sampled = set(gain_layers(n_layers))
    exact: dict[str, list[str]] = {}
    errors = {t.name: t.effective for t in targets}
    for t in targets:
        if t.layer is None or t.layer in sampled:
            exact[t.name] = [gain_type(t)]
    rng = np.random.default_rng(1)
    check: list[tuple[str, str]] = []
    by_role: dict[str, list[ScanTarget]] = {}
    for t in targets:
        if t.layer is not None and t.layer not in sampled and len(t.effective) > 1:
            by_role.setdefault(t.role, []).append(t)
    for role in sorted(by_role):
        pool = by_role[role]
        for i in rng.choice(len(pool), size=min(st.check_pairs, len(pool)), replace=False):
            t = pool[int(i)]
            q = t.effective[int(rng.integers(0, len(t.effective)))]
            exact.setdefault(t.name, []).append(q)
            check.append((t.name, q))
    return {k: tuple(dict.fromkeys(v)) for k, v in exact.items()}, errors, check


def _assemble(
    info: Any,
    dataset: str,
    st: ScanSettings,
    targets: Sequence[ScanTarget],
    fixed: Mapping[str, str],
    scan: SensitivityScan,
    check: Sequence[tuple[str, str]],
    n_tokens: int,
) -> Sensitivity:
    kl, err = scan.kl, scan.err
    check_set = set(check)
    gains: dict[str, float] = {}
    for t in targets:
        ref = gain_type(t)
        if (t.name, ref) in kl and (t.name, ref) not in check_set:
            e = err.get((t.name, ref), 0.0)
            gains[t.name] = kl[(t.name, ref)] / e if e > 0 else float("nan")
    by_role: dict[str, tuple[list[int], list[float]]] = {}
    for t in targets:
        if t.layer is not None and t.name in gains:
            xs, ys = by_role.setdefault(t.role, ([], []))
            xs.append(t.layer)
            ys.append(gains[t.name])

    def gain_of(t: ScanTarget) -> float:
        if t.name in gains:
            return gains[t.name]
        xs, ys = by_role.get(t.role, ([], []))
        g = _interp_log(xs, ys, t.layer if t.layer is not None else 0)
        if not math.isfinite(g):  # a role never sampled: the median gain of the model
            allg = [v for v in gains.values() if v > 0 and math.isfinite(v)]
            g = float(np.median(allg)) if allg else 0.0
        return g

    tensors = []
    check_rows = []
    for t in targets:
        g = None if st.exact else gain_of(t)
        by_type: dict[str, TypeCost] = {}
        for q, e in t.candidates.items():
            nbytes = tensor_bytes(e, t.shape)
            error = err.get((t.name, e))
            if (t.name, e) in kl:
                value, measured = kl[(t.name, e)], True
                if (t.name, e) in check_set and g is not None and error is not None:
                    check_rows.append((t.name, e, value, g * error))
            elif g is not None and error is not None:
                value, measured = g * error, False
            else:
                raise CalibrationError(f"The scan has no value for {t.name} at {e}.")
            by_type[q] = TypeCost(q, float(value), nbytes, e, measured, error)
        tensors.append(TensorSensitivity(t.name, t.gguf_name, t.role, t.layer, math.prod(t.shape), by_type))
    return Sensitivity(
        str(info.path),
        dataset,
        Mode.EXACT if st.exact else Mode.PROXY,
        "imatrix",
        tuple(st.types),
        n_tokens,
        tuple(tensors),
        dict(fixed),
        tuple(scan.plan_kl),
        None if st.exact else ProxyCheck(tuple(dict.fromkeys(check_rows))),
    )


def _load_cached(cache_dir: str | os.PathLike[str] | None, key: str) -> Sensitivity | None:
    if cache_dir is None:
        return None
    p = Path(cache_dir) / f"sensitivity-{key}.json"
    try:
        return Sensitivity.from_dict(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, ValueError, CalibrationError):
        return None


def _save_cached(cache_dir: str | os.PathLike[str] | None, key: str, result: Sensitivity) -> None:
    if cache_dir is None:
        return
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(cache_dir) / f"sensitivity-{key}.json", json.dumps(result.to_dict()))
    except OSError:
        pass  # a cache that cannot be written only costs the next scan its time


def measure_plans(
    model: str | os.PathLike[str],
    plans: Sequence[Mapping[str, str]],
    text: Any = "builtin",
    settings: ScanSettings | None = None,
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    ctx: JobContext | None = None,
) -> tuple[float, ...]:
    """The KL of each plan (HF name → qtype) on the scan chunks, every tensor quantized at once."""
    st = dataclasses.replace(settings or ScanSettings(), exact=True)
    return _run_plans(model, plans, text, st, imatrix, ctx)


def _run_plans(
    model: Any, plans: Sequence[Mapping[str, str]], text: Any, st: ScanSettings, imatrix: Any, ctx: Any
) -> tuple[float, ...]:
    ctx = ctx or null_context()
    ckpt = _open(model, False)
    try:
        info = ckpt.info
        targets, _ = scan_targets(info, st.types)
        inp = prepare_input(info.path, text, n_ctx=st.calib_ctx, n_chunks=st.calib_chunks, ctx=ctx)
        chunks = spread_chunks(inp.chunks, st.n_chunks, st.n_ctx)
        qw = hf_imatrix(imatrix or {}, info)
        scan = SensitivityScan(targets, chunks.tokens, exact={}, plans=plans, imatrix=qw, ctx=ctx)
        run_model(ckpt, chunks, [scan], device=st.device, dtype="float32", mode="layerwise", ctx=_Muted(ctx))
    finally:
        ckpt.close()
    return tuple(scan.plan_kl)


__all__ = [
    "DEFAULT_TYPES",
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
    "scan_sensitivity",
    "scan_targets",
    "sizes_only",
    "spread_chunks",
]
