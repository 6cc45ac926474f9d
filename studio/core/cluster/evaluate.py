"""Evaluation's variants × text chunks as independent units on an executor.

The head scores the original once (its logits of the scored rows are kept, as in process) and puts
each chunk's rows into the object store once; a unit loads one variant in llama.cpp on a worker (kept
there for the variant's next chunks) and returns that chunk's token NLLs, KLs and top-token matches.
The head puts every variant's chunks back in text order and computes the same statistics as in process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import EvaluationError, StudioError
from studio.core.evaluate import metrics as M
from studio.core.evaluate import run as R
from studio.core.executor import Executor, Unit
from studio.core.jobs import JobContext, null_context
from studio.core.lab.memory import gguf_kv_cache_bytes


def score_on_cluster(
    executor: Executor,
    runs: Sequence[tuple[Any, str | None]],
    tokens: Sequence[int],
    starts: Sequence[int],
    bos: int | None,
    base: np.ndarray,
    n_ctx: int,
    n_gpu_layers: int,
    ctx: JobContext,
    done: int,
    total: int,
    identity: Any,
    extra_buffers: str,
) -> list[Any]:
    """One ``VariantScore`` per run (variant path, KV type), its chunks scored as units."""
    nan = float("nan")
    heads: list[Any] = []
    for vpath, kv_type in runs:
        path = Path(vpath).expanduser()
        label = path.name if kv_type is None else f"{path.name} [KV {kv_type}]"
        kv = {"kv_type": kv_type or "f32", "kv_cache_bytes": 0}
        try:
            if path.is_dir():
                raise EvaluationError(
                    f"{path.name} is a folder; a variant must be a GGUF file.",
                    hint="Export it first with quant-studio-cli export.",
                )
            file_bytes, bpw = R.gguf_size(path)
            if identity is not None:
                identity.check_dims(path)
            kv["kv_cache_bytes"] = gguf_kv_cache_bytes(path, n_ctx, kv_type or "f32")
        except StudioError as err:
            heads.append(R.VariantScore(str(path), label, *[nan] * 7, 0, nan, 0, str(err), **kv))
            continue
        heads.append((path, label, kv, file_bytes, bpw, kv_type))
    tok = executor.share(np.asarray(tokens, dtype=np.int64))
    rows = [executor.share(np.ascontiguousarray(base[ci])) for ci in range(len(starts))]
    ident = executor.share(identity)
    units, where = [], []
    for ri, h in enumerate(heads):
        if not isinstance(h, tuple):
            continue
        path, _, _, _, _, kv_type = h
        for ci, start in enumerate(starts):
            args = (
                str(path),
                kv_type,
                n_ctx,
                n_gpu_layers,
                extra_buffers,
                tok,
                int(start),
                bos,
                rows[ci],
                ident,
            )
            units.append(Unit(args, 1, f"{path.name}#{ci}"))
            where.append((ri, ci))
    parts: dict[tuple[int, int], Any] = {}
    for i, res in executor.run(eval_unit, units, ctx, what="variant chunks", done_before=done, total=total):
        parts[where[i]] = res
    out = []
    for ri, h in enumerate(heads):
        if not isinstance(h, tuple):
            out.append(h)
            continue
        path, label, kv, file_bytes, bpw, _ = h
        got = [parts[(ri, ci)] for ci in range(len(starts))]
        err = next((g["error"] for g in got if "error" in g), None)
        if err is not None:
            out.append(R.VariantScore(str(path), label, *[nan] * 7, file_bytes, bpw, 0, err, **kv))
            continue
        all_nll = np.concatenate([g["nll"] for g in got])
        ppl, perr = M.perplexity(all_nll)
        st = M.kl_stats(np.concatenate([g["kl"] for g in got]), np.concatenate([g["same"] for g in got]))
        out.append(
            R.VariantScore(
                str(path),
                label,
                ppl,
                perr,
                st.mean,
                st.median,
                st.p99,
                st.max,
                st.same_top_pct,
                file_bytes,
                bpw,
                st.n,
                **kv,
            )  # fmt: skip
        )
    return out


def _resolve(x: Any) -> Any:
    if type(x).__name__ == "ObjectRef":
        import ray

        return ray.get(x)
    return x


# one loaded variant per worker process: a variant's chunks mostly follow each other on a worker
_LOADED: dict[tuple[Any, ...], Any] = {}


def _variant(key: tuple[Any, ...], open_: Callable[[], Any]) -> Any:
    var = _LOADED.get(key)
    if var is None:
        for old in _LOADED.values():
            old.close()
        _LOADED.clear()
        var = open_()
        _LOADED[key] = var
    return var


def eval_unit(
    path: str,
    kv_type: str | None,
    n_ctx: int,
    n_gpu_layers: int,
    extra_buffers: str,
    tokens: Any,
    start: int,
    bos: int | None,
    ref: Any,
    identity: Any,
) -> dict[str, Any]:
    """One variant on one chunk: token NLLs, KLs and top-token matches of the scored rows (a worker)."""
    tokens = _resolve(tokens)
    ref = np.asarray(_resolve(ref))
    identity = _resolve(identity)
    key = (path, kv_type, n_ctx, n_gpu_layers, extra_buffers)
    p = Path(path)
    try:

        def open_() -> Any:
            var = R._llama_scorer(p, n_ctx, n_gpu_layers, extra_buffers, lambda _m: None, kv_type)
            try:
                var.load(null_context())
                if var.n_vocab != ref.shape[-1]:
                    raise EvaluationError(
                        f"{p.name} has {var.n_vocab} tokens in its vocabulary, the original {ref.shape[-1]}; "
                        "it is not a variant of this model."
                    )
                if identity is not None:
                    identity.check_vocab(p, var.vocab_tokens())
            except BaseException:
                var.close()
                raise
            return var

        var = _variant(key, open_)
        sl = M.scored_positions(n_ctx)
        ids = M.chunk_tokens(tokens, start, n_ctx, bos)
        rows = np.asarray(var.logits(ids), dtype=np.float32)[sl]
        return {
            "nll": M.token_nll(rows, tokens[start + sl.start + 1 : start + sl.stop + 1]),
            "kl": M.kl_rows(ref, rows),
            "same": ref.argmax(-1) == rows.argmax(-1),
        }
    except StudioError as err:
        return {"error": str(err)}


__all__ = ["eval_unit", "score_on_cluster"]
