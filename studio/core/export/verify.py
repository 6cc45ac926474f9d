"""Check an exported GGUF against the original: same token ids through llama.cpp (in a child
process through ``LlamaRunner``, F32 KV cache) and through transformers (float32), then top-1
agreement and mean KL (causal LMs) or the cosine of per-token hidden states (encoders).

A quick check: one chunk of ``max_tokens`` tokens of Evaluate's sample text by default, scored by the
definitions Evaluate uses (``studio.core.quality``: second half of the chunk, KL(original ‖ GGUF) in
nats per token, same top token, perplexity of both for the one verdict rule); ``measured_on`` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import EvaluationError, StudioError
from studio.core.gguf.read import read_gguf
from studio.core.jobs import JobContext, null_context
from studio.core.llamacpp import LlamaRunner, LoadOptions
from studio.core.model.hf_progress import no_hf_progress_bars
from studio.core.quality import Comparison, MeasuredOn, compare_chunk, scored_positions
from studio.paths import resource_path

SAMPLE_NAME = "sample (resources/eval/sample_en.txt)"  # Evaluate's default text, so numbers compare


@dataclass(frozen=True)
class VerifyResult:
    """How close the GGUF's outputs are to the original model's on the same tokens."""

    n_tokens: int
    top1_agreement: float | None  # fraction of positions with the same arg-max token (causal LMs)
    mean_kl: float | None  # mean KL(original ‖ gguf) over positions, in nats (causal LMs)
    max_abs_diff: float  # largest |logit| (or hidden-state) difference
    value_range: float  # range of the original's logits (or hidden states)
    mean_cosine: float | None = None  # encoders: mean cosine similarity of per-token hidden states
    notes: tuple[
        str, ...
    ] = ()  # how llama.cpp ran, when the user should know (a restart without extra buffers)
    comparison: Comparison | None = None  # causal LMs: same top token, KL, both perplexities
    measured_on: MeasuredOn | None = None  # the text, scored tokens and context; a quick check

    @property
    def relative_max_diff(self) -> float:
        """max_abs_diff divided by the value range."""
        return self.max_abs_diff / self.value_range if self.value_range else float("inf")


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare_logits(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float, float]:
    """(top-1 agreement, mean KL(ref‖got), max |diff|, range of ref) of two (n, vocab) arrays.

    Agreement and KL are over the scored rows (the second half, as Evaluate scores a chunk); the
    largest difference is over every row (a bit-exactness check).
    """
    if ref.shape != got.shape:
        raise EvaluationError(f"Logit shapes differ: original {ref.shape}, GGUF {got.shape}.")
    sl = scored_positions(len(ref))
    if sl.stop - sl.start < 1:
        sl = slice(0, len(ref))
    lp, lq = _log_softmax(ref[sl]), _log_softmax(got[sl])
    kl = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
    top1 = float((ref[sl].argmax(-1) == got[sl].argmax(-1)).mean())
    return top1, kl, float(np.abs(ref - got).max()), float(ref.max() - ref.min())


def default_text() -> str:
    """The start of Evaluate's sample text (enough for ``max_tokens`` of any tokenizer)."""
    with open(resource_path("eval", "sample_en.txt"), encoding="utf-8") as f:
        return f.read(8192)


def causal_result(
    ids: list[int], ref: np.ndarray, got: np.ndarray, notes: tuple[str, ...], text_name: str
) -> VerifyResult:
    """The ``VerifyResult`` of a causal LM's logits on ``ids``, with its comparison and what it was on."""
    top1, kl, mx, rng = compare_logits(ref, got)
    c = compare_chunk(ref, got, ids)
    on = MeasuredOn(text_name, c.n_scored, len(ids), 1, quick=True)
    return VerifyResult(len(ids), top1, kl, mx, rng, notes=notes, comparison=c, measured_on=on)


def check_verifiable(checkpoint_path: str | Path) -> None:
    """Raise an EvaluationError when the original cannot be run safely here: transformers would
    unpickle a ``pytorch_model.bin`` in this process, which the studio only does in a child."""
    p = Path(checkpoint_path)
    folder = p if p.is_dir() else p.parent
    if p.suffix.lower() == ".gguf":  # a GGUF original runs in llama.cpp (requantize.verify_against_gguf)
        return
    if p.suffix == ".safetensors" or any(folder.glob("*.safetensors")):
        return
    raise EvaluationError(
        f"{folder} holds only pickle weights; verification runs the original with transformers in this "
        "process, which would unpickle them. Export without verification, or save the model as "
        "safetensors first."
    )


def verify_gguf(
    gguf_path: str | Path,
    checkpoint_path: str | Path,
    *,
    device: str = "cpu",
    text: str | None = None,
    max_tokens: int = 128,
    ctx: JobContext | None = None,
    extra_buffers: str = "auto",
    reference: Callable[[list[int]], Any] | None = None,
) -> VerifyResult:
    """Run the same token ids through the GGUF (llama.cpp, child process) and the original model.

    ``extra_buffers`` (auto/on/off) is llama.cpp's weight repacking, see ``studio.core.llamacpp``.
    ``reference``: the original's logits (tokens × vocabulary) of a causal model's ids, where transformers
    should not load it whole (the caller runs it layer by layer); None: transformers, whole.
    """
    ctx = ctx or null_context()
    text_name = "the given text" if text else SAMPLE_NAME
    text = text or default_text()
    folder = Path(checkpoint_path)
    if folder.suffix.lower() == ".gguf":
        return verify_against_gguf(
            gguf_path,
            folder,
            text=text,
            max_tokens=max_tokens,
            ctx=ctx,
            extra_buffers=extra_buffers,
            text_name=text_name,
        )
    check_verifiable(folder)
    if not folder.is_dir():  # a single .safetensors file: transformers wants its folder
        folder = folder.parent
    read_gguf(gguf_path)  # bounded header check before llama.cpp sees the file
    try:
        import torch
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:  # pragma: no cover - dependencies
        raise EvaluationError(f"Verification needs torch and transformers ({err}).") from None
    ctx.report(0, 3, "Loading the original model")
    try:
        cfg = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise EvaluationError(f"transformers could not read the config of {folder}: {err}") from None
    is_encoder = cfg.model_type == "bert"
    base = LoadOptions(extra_buffers=extra_buffers)
    with LlamaRunner(label="llama.cpp (verification)", on_note=ctx.log) as wk:
        ctx.check_cancelled()
        if is_encoder:
            wk.load(gguf_path, base.replace(embedding=True, n_ctx=max(64, max_tokens + 8)))
            r = wk.request("embed", text=text)
            ids, got = r["ids"][:max_tokens], np.asarray(r["embeddings"], dtype=np.float32)[:max_tokens]
        else:
            try:
                tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
            except (OSError, ValueError) as err:
                raise EvaluationError(
                    f"transformers could not load the tokenizer of {folder}: {err}"
                ) from None
            ids = list(tok(text)["input_ids"])[:max_tokens]
            if len(ids) < 2:
                raise EvaluationError("The verification text is too short after tokenization.")
            wk.load(gguf_path, base.replace(logits_all=True, n_ctx=max(64, len(ids) + 8)))
            ctx.report(1, 3, "Running llama.cpp")
            got = np.asarray(wk.request("eval_logits", ids=ids), dtype=np.float32)
        notes = wk.notes
    ctx.check_cancelled()
    ctx.report(2, 3, "Running transformers")
    if reference is not None and not is_encoder:
        ref = np.asarray(reference(list(ids)), dtype=np.float32)
        ctx.report(3, 3, "Compared")
        return causal_result(list(ids), ref, got, tuple(notes), text_name)
    try:
        cls = AutoModel if is_encoder else AutoModelForCausalLM
        kw = {"attn_implementation": "eager"} if cfg.model_type in ("gemma2",) else {}
        with no_hf_progress_bars():
            model = cls.from_pretrained(str(folder), dtype=torch.float32, trust_remote_code=False, **kw)
        model = model.to(device)
        model.eval()
        with torch.no_grad():
            out = model(torch.tensor([ids], device=device))
        ref = (out.last_hidden_state if is_encoder else out.logits)[0].float().cpu().numpy()
    except StudioError:
        raise
    except Exception as err:
        raise EvaluationError(f"transformers could not run {folder}: {err}") from err
    ctx.report(3, 3, "Compared")
    if is_encoder:
        if ref.shape != got.shape:
            raise EvaluationError(f"Hidden-state shapes differ: original {ref.shape}, GGUF {got.shape}.")
        cos = (ref * got).sum(-1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(got, axis=-1) + 1e-12)
        return VerifyResult(
            len(ids),
            None,
            None,
            float(np.abs(ref - got).max()),
            float(ref.max() - ref.min()),
            float(cos.mean()),
            notes,
        )
    return causal_result(list(ids), ref, got, tuple(notes), text_name)


def verify_against_gguf(
    gguf_path: str | Path,
    source: str | Path,
    *,
    text: str,
    max_tokens: int = 128,
    ctx: JobContext | None = None,
    extra_buffers: str = "auto",
    text_name: str = "the given text",
) -> Any:
    """Run the same token ids through the requantized file and its GGUF source (both in llama.cpp,
    F32 KV cache) and compare the logits; returns ``verify.VerifyResult``."""
    ctx = ctx or null_context()
    read_gguf(gguf_path)
    read_gguf(source)
    ctx.report(0, 3, "Running the GGUF original in llama.cpp")
    opts = LoadOptions(extra_buffers=extra_buffers, logits_all=True, n_ctx=max(64, max_tokens + 8))
    with LlamaRunner(label="llama.cpp (verification)", on_note=ctx.log) as wk:
        wk.load(source, opts)
        ids = list(wk.request("tokenize", text=text, add_bos=True))[:max_tokens]
        if len(ids) < 2:
            raise EvaluationError("The verification text is too short after tokenization.")
        ref = np.asarray(wk.request("eval_logits", ids=ids), dtype=np.float32)
        ctx.check_cancelled()
        ctx.report(1, 3, "Running the export in llama.cpp")
        wk.load(gguf_path, opts)
        got = np.asarray(wk.request("eval_logits", ids=ids), dtype=np.float32)
        notes = wk.notes
    ctx.report(3, 3, "Compared")
    return causal_result(list(ids), ref, got, tuple(notes), text_name)
