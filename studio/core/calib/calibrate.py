"""``calibrate``: text → tokens → the layer runner with the activation collector → ``ActivationStats``.

The result is cached in a ``StatsCache`` (the weight statistics' cache) under the model's files and
the text's digest, context, chunk count and precision, so the inspector, the imatrix and the LLM.int8()
analysis reuse one run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.calib.collect import ActivationCollector, ActivationStats
from studio.core.calib.data import (
    BUILTIN,
    CalibrationText,
    ChatFormat,
    Chunks,
    bos_of,
    chunk_ids,
    load_calibration,
    make_chunks,
)
from studio.core.calib.runner import Consumer, run_model
from studio.core.errors import CalibrationError
from studio.core.jobs import JobContext, null_context
from studio.core.model import open_model
from studio.core.model.rotate import Rotation, rotated, rotation_key
from studio.core.modelinfo import CheckpointFormat
from studio.core.stats.cache import checkpoint_key


@dataclass(frozen=True)
class CalibrationInput:
    """A tokenized calibration text for one model."""

    data: CalibrationText
    chunks: Chunks
    warnings: tuple[str, ...] = ()


def load_tokenizer(model_dir: str | os.PathLike[str]) -> Any:
    """The model's transformers tokenizer (never running code from the model's folder)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - one sentence whatever transformers raised
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CalibrationError(f"The tokenizer of {Path(model_dir).name} cannot be loaded: {first}") from None


def prepare_input(
    model_dir: str | os.PathLike[str],
    text: str | os.PathLike[str] | CalibrationText = BUILTIN,
    *,
    n_ctx: int = 512,
    n_chunks: int | None = None,
    tokenizer: Any = None,
    ctx: JobContext | None = None,
) -> CalibrationInput:
    """Load the calibration text for ``model_dir`` and cut it into chunks (one sentence on bad input)."""
    tok = tokenizer or load_tokenizer(model_dir)
    fmt = ChatFormat.of_tokenizer(tok, Path(model_dir).name)
    data = text if isinstance(text, CalibrationText) else load_calibration(text, fmt, ctx)
    warnings: tuple[str, ...] = data.warnings
    if fmt.template is None and data.parse_special:
        warnings = (
            *warnings,
            f"{Path(model_dir).name} has no chat template; dialogues are calibrated as plain 'Role: text' lines.",
        )
    ids = chunk_ids(tok, data, n_ctx)
    return CalibrationInput(data, make_chunks(ids, n_ctx, n_chunks, bos_of(tok), data.name), warnings)


def _open(model: str | os.PathLike[str], allow_pickle: bool, rotation: Rotation | None = None) -> Any:
    ckpt = open_model(model, allow_pickle=allow_pickle)
    if ckpt.info.format == CheckpointFormat.GGUF:
        ckpt.close()
        raise CalibrationError(
            f"{Path(str(model)).name} is a GGUF file; calibration runs the original Hugging Face model "
            "(a folder with config.json and .safetensors weights)."
        )
    try:  # a rotated model is calibrated as it will be written (studio.core.model.rotate)
        return rotated(ckpt, rotation)
    except BaseException:
        ckpt.close()
        raise


def calibrate(
    model: str | os.PathLike[str],
    text: str | os.PathLike[str] | CalibrationText = BUILTIN,
    *,
    n_ctx: int = 512,
    n_chunks: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    process_output: bool = False,
    histogram: bool = True,
    consumers: Sequence[Consumer] = (),
    collector: ActivationCollector | None = None,
    cache: Any = None,
    allow_pickle: bool = False,
    mode: str = "auto",
    ctx: JobContext | None = None,
    executor: Any = None,
    rotation: Rotation | None = None,
) -> ActivationStats:
    """Run ``text`` (``"builtin"``, a text file, a ``.jsonl`` of chats or a ``CalibrationText``) through
    ``model`` and return what entered each linear layer.

    Extra ``consumers`` (an LLM.int8() analysis, GPTQ, ...) ride along on the same run, after the
    ``collector`` (give your own to configure it or to hand it to them); a run with extra consumers is
    never served from ``cache``. ``executor`` (``studio.core.executor``): a distributed one runs the
    chunks as units on a cluster (``studio.core.cluster.calibrate``), with the same statistics; a run
    with extra consumers or Hessians stays in this process (they need every activation here).
    ``rotation``: calibrate the model as ``export --rotate`` writes it (``studio.core.model.rotate``).
    """
    ctx = ctx or null_context()
    ckpt = _open(model, allow_pickle, rotation)
    try:
        info = ckpt.info
        ctx.report(0, 1, "Tokenizing the calibration text")
        inp = prepare_input(info.path, text, n_ctx=n_ctx, n_chunks=n_chunks, ctx=ctx)
        if collector is None:
            collector = ActivationCollector(histogram=histogram)
        collector.dataset = inp.data.name
        collector.wants_head = bool(process_output)

        def run() -> ActivationStats:
            if (
                executor is not None
                and executor.distributed
                and not consumers
                and collector.hessian_for is None
                and rotation is None  # the workers open the model by its path, unrotated
            ):
                on_cluster = executor.job("calibrate")  # studio.core.cluster.calibrate
                return on_cluster(
                    executor, str(info.path), inp, histogram=collector.histogram, process_output=process_output,
                    device=device, dtype=dtype, mode=mode, ctx=ctx,
                )  # fmt: skip
            run_info = run_model(
                ckpt, inp.chunks, [collector, *consumers], device=device, dtype=dtype, ctx=ctx, mode=mode
            )
            return collector.result(run_info, inp.warnings)

        if cache is None or consumers:
            return run()

        variant = (
            f"calib:{inp.data.digest}:{inp.chunks.n_ctx}:{inp.chunks.n_chunks}:{device}:{dtype}:"
            f"{int(process_output)}:{int(histogram)}"
            + (f":rot{rotation_key(rotation)['rotation']}" if rotation is not None else "")
        )
        return cache.get_or_compute(checkpoint_key(info, variant), run, ctx)
    finally:
        ckpt.close()


__all__ = ["CalibrationInput", "calibrate", "load_tokenizer", "prepare_input"]
