"""The last evaluation of a variant, kept beside it as ``NAME.gguf.eval.json`` for the model card.

A record is written for every variant an evaluation scored (``save_records``) and read back with
``last_evaluation``, which ignores a record whose file has changed since: the record holds the
file's size and a fingerprint (sha256 of its first and last MiB, cheap even for a 40 GB file).
The record sits next to the GGUF so it travels with it when the folder is copied.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from studio.core.atomic import write_atomic
from studio.core.evaluate.run import EvalReport, VariantScore

RECORD_SUFFIX = ".eval.json"
RECORD_VERSION = 1
_EDGE = 1 << 20  # bytes hashed at each end of the file


@dataclass(frozen=True)
class EvalRecord:
    """What one evaluation measured for one variant, with enough context to quote it."""

    variant: str  # file name of the variant
    file_bytes: int
    fingerprint: str
    original: str  # label of the original it was compared with
    original_kind: str  # "transformers" or "llama.cpp"
    original_ppl: float | None
    ppl: float | None
    ppl_err: float | None
    kld_mean: float | None
    kld_p99: float | None
    same_top_pct: float | None
    bpw: float | None
    text: str
    ctx: int
    chunks: int
    n_scored: int
    runtime: str  # the llama.cpp build that ran the variant
    when: str  # ISO 8601, UTC

    @property
    def delta_ppl_pct(self) -> float | None:
        """Perplexity change against the original, in percent (None when either is unknown)."""
        if not self.ppl or not self.original_ppl:
            return None
        return 100.0 * (self.ppl / self.original_ppl - 1.0)


def record_path(gguf: str | os.PathLike[str]) -> Path:
    """Where the record of ``gguf`` lives: ``NAME.gguf.eval.json`` in the same folder."""
    p = Path(gguf)
    return p.with_name(p.name + RECORD_SUFFIX)


def fingerprint(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(size, sha256 of the first and last MiB) of a file; OSError when it cannot be read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h = hashlib.sha256(f.read(_EDGE))
        if size > _EDGE:
            f.seek(max(_EDGE, size - _EDGE))
            h.update(f.read(_EDGE))
    return size, h.hexdigest()


def runtime_version() -> str:
    """The llama.cpp build that runs variants: llama-cpp-python's version (it pins llama.cpp)."""
    try:
        return f"llama-cpp-python {version('llama-cpp-python')}"
    except PackageNotFoundError:
        return "llama-cpp-python (version unknown)"


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _record(report: EvalReport, v: VariantScore, size: int, fp: str) -> EvalRecord:
    o = report.original
    return EvalRecord(
        variant=Path(v.path).name,
        file_bytes=size,
        fingerprint=fp,
        original=o.label,
        original_kind=o.kind,
        original_ppl=_finite(o.ppl),
        ppl=_finite(v.ppl),
        ppl_err=_finite(v.ppl_err),
        kld_mean=_finite(v.kld_mean),
        kld_p99=_finite(v.kld_p99),
        same_top_pct=_finite(v.same_top_pct),
        bpw=_finite(v.bpw),
        text=report.text_name,
        ctx=report.n_ctx,
        chunks=report.n_chunks,
        n_scored=v.n_scored,
        runtime=runtime_version(),
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def save_records(report: EvalReport) -> list[str]:
    """Write a record beside every variant that was scored; returns one note per record not written.

    Failing to write a record (read-only folder, full disk) never fails the evaluation itself.
    """
    notes = []
    for v in report.variants:
        if v.error is not None:
            continue
        path = Path(v.path)
        try:
            size, fp = fingerprint(path)
            text = json.dumps({"version": RECORD_VERSION, **asdict(_record(report, v, size, fp))}, indent=1)
            write_atomic(record_path(path), text)
        except OSError as err:
            notes.append(f"The evaluation of {path.name} was not saved beside it ({err.strerror or err}).")
    return notes


def last_evaluation(gguf: str | os.PathLike[str]) -> EvalRecord | None:
    """The recorded evaluation of ``gguf``, or None when there is none, it is unreadable or stale."""
    try:
        data = json.loads(record_path(gguf).read_text(encoding="utf-8"))  # noqa: TID251 - the evaluation record is written by record_evaluation (this module)
        size, fp = fingerprint(gguf)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        return None
    if data.get("file_bytes") != size or data.get("fingerprint") != fp:
        return None  # the file changed after it was evaluated
    fields = EvalRecord.__dataclass_fields__
    try:
        return EvalRecord(**{k: data[k] for k in fields})
    except (KeyError, TypeError):
        return None


__all__ = ["RECORD_SUFFIX", "EvalRecord", "fingerprint", "last_evaluation", "record_path", "save_records"]
