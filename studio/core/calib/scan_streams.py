"""The exact scan's consumer: perturbed streams carried beside the original through the layer runner.

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
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.calib.runner import Consumer, LayerView, LinearSite, RunSpec
from studio.core.calib.scan_kl import head_is_linear, kl_rows, torch_cat, torch_stack
from studio.core.calib.scan_rows import (
    ErrorSum,
    NarrowRows,
    from_rows,
    quantize_rows,
    quantized_blocks,
    rows_of,
    weighted_error,
)
from studio.core.errors import CalibrationError
from studio.core.jobs import SPAN_STEPS, JobContext, null_context
from studio.core.plan.scan import ScanTarget
from studio.core.progress import WorkMeter
from studio.core.quant.types import QTYPES

PROXY_ROW_SHARE = 1 / 16  # rows of a tensor quantized to estimate its error in proxy mode
PROXY_MIN_ROWS = 64
_BATCH_TOKENS = 8192  # tokens per batched layer call (bounds the activations' memory)
_DELTA_DTYPE = "float16"  # streams store h' − h: small differences keep their precision in float16
_F16_MAX = 65000.0
_HEAD_GROUP = 16  # streams whose final norm runs in one call at the head
# at most this many hidden values of a group's streams at once (their states and final norms: float32, two
# copies): 16 streams of the held-out judgement's 2,304 positions at 8B's 4096 wide were 1.2 GB, when a
# budget plan's judgement at the 8B fixture's full vocabulary peaked at 7.1 GB
_HEAD_GROUP_VALUES = 1 << 25
_HEAD_BLOCK = 1 << 25  # logits (positions × vocabulary) per block of the head's KL: 128 MB of float32


@dataclass(eq=False)
class _Stream:
    """A perturbed copy of the scan chunks: ``delta`` is h' − h entering the current layer (None: no
    difference yet)."""

    key: tuple[Any, ...]  # ("t", tensor, qtype) or ("p", plan index)
    delta: Any = None  # torch (C, T, H), float16 (float32 where float16 would overflow)
    head: Any = None  # the head's weight for this stream (tied embedding or output quantized), or None
    plan: Mapping[str, str] | None = None
    # the quantized head this stream is measured with, (tensor, qtype): the output head, or a tied embedding;
    # its weight is made only while the streams that share it are measured
    head_q: tuple[str, str] | None = None
    head_dw: Any = None  # a linear head's (Ŵ − W) in bfloat16, made once per type (then ``head`` is not kept)


@dataclass(frozen=True)
class _HeadEnv:
    """What every stream's KL at the head shares (``SensitivityScan._head_env``)."""

    p: Any  # the original's distribution, positions × vocabulary, float32
    mvec: Any  # pᵀW per position (a linear head), else None
    wb: Any  # the head's weight in bfloat16 (a linear head), else None
    head_w: Any  # the head's weight (as the checkpoint stores it where that is narrower), or None
    rows: Any  # the head's weight as GGUF rows of float32 (``rows_of``, or ``NarrowRows`` over ``head_w``)
    dtype: Any  # the run's dtype of the head, which a quantized candidate is rounded to
    hh: Any  # the original's head input, chunks × tokens × hidden
    ref: Any  # the original's logits per chunk where the head is not linear, else None
    fast: bool  # the head is linear: δ = W(ĥ' − ĥ)
    outer: Any
    n_chunks: int
    n_tok: int
    blocks: tuple[tuple[int, int], ...]  # chunk ranges measured at once


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


# MAC-equivalents per value of quantizing a row and decoding it again (numpy, one thread, measured on the
# 2-core machine against a float32 matmul): the i-quants' grid searches cost 5–20× the K-quants'
_QUANT_COST = {
    "MXFP4": 400, "Q8_0": 500, "Q3_K": 700, "Q6_K": 700, "Q5_K": 800, "Q4_K": 900, "Q4_0": 1200,
    "Q5_0": 1300, "Q2_K": 1300, "IQ1_S": 3300, "Q4_1": 3400, "Q5_1": 3500, "IQ1_M": 4000, "IQ2_S": 4900,
    "IQ4_NL": 6000, "IQ4_XS": 6200, "IQ3_S": 7900, "IQ2_XXS": 9500, "IQ3_XXS": 10400, "IQ2_XS": 16500,
}  # fmt: skip
_QUANT_DEFAULT = 4000
_KL_COST = 20  # per logit of a stream at the head: its softmax, logarithm and sums
# a stream's logits change is one large GEMM, run nearer the machine's peak than a layer's forward with its
# attention and activations: 3.9 s per % of the bar at the head against 5.3 s through a layer (the 8B
# fixture, 2 threads); with it the ETA predicts the head at the passes' measured rate
_HEAD_EFFICIENCY = 0.75
# the scan's kinds of work (``_plan_work``): the rounding (numba, one thread) and the matrix products (the
# streams' passes through the layers and their logits at the head, torch on every thread); the head's
# products as a kind of their own went at the job's rate until the head was reached, and the ETA after the
# 8B fixture's first layer was 28 % long, 17 % with them counted as the passes' kind
ROUND, MATMULS = "round", "matmuls"


@dataclass(frozen=True)
class _Costs:
    """The scan's work in float32 multiply-adds: the candidates' rounding, the streams' passes through a
    layer and their KL at the head (the progress bar and the ETA weigh each step by it)."""

    tokens: int  # positions of the run
    layer_macs: Mapping[int, int]  # layer → multiply-adds per token of its linear layers
    head_shape: tuple[int, int]  # vocabulary × hidden ((0, 0) without a head target)
    row_share: float
    min_rows: int
    # the rounding kernels run on one thread while torch's matmuls use all of them: on the 2-core machine
    # the rounding took 8.5 s per % of the bar against 5.3 s for the forwards (the bar's share; the ETA
    # measures each kind's rate itself: with one rate for all, it was 31 % long after the 8B fixture's
    # first layer)
    threads: int = 1

    def quantize(self, t: ScanTarget, qtype: str, full: bool) -> float:
        """Rounding ``t`` to ``qtype``: every row, or the error's sample (``SensitivityScan._quantized``)."""
        n = math.prod(t.shape)
        cols = int(t.shape[-1]) if t.shape else 1
        rows = n // max(1, cols)
        if not full:
            rows = min(rows, max(self.min_rows, math.ceil(rows * self.row_share)))
        if qtype in QTYPES and QTYPES[qtype].is_float:
            return float(rows * cols)
        return float(rows * cols * _QUANT_COST.get(qtype, _QUANT_DEFAULT) * self.threads)

    def tensor(self, t: ScanTarget, wanted: Sequence[str], errors: Sequence[str]) -> float:
        """Every rounding of ``t``: its wanted candidates whole, its other error types on a sample."""
        return sum(self.quantize(t, q, True) for q in wanted) + sum(
            self.quantize(t, q, False) for q in errors if q not in wanted
        )

    def forward(self, layer: int) -> float:
        """One stream through ``layer``."""
        return float(self.tokens * self.layer_macs.get(layer, 0))

    @property
    def head(self) -> float:
        """One stream's KL at the head: its logits' change and the KL over the vocabulary."""
        vocab, hidden = self.head_shape
        return float(self.tokens * vocab * (hidden + _KL_COST) * _HEAD_EFFICIENCY)


class SensitivityScan(Consumer):
    """The scan's consumer (see the module docstring).

    ``exact``: tensor → effective qtypes whose KL is measured; ``errors``: tensor → qtypes whose
    imatrix-weighted error is wanted (a ``row_share`` of the rows, at least ``min_rows``; measured
    candidates use every row); ``plans``: assignments (tensor → qtype) measured as one stream each;
    ``imatrix``: HF tensor name → importance per column (what the export uses); ``chunk_ids``: the
    run's token ids (chunks × tokens), which the embedding's streams start from; ``groups``: chunks per
    text when the chunks are several texts one after another (``plan_group_kl``: each plan's KL per text).
    """

    needs_layerwise = True
    wants_head = True
    uses_outer = True

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
        groups: Sequence[int] = (),
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
        # (tensor, qtype) → why its number is not finite (found where it is made; the scan's record keeps
        # the candidate as unusable and never lets the NaN reach the tensor's other candidates)
        self.unusable: dict[tuple[str, str], str] = {}
        self.plan_kl: list[float] = [float("nan")] * len(self.plans)
        # chunks per text when the run's chunks are several texts one after another (plans measured on each)
        self.groups = tuple(int(g) for g in groups)
        self.plan_group_kl: list[tuple[float, ...]] = [()] * len(self.plans)
        self._spec: RunSpec | None = None
        self._streams: list[_Stream] = []
        self._ref: dict[int, Any] = {}
        self._last: Any = None
        layer_macs: dict[int, int] = {}
        for t in self.targets.values():
            if t.kind == "linear" and t.layer is not None:
                layer_macs[t.layer] = layer_macs.get(t.layer, 0) + math.prod(t.shape)
        head = next((t for t in self.targets.values() if t.kind == "output"), None)
        self._costs = _Costs(
            int(np.asarray(chunk_ids).size),
            layer_macs,
            (int(head.shape[0]), int(math.prod(head.shape[1:]))) if head else (0, 0),
            row_share,
            min_rows,
        )
        self._meter = WorkMeter(1.0)

    # -- progress: every piece of work weighed by its cost in float32 multiply-adds (``_Costs``)
    def _plan_work(self, n_layers: int, tied: bool) -> dict[str, float]:
        """The scan's work by kind: the candidates' rounding; the streams' passes through the layers and
        their KL at the head (the ETA runs each at its own measured rate)."""
        c = self._costs
        work = {ROUND: 0.0, MATMULS: 0.0}
        emb = next((t for t in self.targets.values() if t.kind == "embedding"), None)
        # a tied head's candidates are the embedding's, rounded again at the head
        if tied and emb is not None:
            work[ROUND] += sum(c.quantize(emb, q, True) for q in self._wanted(emb.name))
        for t in self.targets.values():
            work[ROUND] += c.tensor(t, self._wanted(t.name), self.errors.get(t.name, ()))
            qs = self.exact.get(t.name, ())
            if t.kind == "linear" and t.layer is not None:
                # a candidate's stream: made at its layer, carried through the rest, measured at the head
                work[MATMULS] += len(qs) * sum(c.forward(i) for i in range(t.layer, n_layers))
            elif t.kind == "embedding":
                work[MATMULS] += len(qs) * sum(c.forward(i) for i in range(n_layers))
            work[MATMULS] += len(qs) * c.head
        work[MATMULS] += len(self.plans) * sum(c.forward(i) for i in range(n_layers))
        work[MATMULS] += len(self.plans) * c.head
        if sum(work.values()) <= 0:
            work[ROUND] = 1.0
        return work

    def _step(self, cost: float, msg: str, kind: str) -> None:
        self._meter.add(cost, kind)
        m = self._meter
        # in SPAN_STEPS units: the costs are multiply-adds (10^13 at 8B widths), past what a progress bar holds
        self.ctx.report(int(SPAN_STEPS * m.fraction), SPAN_STEPS, m.line(msg))

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
            err = weighted_error(rows, deq, qw)
            self._flag(name, qtype, err)
            return deq, err
        k = min(n_rows, max(self.min_rows, int(math.ceil(n_rows * self.row_share))))
        idx = np.sort(self.rng.choice(n_rows, size=k, replace=False)) if k < n_rows else np.arange(n_rows)
        sub = np.ascontiguousarray(rows[idx])
        err = weighted_error(sub, quantize_rows(sub, qtype, qw), qw) * (n_rows / k)
        self._flag(name, qtype, err)
        return None, err

    def _head_difference(
        self, name: str, rows: Any, qtype: str, head_w: Any, dtype: Any
    ) -> tuple[Any, float]:
        """(``(Ŵ − W)`` in bfloat16, or None without ``head_w``; the weighted error) of the head quantized to
        ``qtype``, one block of rows at a time: the values of ``_quantized``'s whole candidate, which at Llama
        3's vocabulary was another 2.1 GB beside the head and its bfloat16 copy. ``dtype`` is the run's
        dtype of the head, which ``head_w`` may hold narrower (exactly)."""
        import torch

        if head_w is None:
            return None, self._error_in_blocks(name, rows, qtype)
        w = head_w.reshape(rows.shape)
        dw = torch.empty(rows.shape, dtype=torch.bfloat16, device=head_w.device)

        def put(b: slice, deq: np.ndarray) -> None:
            # each element rounded to the head's dtype, then once to bfloat16: as the whole candidate was
            dq = torch.from_numpy(deq).to(device=w.device, dtype=dtype)
            dw[b] = (dq - w[b].to(dtype)).to(torch.bfloat16)

        err = self._error_in_blocks(name, rows, qtype, put)
        return dw.reshape(head_w.shape), err

    def _error_in_blocks(
        self, name: str, rows: Any, qtype: str, each: Callable[[slice, np.ndarray], None] | None = None
    ) -> float:
        """The weighted error of ``rows`` quantized to ``qtype``, summed a block of rows at a time (the blocks
        and bits of ``weighted_error``), never the whole candidate at once; ``each(rows, dequantized)`` sees
        every block. A non-finite error marks the pair unusable."""
        qw = self._qw(name)
        acc = ErrorSum()
        for b, deq in quantized_blocks(rows, qtype, qw):
            self.ctx.check_cancelled()
            acc.add(rows[b], deq)
            if each is not None:
                each(b, deq)
        err = acc.total(qw)
        self._flag(name, qtype, err)
        return err

    def _flag(self, name: str, qtype: str, err: float) -> None:
        if not math.isfinite(err):
            self.unusable.setdefault((name, qtype), "its quantized weights are not finite")

    def _embedding_delta(
        self, name: str, p: Any, rows: np.ndarray, qtype: str, ids: Any, h0: Any
    ) -> tuple[Any, float]:
        """(the chunks' states entering layer 0 with the embedding ``p`` quantized to ``qtype``, less the
        original's, packed; the weighted error). The error is summed a block of rows at a time, and only the
        rows of the chunks' tokens are rounded and put in ``p`` while the states are made (then restored):
        llama.cpp rounds each row on its own, so these are the whole candidate's values. The whole decoded
        candidate (2.1 GB at Llama 3's vocabulary) beside the embedding was the peak of the 8B fixture's
        best-method budget export, at its judgement's start."""
        import torch

        assert self._spec is not None and self._spec.outer is not None
        err = self._error_in_blocks(name, rows, qtype)
        used = torch.unique(ids.reshape(-1))
        part = quantize_rows(np.ascontiguousarray(rows[used.cpu().numpy()]), qtype, self._qw(name))
        w = p.data
        saved = w[used].clone()  # ``rows`` is ``p``'s memory on a CPU: its rows are read before this
        try:
            w[used] = torch.from_numpy(part).to(device=w.device, dtype=w.dtype)
            delta = _pack(self._spec.outer.embed(ids) - h0)
        finally:
            w[used] = saved
        return delta, err

    def _wanted(self, name: str) -> list[str]:
        """Effective qtypes of ``name`` that need the whole tensor quantized (measured or in a plan)."""
        want = set(self.exact.get(name, ())) | {p[name] for p in self.plans if name in p}
        return sorted(q for q in want if not QTYPES[q].is_float)

    def _errors_only(self, name: str, rows: np.ndarray, msg: str = "") -> None:
        t = self.targets[name]
        for q in self.errors.get(name, ()):
            if (name, q) not in self.err:
                self.ctx.check_cancelled()
                _, self.err[(name, q)] = self._quantized(name, rows, q, False)
                self._step(self._costs.quantize(t, q, False), msg or f"{t.role}: the error at {q}", ROUND)

    # -- consumer
    def start(self, spec: RunSpec) -> None:
        """Check the run; start the plans' streams and those of the token embedding."""
        import torch

        if spec.outer is None or not spec.head:
            raise CalibrationError(
                "The sensitivity scan needs the layer-by-layer runner with the output head."
            )
        self._spec = spec
        if str(spec.device).startswith("cpu"):
            self._costs = dataclasses.replace(self._costs, threads=max(1, torch.get_num_threads()))
        self._meter = WorkMeter(0.0)
        for kind, cost in self._plan_work(spec.n_layers, bool(spec.outer.tied)).items():
            self._meter.plan(cost, kind)
        plan_streams = [_Stream(("p", i), plan=p) for i, p in enumerate(self.plans)]
        self._streams.extend(plan_streams)
        outer = spec.outer
        emb = next((t for t in self.targets.values() if t.kind == "embedding"), None)
        if emb is None or outer.embedding is None:
            return
        p = outer.param(outer.embedding)
        rows = rows_of(p, None)
        wanted = self._wanted(emb.name)
        ids = torch.as_tensor(np.asarray(self.chunk_ids), device=p.device)
        h0 = outer.embed(ids) if wanted else None
        for q in wanted:
            self.ctx.check_cancelled()
            delta, self.err[(emb.name, q)] = self._embedding_delta(emb.name, p, rows, q, ids, h0)
            # a tied head is this quantized embedding: made again at the head (the same bytes), not held
            # through the run (vocabulary × hidden in float32 per type: 0.93 GB at Qwen2.5's 151,936 rows)
            head = (emb.name, q) if outer.tied else None
            if q in self.exact.get(emb.name, ()):
                self._streams.append(_Stream(("t", emb.name, q), delta, head_q=head))
            for s in plan_streams:
                if s.plan.get(emb.name) == q:
                    s.delta, s.head_q = delta, head
            self._step(self._costs.quantize(emb, q, True), f"token embedding at {q}", ROUND)
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
            rows = rows_of(w, site)
            where = f"layer {view.index + 1}/{self._spec.n_layers if self._spec else 0}: {name}"
            for q in self._wanted(name):
                ctx.check_cancelled()
                d, self.err[(name, q)] = self._quantized(name, rows, q, True)
                deq[(name, q)] = from_rows(d, w, site).to(device=w.device, dtype=w.dtype)
                self._step(self._costs.quantize(self.targets[name], q, True), f"{where} at {q}", ROUND)
            self._errors_only(name, rows, where)
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
        self._step(
            (len(carried) + n_new + n_plan) * self._costs.forward(view.index),
            f"layer {view.index + 1}/{n}",
            MATMULS,
        )
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

    def _kl_rows(self, s: _Stream, h2: Any, env: _HeadEnv) -> Any:
        """The stream's KL at every position of every chunk (float64; None where one is not finite),
        measured a block of chunks at a time: the vocabulary-wide temporaries stay one block's, not the
        run's (2,304 held-out and scan positions × 151,936 float32 logits are 1.4 GB each)."""
        import torch

        if s.delta is None and s.head is None and s.head_dw is None:
            return torch.zeros(env.n_chunks * env.n_tok, dtype=torch.float64)
        dw = s.head_dw  # a linear head's change, made once per type in ``finish``
        parts = []
        for c0, c1 in env.blocks:
            rows = slice(c0 * env.n_tok, c1 * env.n_tok)
            if env.fast:
                kl = self._fast_block(env, rows, h2[c0:c1], env.hh[c0:c1], dw)
            else:
                ref = torch_cat([r.unsqueeze(0) for r in env.ref[c0:c1]])
                d = (env.outer.logits(h2[c0:c1], weight=s.head) - ref).reshape(-1, ref.shape[-1])
                kl = kl_rows(env.p[rows], d)
            if kl is None:
                return None
            parts.append(kl)
        return torch_cat(parts)

    @staticmethod
    def _fast_block(env: _HeadEnv, rows: slice, h2: Any, hh: Any, dw: Any) -> Any:
        """``_fast_kl`` on one block of positions, the quantized head's difference ``dw`` made once."""
        import torch

        p = env.p[rows]
        n = p.shape[0]
        dh = (h2 - hh).reshape(n, -1)
        delta = (dh.to(torch.bfloat16) @ env.wb.T).float()
        shift = (dh.float() * env.mvec[rows]).sum(-1)
        if dw is not None:
            delta += (h2.reshape(n, -1).to(torch.bfloat16) @ dw.T).float()
            shift = None
        return kl_rows(p, delta, shift, owned=True)

    def logits(self, chunk: int, logits: Any) -> None:
        """Keep the original's logits of every chunk."""
        self._ref[chunk] = logits

    def _head_env(self, outer: Any, hidden: Any, stack: contextlib.ExitStack) -> _HeadEnv:
        """What every stream's head measure shares: the original's distribution (float32, made chunk by
        chunk; the logits themselves are kept only where the head is not linear), pᵀW, the blocks; a
        linear head is held as the checkpoint stores it while ``stack`` is open (``OuterView.stored``)."""
        import torch

        ref = [self._ref[c] for c in sorted(self._ref)]
        self._ref.clear()
        hh = outer.head_input(hidden)
        head_name = outer.head or (outer.embedding if outer.tied else None)
        head_w = outer.param(head_name) if head_name else None
        fast = head_w is not None and head_is_linear(hh, head_w, ref)
        n_chunks, n_tok, n_vocab = len(ref), int(ref[0].shape[-2]), int(ref[0].shape[-1])
        p = torch.empty((n_chunks * n_tok, n_vocab), dtype=torch.float32)
        mvec = torch.empty((n_chunks * n_tok, int(hh.shape[-1])), dtype=torch.float32) if fast else None
        wf = head_w.detach().float() if fast else None
        for c in range(n_chunks):
            rows = slice(c * n_tok, (c + 1) * n_tok)
            p[rows] = torch.softmax(ref[c].float(), -1).reshape(n_tok, n_vocab)
            if fast:
                # m = pᵀW gives each stream's mean logit change Σ_v p_v δ_v = m·(ĥ' − ĥ) without a pass
                # over the vocabulary; the logits are not needed again
                mvec[rows] = p[rows] @ wf
                ref[c] = None
        del wf
        per = max(1, _HEAD_BLOCK // max(1, n_tok * n_vocab))
        blocks = tuple((a, min(a + per, n_chunks)) for a in range(0, n_chunks, per))
        dtype = None if head_w is None else head_w.dtype
        wb = rows = None
        if fast:
            # the run's float32 head (2.1 GB at Llama 3's vocabulary) beside its bfloat16 copy was most of the
            # budget export's peak at 8B widths; a bfloat16 checkpoint's head is both, so it is held once
            del head_w
            narrow = stack.enter_context(outer.stored(head_name))
            head_w = outer.param(head_name) if narrow is None else narrow
            wb = head_w.detach().to(torch.bfloat16)
            rows = rows_of(head_w, None) if narrow is None else NarrowRows(narrow)
        elif head_w is not None:
            rows = rows_of(head_w, None)
        return _HeadEnv(
            p, mvec, wb, head_w, rows, dtype, hh, None if fast else ref, fast, outer, n_chunks, n_tok, blocks
        )

    def finish(self) -> None:
        """The head: the KL of every stream against the original."""
        with contextlib.ExitStack() as stack:
            # what ``_finish`` held is let go before the stack reads the run's head again
            self._finish(stack)

    def _finish(self, stack: contextlib.ExitStack) -> None:
        import torch

        spec = self._spec
        assert spec is not None and spec.outer is not None
        outer = spec.outer
        hidden = self._last
        env = self._head_env(outer, hidden, stack)
        head_w = env.head_w
        out = next((t for t in self.targets.values() if t.kind == "output"), None)
        has_out = out is not None and head_w is not None
        wanted = self._wanted(out.name) if has_out else ()
        for q in wanted:
            if q in self.exact.get(out.name, ()):
                self._streams.append(_Stream(("t", out.name, q), None, head_q=(out.name, q)))
            for s in self._streams:
                if s.plan is not None and s.plan.get(out.name) == q:
                    s.head_q = (out.name, q)
        streams = list(self._streams)
        self._measure([s for s in streams if s.head_q is None], hidden, env)
        # one quantized head at a time (vocabulary × hidden in float32: 0.93 GB at Qwen2.5's 151,936 rows),
        # each type's streams measured while it is held; before, every type's head was made first (and a
        # tied embedding's were held from the start of the run)
        rows = env.rows
        heads = [(out.name, q) for q in wanted] if has_out else []
        heads += [k for k in dict.fromkeys(s.head_q for s in streams) if k is not None and k not in heads]
        for name, q in heads:
            self.ctx.check_cancelled()
            mine = [s for s in streams if s.head_q == (name, q)]
            new = dw = None
            if env.fast or not mine:
                # a linear head's streams need only (Ŵ − W) in bfloat16: made a block of rows at a time
                # from the rounding, so the decoded candidate (vocabulary × hidden float32) is never whole
                dw, self.err[(name, q)] = self._head_difference(
                    name, rows, q, head_w if mine else None, env.dtype
                )
            else:
                d, self.err[(name, q)] = self._quantized(name, rows, q, True)
                new = torch.from_numpy(d).reshape(head_w.shape).to(device=head_w.device, dtype=env.dtype)
                del d
            self._step(self._costs.quantize(self.targets[name], q, True), f"output head at {q}", ROUND)
            if not mine:
                continue
            for s in mine:
                s.head, s.head_dw = new, dw
            self._measure(mine, hidden, env)
            for s in mine:
                s.head, s.head_dw = None, None
            del new, dw
        if has_out:
            self._errors_only(out.name, rows)
        self._streams.clear()

    def _measure(self, streams: list[_Stream], hidden: Any, env: _HeadEnv) -> None:
        """The KL of each of ``streams`` against the original, in groups."""
        outer = env.outer
        per = max(1, min(_HEAD_GROUP, _HEAD_GROUP_VALUES // max(1, int(hidden.numel()))))
        for a in range(0, len(streams), per):
            self.ctx.check_cancelled()
            group = streams[a : a + per]
            moved = [s for s in group if s.delta is not None]
            h2s = {}
            if moved:  # the final norm of every moved stream of the group in one call
                x = torch_cat([hidden + s.delta.to(hidden.dtype) for s in moved])
                for s, h2 in zip(moved, outer.head_input(x).split(int(hidden.shape[0])), strict=True):
                    h2s[id(s)] = h2
            for s in group:
                self.ctx.check_cancelled()
                kls = self._kl_rows(s, h2s.pop(id(s), env.hh), env)
                kl = float("nan") if kls is None else float(kls.mean())
                if s.key[0] == "t":
                    if not math.isfinite(kl):  # float64 already where float32 failed
                        self.unusable.setdefault(
                            (s.key[1], s.key[2]), "its KL is not finite, even measured in float64"
                        )
                    self.kl[(s.key[1], s.key[2])] = kl
                else:
                    self.plan_kl[s.key[1]] = kl
                    if self.groups:  # the plan on each text of the run, one KL per group of chunks
                        ends = (np.cumsum((0, *self.groups)) * env.n_tok).tolist()
                        self.plan_group_kl[s.key[1]] = tuple(
                            float("nan") if kls is None else float(kls[a0:a1].mean())
                            for a0, a1 in zip(ends, ends[1:], strict=False)
                        )
                self._step(self._costs.head, "output head", MATMULS)


def scan_work(
    targets: Sequence[ScanTarget],
    n_tokens: int,
    *,
    exact: Mapping[str, Sequence[str]],
    errors: Mapping[str, Sequence[str]] | None = None,
    plans: Sequence[Mapping[str, str]] = (),
    tied: bool = False,
) -> dict[str, float]:
    """The work a scan of ``targets`` on ``n_tokens`` positions plans, by kind (``ROUND``, ``MATMULS``):
    what its progress bar weighs, known before it runs (``studio.core.calib.budget_job``)."""
    scan = SensitivityScan(
        targets, np.zeros(max(1, n_tokens), np.int64), exact=exact, errors=errors, plans=plans
    )
    n_layers = max([t.layer + 1 for t in targets if t.layer is not None], default=0)
    return scan._plan_work(n_layers, tied)


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
