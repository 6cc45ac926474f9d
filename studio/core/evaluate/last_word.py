"""llama.cpp has the last word on a budget plan's file: before the export renames its ``.partial``, llama.cpp
itself (the child process verification runs) measures the file's KL against the original on a few held-out
tokens, and the same-size preset's file on the same tokens.

Why: every number the planner uses comes from the studio's own forward passes; a mis-measured candidate
(the demo's tied embedding at Q2_0: predicted NaN, llama.cpp measured 34 nats) would otherwise ship as
"wrote". A file whose measured KL is far above its prediction (``MAX_OVER_PREDICTION``) or above the
preset's is not a success: ``LastWord.ok`` is False and ``sentence`` says so and recommends the preset.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import EvaluationError, StudioError
from studio.core.evaluate.layerwise import LayerwiseOriginal, original_in_layers
from studio.core.export.run import export_gguf
from studio.core.export.verify import verify_gguf
from studio.core.jobs import JobContext, null_context
from studio.core.model.rotate import rotation_of
from studio.core.plan.plan import plan_from_preset, plan_from_types
from studio.core.quant.methods import ALIASES

MAX_OVER_PREDICTION = (
    3.0  # measured / predicted KL above this: the prediction was wrong, the file is not trusted
)
LAST_WORD_TOKENS = 256  # held-out tokens llama.cpp measures (a few chunks: seconds on the demo)
BEST_METHOD = ALIASES["best"]  # the calibrated rounding recommended with a preset (as the held-out verdict)


@dataclass(frozen=True)
class LastWord:
    """llama.cpp's measurement of a budget file and of the same-size preset on the same held-out tokens."""

    file_kl: float
    predicted_kl: float
    tokens: int
    preset: str | None  # the same-size preset's name (None: no preset fits the budget)
    preset_kl: float | None
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether the file may be written as a success: finite, within ``MAX_OVER_PREDICTION`` × its
        prediction, and not above the preset's KL."""
        if not math.isfinite(self.file_kl):
            return False
        if math.isfinite(self.predicted_kl) and self.file_kl > MAX_OVER_PREDICTION * max(
            self.predicted_kl, 1e-4
        ):
            return False
        return self.preset_kl is None or self.file_kl <= self.preset_kl

    @property
    def sentence(self) -> str:
        """One sentence: what llama.cpp measured, and (when not ``ok``) why the file is no success and what
        to use instead (the command line's options)."""
        return self.verdict(
            instead=f"use --preset {self.preset} --method {BEST_METHOD} instead"
            if self.preset
            else "use a larger budget",
            keep="--keep-if-worse to keep it",
        )

    def verdict(self, *, instead: str, keep: str) -> str:
        """``sentence`` with each face's own advice: ``instead`` (what to use instead) and ``keep`` (how to
        keep the file anyway), shown only when the file is not ``ok``."""
        base = f"llama.cpp measures the file at KL {self.file_kl:.4f} on {self.tokens} held-out tokens"
        vs = "" if self.preset_kl is None else f" (llama.cpp's {self.preset}: {self.preset_kl:.4f})"
        if self.ok:
            return f"{base}{vs}, predicted {self.predicted_kl:.4f}."
        if not math.isfinite(self.file_kl):
            why = "which is not a number"
        elif self.preset_kl is not None and self.file_kl > self.preset_kl:
            why = f"above llama.cpp's {self.preset} ({self.preset_kl:.4f})"
        else:
            why = f"{self.file_kl / max(self.predicted_kl, 1e-4):.0f}× its prediction {self.predicted_kl:.4f}"
        return f"{base}, {why}: the plan is worse than it promised; {instead} (or {keep})."

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``export --json``)."""
        return {
            "file_kl": self.file_kl,
            "predicted_kl": self.predicted_kl,
            "tokens": self.tokens,
            "preset": self.preset,
            "preset_kl": self.preset_kl,
            "ok": self.ok,
            "seconds": round(self.seconds, 1),
            "sentence": self.sentence,
        }


def llama_kl(
    gguf: str | Path, model_dir: str | Path, text: str, *, max_tokens: int, ctx: Any = None, **kw: Any
) -> tuple[float, int]:
    """(mean KL of ``gguf`` against the original on ``text``'s first ``max_tokens`` tokens, tokens): the
    logits from llama.cpp in its child process, the original's from transformers (``verify_gguf``), layer by
    layer where loading it whole would take more than ``layerwise.WHOLE_LIMIT`` or the free RAM (an 8B in
    float32 is 33.6 GB; the 2-layer 8B fixture's budget export peaked at 9.6 GB here)."""
    reference = _layerwise_reference(Path(model_dir), max_tokens, str(kw.get("device", "cpu")), ctx)
    r = verify_gguf(gguf, model_dir, text=text, max_tokens=max_tokens, ctx=ctx, reference=reference, **kw)
    if r.mean_kl is None:
        raise EvaluationError("llama.cpp gave no next-token distribution to measure the file by.")
    return float(r.mean_kl), int(r.n_tokens)


def _layerwise_reference(
    folder: Path, n_tokens: int, device: str, ctx: Any
) -> Callable[[list[int]], Any] | None:
    """The original's logits of a token list, run layer by layer, where eval would run it so
    (``layerwise.original_in_layers``); else None (transformers loads it whole)."""
    if not original_in_layers(folder, n_tokens, device, "float32", "auto"):
        return None

    def logits(ids: list[int]) -> Any:
        orig = LayerwiseOriginal(folder, device=device, dtype="float32", n_ctx=len(ids), allow_pickle=False)
        out: dict[int, Any] = {}
        try:
            orig.load(ctx)
            orig.logits_of_chunks([ids], out.__setitem__, ctx=ctx)
        finally:
            orig.close()
        return out[0]

    return logits


def last_word(
    partial: str | Path,
    info: Any,
    *,
    predicted_kl: float,
    text: str,
    preset: str | None,
    imatrix: Any = None,
    max_tokens: int = LAST_WORD_TOKENS,
    measure: Callable[..., tuple[float, int]] = llama_kl,
    ctx: JobContext | None = None,
    extra_buffers: str = "auto",
) -> LastWord:
    """llama.cpp's KL of the file ``partial`` and of the preset ``preset`` (written beside it with ``imatrix``
    to a temporary file, as ``export --preset`` writes it, and deleted) on ``text``, against ``predicted_kl``."""
    ctx = ctx or null_context()
    t0 = time.monotonic()
    ctx.report(0, 3, "llama.cpp measures the file on held-out text")
    file_kl, n = measure(partial, info.path, text, max_tokens=max_tokens, extra_buffers=extra_buffers)
    preset_kl = None
    if preset is not None:
        ctx.report(1, 3, f"Writing llama.cpp's {preset} to compare")
        with tempfile.TemporaryDirectory(prefix="qs-lastword-", dir=Path(partial).parent) as tmp:
            out = Path(tmp) / f"{preset}.gguf"
            plan = plan_from_preset(info, preset, imatrix=imatrix is not None)
            # a rotated plan's preset is rotated too: the imatrix and the untied head are the rotated model's
            export_gguf(info.path, out, plan, imatrix=imatrix, ctx=ctx.muted(), rotation=rotation_of(info))
            ctx.report(2, 3, f"llama.cpp measures {preset}")
            preset_kl, _ = measure(out, info.path, text, max_tokens=max_tokens, extra_buffers=extra_buffers)
    ctx.report(3, 3, "Measured")
    return LastWord(file_kl, predicted_kl, n, preset, preset_kl, time.monotonic() - t0)


def last_word_of_plan(
    info: Any,
    types: Mapping[str, str],
    *,
    predicted_kl: float,
    text: str,
    preset: str | None,
    imatrix: Any = None,
    ctx: JobContext | None = None,
    measure: Callable[..., tuple[float, int]] | None = None,
) -> LastWord:
    """``last_word`` of a plan (HF name → qtype) not yet written: its file is written with ``imatrix`` to a
    temporary folder, measured by llama.cpp beside ``preset``, and deleted (the budget dialog's Measure)."""
    ctx = ctx or null_context()
    with tempfile.TemporaryDirectory(prefix="qs-plan-") as tmp:
        out = Path(tmp) / "plan.gguf"
        plan = plan_from_types(info, dict(types), name="budget plan")
        rot = rotation_of(info)  # a rotated view's plan (studio.core.model.rotate)
        export_gguf(info.path, out, plan, imatrix=imatrix, ctx=ctx.span(0.0, 0.4), rotation=rot)
        return last_word(
            out, info, predicted_kl=predicted_kl, text=text, preset=preset, imatrix=imatrix,
            measure=measure or llama_kl, ctx=ctx.span(0.4, 1.0),
        )  # fmt: skip


@dataclass(frozen=True)
class LastWordCheck:
    """What llama.cpp's last word on a budget plan's file needs: the model (``info``), the plan's predicted
    KL, the held-out text, the same-size preset (None: none fits the budget), the imatrix that preset is
    written with, and whether a file worse than promised is kept anyway (labelled)."""

    info: Any
    predicted_kl: float
    text: str
    preset: str | None
    imatrix: Any = None
    keep_if_worse: bool = False


class WorseThanPromisedError(StudioError):
    """llama.cpp measured a budget plan's file worse than promised: it is not written (``word`` says why)."""

    def __init__(self, word: LastWord) -> None:
        super().__init__(word.sentence)
        self.word = word


class LastWordGate:
    """An export's ``validate`` (called on the finished ``.partial`` before its rename) preceded by
    llama.cpp's last word: a file worse than promised raises ``WorseThanPromisedError`` (the writer then
    deletes the partial) unless ``check.keep_if_worse``; ``word`` holds the measurement afterwards. The one
    gate of ``export --budget`` and of the window's export of a budget plan."""

    def __init__(
        self,
        check: LastWordCheck,
        *,
        ctx: JobContext | None = None,
        validate: Callable[[Path], None] | None = None,
        extra_buffers: str = "auto",
        on_start: Callable[[], None] | None = None,
        measure: Callable[..., tuple[float, int]] | None = None,
    ) -> None:
        self.check, self.ctx, self.validate = check, ctx, validate
        self.extra_buffers, self.on_start, self.measure = extra_buffers, on_start, measure
        self.word: LastWord | None = None

    def __call__(self, partial: Path) -> None:
        """Measure ``partial`` beside the same-size preset; raise when it may not be renamed into place."""
        c = self.check
        if self.on_start is not None:
            self.on_start()
        self.word = last_word(
            partial,
            c.info,
            predicted_kl=c.predicted_kl,
            text=c.text,
            preset=c.preset,
            imatrix=c.imatrix,
            ctx=self.ctx,
            extra_buffers=self.extra_buffers,
            measure=self.measure or llama_kl,  # looked up here: tests replace llama.cpp at this seam
        )
        if not self.word.ok and not c.keep_if_worse:
            raise WorseThanPromisedError(self.word)
        if self.validate is not None:
            self.validate(partial)


__all__ = [
    "LAST_WORD_TOKENS",
    "MAX_OVER_PREDICTION",
    "LastWord",
    "LastWordCheck",
    "LastWordGate",
    "WorseThanPromisedError",
    "last_word",
    "last_word_of_plan",
    "llama_kl",
]
