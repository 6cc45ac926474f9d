"""Evaluate quantized variants against their original: perplexity, KL divergence, same-top-token rate, size.

The original (a checkpoint through transformers, or a GGUF) tokenizes the text once; every model is
then run on exactly those token ids, chunk by chunk, following llama.cpp's perplexity convention
(see ``metrics``). The original's logits of the scored rows are kept (in memory, or in a temporary
memory-mapped file when large) so each variant is loaded alone, compared, and closed again.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core import hardware, safejson
from studio.core.chat.hf_backend import TransformersBackend
from studio.core.chat.llama_backend import LlamaCppBackend
from studio.core.errors import EvaluationError, StudioError
from studio.core.evaluate.layerwise import LayerwiseOriginal, original_facts, original_in_layers
from studio.core.evaluate.logit_store import LogitStore
from studio.core.evaluate.metrics import (
    chunk_starts,
    chunk_tokens,
    kl_rows,
    kl_stats,
    perplexity,
    scored_positions,
    token_nll,
)
from studio.core.evaluate.texts import EvalText, load_text
from studio.core.evaluate.verdict import judge
from studio.core.gguf.read import read_gguf
from studio.core.jobs import JobCancelled, JobContext, null_context
from studio.core.lab.memory import gguf_kv_cache_bytes
from studio.core.llamacpp.kvcache import kv_type
from studio.core.plan.job_estimate import check_whole_fits, estimate_whole
from studio.core.quality import MeasuredOn


@dataclass(frozen=True)
class ModelScore:
    """Perplexity and size of the original model."""

    path: str
    label: str
    kind: str  # "transformers" or "llama.cpp"
    ppl: float
    ppl_err: float
    n_scored: int
    file_bytes: int
    bpw: float


@dataclass(frozen=True)
class VariantScore:
    """How far one variant is from the original on the same tokens, and what it costs in size."""

    path: str
    label: str
    ppl: float
    ppl_err: float
    kld_mean: float
    kld_median: float
    kld_p99: float
    kld_max: float
    same_top_pct: float
    file_bytes: int
    bpw: float
    n_scored: int
    error: str | None = None
    kv_type: str = "f32"  # the variant's KV-cache type in llama.cpp (``studio.core.llamacpp.kvcache``)
    kv_cache_bytes: int = 0  # what that cache takes at the evaluation's context

    def delta_ppl_pct(self, original_ppl: float) -> float:
        """Perplexity change relative to the original, in percent."""
        return (
            100.0 * (self.ppl / original_ppl - 1.0)
            if original_ppl and math.isfinite(self.ppl)
            else float("nan")
        )


@dataclass(frozen=True)
class QualityPoint:
    """One point of the quality-versus-size plot."""

    label: str
    file_bytes: int
    bpw: float
    kld_mean: float
    ppl: float


@dataclass(frozen=True)
class EvalReport:
    """The results of one evaluation run."""

    original: ModelScore
    variants: tuple[VariantScore, ...]
    text_name: str
    n_ctx: int
    n_chunks: int
    n_tokens: int
    seconds: float
    notes: tuple[str, ...] = ()  # what the user should know about how models ran (llama.cpp restarts)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (NaN becomes None); each variant has its ``verdict`` in plain words."""

        def variant(v: VariantScore) -> dict[str, Any]:
            j = None if v.error else judge(self.original.ppl, v.ppl)
            return {
                **asdict(v),
                "verdict": j.verdict.value if j else None,
                "verdict_detail": j.to_dict() if j else None,
            }

        return _clean(
            {
                "original": asdict(self.original),
                "variants": [variant(v) for v in self.variants],
                "text": self.text_name,
                "measured_on": MeasuredOn(
                    self.text_name, self.original.n_scored, self.n_ctx, self.n_chunks
                ).to_dict(),
                "ctx": self.n_ctx,
                "chunks": self.n_chunks,
                "tokens": self.n_tokens,
                "seconds": self.seconds,
                "notes": list(self.notes),
            }
        )

    def quality_vs_size(self) -> tuple[QualityPoint, ...]:
        """Variants that were evaluated, smallest file first."""
        pts = [
            QualityPoint(v.label, v.file_bytes, v.bpw, v.kld_mean, v.ppl)
            for v in self.variants
            if v.error is None
        ]
        return tuple(sorted(pts, key=lambda p: p.file_bytes))


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


# ------------------------------------------------------------------------------------------ sizes


def gguf_size(path: str | Path) -> tuple[int, float]:
    """(file bytes, bits per weight of the tensor data) of a GGUF file."""
    h = read_gguf(path)
    n = sum(t.n_elements for t in h.tensors)
    b = sum(t.nbytes for t in h.tensors)
    return h.file_size, (8.0 * b / n if n else float("nan"))


def checkpoint_size(path: str | Path, n_params: int) -> tuple[int, float]:
    """(bytes of the weight files, bits per parameter) of a checkpoint folder."""
    folder = Path(path)
    files = [
        p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth") and p.is_file()
    ]
    total = sum(p.stat().st_size for p in files)
    return total, (8.0 * total / n_params if n_params else float("nan"))


# ------------------------------------------------------------------------------------------ identity


def _model_dims(path: Path) -> tuple[int, int] | None:
    """(layers, hidden width) from a GGUF header or a checkpoint's config.json; None when unknown."""
    try:
        if path.suffix.lower() == ".gguf":
            meta = read_gguf(path).metadata
            arch = str(meta.get("general.architecture", ""))
            layers, width = meta.get(f"{arch}.block_count"), meta.get(f"{arch}.embedding_length")
        else:
            cfg = safejson.loads((path / "config.json").read_bytes(), "config.json", ValueError)
            cfg = cfg.get("text_config") or cfg
            layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
            if layers is not None:  # llama.cpp counts multi-token-prediction layers as blocks too
                layers = int(layers) + int(cfg.get("num_nextn_predict_layers") or 0)
            width = cfg.get("hidden_size", cfg.get("n_embd"))
        return (int(layers), int(width)) if layers is not None and width is not None else None
    except (StudioError, OSError, ValueError, TypeError, AttributeError):
        return None  # unknown: the vocabulary check still applies


@dataclass(frozen=True)
class _Identity:
    """What a variant must share with the original for the comparison to mean anything."""

    name: str
    vocab: tuple[str, ...] | None
    dims: tuple[int, int] | None

    def check_dims(self, path: Path) -> None:
        """Refuse a GGUF whose layer count or width differs (a different model, same tokenizer)."""
        dims = _model_dims(path)
        if self.dims is None or dims is None or dims == self.dims:
            return
        raise EvaluationError(
            f"{path.name} has {dims[0]} layers of width {dims[1]}, the original {self.name} "
            f"{self.dims[0]} of width {self.dims[1]}; it is not a variant of this model."
        )

    def check_vocab(self, path: Path, vocab: tuple[str, ...] | None) -> None:
        """Refuse a GGUF whose token strings differ: the original's token ids would mean other text."""
        if not self.vocab or not vocab:
            return
        n = min(len(self.vocab), len(vocab))
        diff = next((i for i in range(n) if self.vocab[i] != vocab[i]), None)
        if diff is None:
            return
        raise EvaluationError(
            f"{path.name} has another vocabulary than the original {self.name} (token {diff} is "
            f"{vocab[diff]!r} there, {self.vocab[diff]!r} in the original); it is not a variant of this model."
        )


# ------------------------------------------------------------------------------------------ scorers


def _llama_scorer(
    path: Path,
    n_ctx: int,
    n_gpu_layers: int,
    extra_buffers: str,
    on_note: Callable[[str], None],
    kv_type: str | None = None,
) -> Any:
    return LlamaCppBackend(
        path,
        n_ctx=n_ctx,
        n_gpu_layers=n_gpu_layers,
        logits_all=True,
        extra_buffers=extra_buffers,
        on_note=on_note,
        kv_type=kv_type,
    )


def _open_scorer(
    path: Path,
    n_ctx: int,
    device: str,
    dtype: str,
    n_gpu_layers: int,
    extra_buffers: str,
    on_note: Callable[[str], None],
    allow_pickle: bool,
) -> Any:
    if path.suffix.lower() == ".gguf":
        return _llama_scorer(path, n_ctx, n_gpu_layers, extra_buffers, on_note)

    return TransformersBackend(path, n_ctx=n_ctx, device=device, dtype=dtype, allow_pickle=allow_pickle)


def check_original_memory(path: Path, n_ctx: int, device: str, dtype: str) -> None:
    """Refuse, in one sentence and before loading it, an original checkpoint that transformers would load
    whole into more memory than is free (``studio.core.plan.job_estimate``)."""
    facts = original_facts(path, device, dtype)
    if facts is None:
        return
    cfg, dev, nbytes = facts
    est = estimate_whole(cfg, n_ctx, dtype_bytes=nbytes, device=dev)
    check_whole_fits(est, hardware.ram()[1], str(path))


ScorerFactory = Callable[[Path, int], Any]


def evaluate(
    original: str | Path,
    variants: Sequence[str | Path],
    *,
    text: str | os.PathLike[str] | EvalText = "sample",
    n_ctx: int = 512,
    max_chunks: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    n_gpu_layers: int = 0,
    extra_buffers: str = "auto",
    allow_pickle: bool = False,
    ctx: JobContext | None = None,
    kv_types: Sequence[str] = (),
    on_score: Callable[[Any], None] | None = None,
    executor: Any = None,
    original_mode: str = "auto",
) -> EvalReport:
    """Score ``original`` and every variant on ``text``; see the module docstring for the method.

    ``extra_buffers`` (auto/on/off) is llama.cpp's weight repacking for the GGUFs, see ``studio.core.llamacpp``.
    ``allow_pickle``: an original holding only ``pytorch_model.bin`` is converted in a child process
    (``open_model``'s cached safetensors) instead of refused; it is never unpickled in this process.
    ``kv_types``: score every variant once per llama.cpp KV-cache type (``f32``, ``f16``, ``q8_0``,
    ``q4_0``), labelled ``name [KV q8_0]``; empty keeps the exact F32 cache, labelled by name.
    ``on_score`` is called (on the caller's thread) with the original's ``ModelScore`` and then with each
    ``VariantScore`` as soon as it is measured, so a window can show rows before the report is complete.
    ``executor`` (``studio.core.executor``): a distributed one scores the variants' chunks as units on a
    cluster (``studio.core.cluster.evaluate``), with the same numbers.
    ``original_mode``: how an original checkpoint runs: ``whole`` through transformers, ``layers`` one
    decoder layer at a time (``studio.core.evaluate.layerwise``), ``auto`` layer by layer when whole
    would take more than ``layerwise.WHOLE_LIMIT`` or the free RAM.
    """
    ctx = ctx or null_context()
    t0 = time.monotonic()
    if n_ctx < 8:
        raise EvaluationError(f"A context of {n_ctx} tokens is too small to evaluate; use at least 8.")
    if max_chunks is not None and max_chunks < 1:
        raise EvaluationError(f"At least one chunk must be evaluated, not {max_chunks}.")
    if kv_types:
        kv_types = tuple(dict.fromkeys(kv_type(t).name for t in kv_types))  # unknown names fail here
    et = text if isinstance(text, EvalText) else load_text(text)
    orig_path = Path(original).expanduser()
    sl = scored_positions(n_ctx)
    n_rows = sl.stop - sl.start

    ctx.report(0, 1, f"Loading {orig_path.name}")
    notes: list[str] = []

    def note(text: str) -> None:
        # a restart without extra buffers: in the report and the job's log (the CLI prints it)
        notes.append(text)
        ctx.log(text)

    if original_in_layers(orig_path, n_ctx, device, dtype, original_mode):
        scorer: Any = LayerwiseOriginal(
            orig_path, device=device, dtype=dtype, n_ctx=n_ctx, allow_pickle=allow_pickle
        )
    else:
        check_original_memory(orig_path, n_ctx, device, dtype)
        scorer = _open_scorer(
            orig_path, n_ctx, device, dtype, n_gpu_layers, extra_buffers, note, allow_pickle
        )
    base: LogitStore | None = None
    try:
        scorer.load(ctx)
        if scorer.n_ctx < n_ctx:
            raise EvaluationError(
                f"{orig_path.name} handles at most {scorer.n_ctx} positions; evaluate with --ctx {scorer.n_ctx} or less."
            )
        tokens = scorer.tokenize(et.text, True)
        bos = scorer.bos_id
        starts = chunk_starts(len(tokens), n_ctx, max_chunks)
        if not starts:
            raise EvaluationError(
                f"The text {et.name} has {len(tokens)} tokens, fewer than one chunk of {n_ctx}.",
                hint="Use a longer text or a smaller --ctx.",
            )
        runs = [(v, t) for v in variants for t in kv_types] if kv_types else [(v, None) for v in variants]
        total = len(starts) * (1 + len(runs))
        nll_o: list[np.ndarray] = []

        def take(ci: int, logits: np.ndarray) -> None:
            nonlocal base
            start = starts[ci]
            if base is None:
                base = LogitStore(len(starts), n_rows, int(logits.shape[-1]))
            base[ci] = logits[sl]
            nll_o.append(token_nll(logits[sl], tokens[start + sl.start + 1 : start + sl.stop + 1]))

        if getattr(scorer, "layerwise", False):
            scorer.logits_of_chunks(
                [chunk_tokens(tokens, start, n_ctx, bos) for start in starts],
                take,
                ctx.span(0.0, len(starts) / total),
            )
        else:
            for ci, start in enumerate(starts):
                ctx.check_cancelled()
                take(ci, np.asarray(scorer.logits(chunk_tokens(tokens, start, n_ctx, bos)), dtype=np.float32))
                ctx.report(ci + 1, total, f"{orig_path.name}: chunk {ci + 1}/{len(starts)}")
        assert base is not None
        if scorer.kind == "llama.cpp":
            size, bpw = gguf_size(orig_path)
        else:
            size, bpw = checkpoint_size(orig_path, scorer.param_count)
        identity = _Identity(
            orig_path.name, getattr(scorer, "vocab_tokens", lambda: None)(), _model_dims(orig_path)
        )
        nll = np.concatenate(nll_o)
        ppl, err = perplexity(nll)
        orig_score = ModelScore(
            str(orig_path), orig_path.name, scorer.kind, ppl, err, int(nll.size), size, bpw
        )
        scorer.close()
        if on_score is not None:
            on_score(orig_score)

        scores: list[VariantScore] = []
        if executor is not None and executor.distributed:
            score_on_cluster = executor.job("score")  # studio.core.cluster.evaluate

            scores = score_on_cluster(
                executor, runs, tokens, starts, bos, base, n_ctx, n_gpu_layers, ctx, len(starts), total,
                identity, extra_buffers,
            )  # fmt: skip
            runs = []
        for vi, (vpath, kv) in enumerate(runs):
            done = len(starts) * (1 + vi)
            scores.append(
                _score_variant(
                    Path(vpath).expanduser(),
                    tokens,
                    starts,
                    bos,
                    base,
                    n_ctx,
                    n_gpu_layers,
                    ctx,
                    done,
                    total,
                    identity,
                    extra_buffers,
                    note,
                    kv,
                )
            )
            if on_score is not None:
                on_score(scores[-1])
        return EvalReport(
            orig_score,
            tuple(scores),
            et.name,
            n_ctx,
            len(starts),
            len(tokens),
            time.monotonic() - t0,
            tuple(notes),
        )
    finally:
        scorer.close()
        if base is not None:
            base.close()


def variant_facts(
    path: Path, kv_type: str | None, n_ctx: int, identity: _Identity | None
) -> tuple[str, dict[str, Any], int, float] | VariantScore:
    """(label, KV-cache facts, file bytes, bpw) of a variant, or its failed ``VariantScore`` when it is
    not a GGUF of the original's shape (checked before loading it)."""
    nan = float("nan")
    label = path.name if kv_type is None else f"{path.name} [KV {kv_type}]"
    kv: dict[str, Any] = {"kv_type": kv_type or "f32", "kv_cache_bytes": 0}
    try:
        if path.is_dir():
            raise EvaluationError(
                f"{path.name} is a folder; a variant must be a GGUF file.",
                hint="Export it first with quant-studio-cli export.",
            )
        file_bytes, bpw = gguf_size(path)
        if identity is not None:
            identity.check_dims(path)

        kv["kv_cache_bytes"] = gguf_kv_cache_bytes(path, n_ctx, kv_type or "f32")
    except StudioError as err:
        return VariantScore(str(path), label, nan, nan, nan, nan, nan, nan, nan, 0, nan, 0, str(err), **kv)
    return label, kv, file_bytes, bpw


def open_variant(
    path: Path,
    n_ctx: int,
    n_gpu_layers: int,
    extra_buffers: str,
    on_note: Callable[[str], None],
    kv_type: str | None,
    n_vocab: int,
    identity: _Identity | None,
    ctx: JobContext,
) -> Any:
    """A variant loaded in llama.cpp and checked to be one of the original (``n_vocab`` tokens, the same
    vocabulary); closed again when a check fails."""
    var = _llama_scorer(path, n_ctx, n_gpu_layers, extra_buffers, on_note, kv_type)
    try:
        var.load(ctx)
        if var.n_vocab != n_vocab:
            raise EvaluationError(
                f"{path.name} has {var.n_vocab} tokens in its vocabulary, the original {n_vocab}; "
                "it is not a variant of this model."
            )
        if identity is not None:
            identity.check_vocab(path, var.vocab_tokens())
    except BaseException:
        var.close()
        raise
    return var


def score_chunk(
    var: Any, tokens: Sequence[int], start: int, bos: int | None, n_ctx: int, ref: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One chunk of a loaded variant against the original's scored rows ``ref``: (token NLLs, KLs,
    same top token)."""
    sl = scored_positions(n_ctx)
    ids = chunk_tokens(tokens, start, n_ctx, bos)
    rows = np.asarray(var.logits(ids), dtype=np.float32)[sl]
    ref = np.asarray(ref)
    nll = token_nll(rows, tokens[start + sl.start + 1 : start + sl.stop + 1])
    return nll, kl_rows(ref, rows), ref.argmax(-1) == rows.argmax(-1)


def variant_score(
    path: Path,
    label: str,
    kv: dict[str, Any],
    file_bytes: int,
    bpw: float,
    parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> VariantScore:
    """A variant's statistics from its chunks' (NLLs, KLs, same top token), in text order."""
    ppl, err = perplexity(np.concatenate([p[0] for p in parts]))
    st = kl_stats(np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]))
    return VariantScore(
        str(path),
        label,
        ppl,
        err,
        st.mean,
        st.median,
        st.p99,
        st.max,
        st.same_top_pct,
        file_bytes,
        bpw,
        st.n,
        **kv,
    )


def _score_variant(
    path: Path,
    tokens: Sequence[int],
    starts: Sequence[int],
    bos: int | None,
    base: LogitStore,
    n_ctx: int,
    n_gpu_layers: int,
    ctx: JobContext,
    done: int,
    total: int,
    identity: _Identity | None = None,
    extra_buffers: str = "auto",
    on_note: Callable[[str], None] | None = None,
    kv_type: str | None = None,
) -> VariantScore:
    nan = float("nan")
    facts = variant_facts(path, kv_type, n_ctx, identity)
    if isinstance(facts, VariantScore):
        return facts
    label, kv, file_bytes, bpw = facts
    ctx.report(done, total, f"Loading {label}")
    var = None
    try:
        var = open_variant(
            path,
            n_ctx,
            n_gpu_layers,
            extra_buffers,
            on_note or ctx.log,
            kv_type,
            base.shape[-1],
            identity,
            ctx,
        )
        parts = []
        for ci, start in enumerate(starts):
            ctx.check_cancelled()
            parts.append(score_chunk(var, tokens, start, bos, n_ctx, base[ci]))
            ctx.report(done + ci + 1, total, f"{label}: chunk {ci + 1}/{len(starts)}")
    except JobCancelled:
        raise
    except StudioError as err:
        return VariantScore(
            str(path), label, nan, nan, nan, nan, nan, nan, nan, file_bytes, bpw, 0, str(err), **kv
        )
    finally:
        if var is not None:
            var.close()
    return variant_score(path, label, kv, file_bytes, bpw, parts)
