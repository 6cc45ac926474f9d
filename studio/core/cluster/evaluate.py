"""Evaluation's variants × text chunks as independent units on an executor.

The head scores the original once (its logits of the scored rows are kept, as in process) and puts
each chunk's rows into the object store once; a unit loads one variant in llama.cpp on a worker (kept
there for the variant's next chunks) and scores one chunk with evaluation's own ``score_chunk``. The
head puts every variant's chunks back in text order and computes the same statistics as in process
(``variant_score``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.evaluate import run as R
from studio.core.executor import Executor, Unit
from studio.core.jobs import JobContext, null_context


def score_on_cluster(
    executor: Executor,
    runs: Sequence[tuple[Any, str | None]],
    tokens: Sequence[int],
    starts: Sequence[int],
    bos: int | None,
    base: Any,  # the original's logits, chunk by chunk (evaluate.logit_store.LogitStore)
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
        facts = R.variant_facts(path, kv_type, n_ctx, identity)
        heads.append(facts if isinstance(facts, R.VariantScore) else (path, kv_type, *facts))
    tok = executor.share(np.asarray(tokens, dtype=np.int64))
    rows = [executor.share(np.ascontiguousarray(base[ci])) for ci in range(len(starts))]
    ident = executor.share(identity)
    units, where = [], []
    for ri, h in enumerate(heads):
        if not isinstance(h, tuple):
            continue
        path, kv_type = h[0], h[1]
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
        path, _, label, kv, file_bytes, bpw = h
        got = [parts[(ri, ci)] for ci in range(len(starts))]
        err = next((g for g in got if isinstance(g, str)), None)
        if err is not None:
            out.append(R.VariantScore(str(path), label, *[nan] * 7, file_bytes, bpw, 0, err, **kv))
            continue
        out.append(R.variant_score(path, label, kv, file_bytes, bpw, got))
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | str:
    """One variant on one chunk (a worker): evaluation's ``score_chunk``, or the sentence of what failed."""
    tokens = _resolve(tokens)
    ref = np.asarray(_resolve(ref))
    identity = _resolve(identity)
    p = Path(path)
    try:
        var = _variant(
            (path, kv_type, n_ctx, n_gpu_layers, extra_buffers),
            lambda: R.open_variant(
                p,
                n_ctx,
                n_gpu_layers,
                extra_buffers,
                lambda _m: None,
                kv_type,
                ref.shape[-1],
                identity,
                null_context(),
            ),  # fmt: skip
        )
        return R.score_chunk(var, tokens, start, bos, n_ctx, ref)
    except StudioError as err:
        return str(err)


__all__ = ["eval_unit", "score_on_cluster"]
