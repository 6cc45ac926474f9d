"""Quantization-aware training (QAT) with a straight-through estimator, against plain PTQ.

Every ``nn.Linear`` of the model except the output head is fake-quantized in the forward pass:
round-to-nearest INT of ``bits`` with one scale and zero point per ``group`` input values (the
sweep's ``INTb asym gG``, equal to ``studio.core.quant.generic.quantize_int``). In the backward pass
the straight-through estimator treats the rounding as the identity, so the float master weights
learn where to sit for their rounded values to work. Embeddings, norms and the head stay float and
frozen (as GPTQ/AWQ leave them), so only the weights that get quantized move.

``run_qat`` measures, on the evaluation text (which should differ from the training text):
  float loss  the model as it is;
  PTQ loss    its weights rounded, no training;
  QAT loss    rounded after ``steps`` steps of AdamW on the training text through the STE;
and, to tell adaptation to the text from adaptation to the grid, the fine-tuned weights unrounded.
Losses are mean next-token cross-entropy (nats per token) over chunks of ``seq_len`` tokens. The
model stays in eval mode (no dropout) and batches run in text order, so a run is deterministic.

Cost, measured on SmolLM2-135M-Instruct (float32, 210 linear layers, 106 M rounded weights) on one
CPU thread: 30 steps of 128 tokens plus four losses on 8 chunks took 114 s of CPU time and a peak of
3.7 GB resident (float32 weights, gradients and AdamW's two moments for the rounded layers).
3 bits, groups of 32: float 3.464, PTQ 4.310, QAT 3.902 nats per token on the held-out text.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from studio.core import safejson
from studio.core.chat.hf_backend import TransformersBackend
from studio.core.errors import QuantizationError, StudioError
from studio.core.evaluate.texts import EvalText, load_text
from studio.core.jobs import JobContext, null_context
from studio.core.model.hf_progress import no_hf_progress_bars
from studio.core.units import format_eta

__all__ = ["QatResult", "fake_quantize", "qat_in_child", "quantized_linears", "run_qat"]

QAT_INFO_NAME = "quant_studio_qat.json"
"""Side file written next to exported QAT weights: the settings and the losses."""


@dataclass(frozen=True)
class QatResult:
    """Losses before and after QAT, and what the run cost."""

    bits: int
    group: int | None  # None: one scale per output channel
    symmetric: bool
    steps: int
    lr: float
    seq_len: int
    batch: int
    train_text: str
    eval_text: str
    train_tokens: int
    eval_tokens: int  # tokens scored per loss
    float_loss: float
    ptq_loss: float
    qat_loss: float
    finetuned_float_loss: float  # the fine-tuned master weights, not rounded
    train_losses: tuple[float, ...]  # per step, on the fake-quantized model
    quantized_tensors: int
    quantized_params: int
    seconds: float
    train_seconds: float
    peak_rss_bytes: int | None  # of this process, when the OS tells
    device: str
    output: str | None = None

    @property
    def float_ppl(self) -> float:
        """Perplexity of the float model on the evaluation text."""
        return math.exp(self.float_loss)

    @property
    def ptq_ppl(self) -> float:
        """Perplexity after rounding without training."""
        return math.exp(self.ptq_loss)

    @property
    def qat_ppl(self) -> float:
        """Perplexity after QAT."""
        return math.exp(self.qat_loss)

    def to_dict(self) -> dict[str, Any]:
        """What ``qat --json`` prints."""
        d = asdict(self)
        d["train_losses"] = list(self.train_losses)
        d.update(float_ppl=self.float_ppl, ptq_ppl=self.ptq_ppl, qat_ppl=self.qat_ppl)
        return d


def fake_quantize(w: Any, bits: int, group: int | None = None, symmetric: bool = False) -> Any:
    """Round a (out, in) torch weight to INT ``bits`` per group of ``group`` inputs and dequantize.

    Same arithmetic as ``generic.quantize_int``: asymmetric over [min(w, 0), max(w, 0)] with an
    integer zero point, or symmetric with scale max|w| / (2^(b-1) - 1); an all-zero group keeps scale 1.
    """
    import torch

    out_f, in_f = w.shape
    g = w.reshape(out_f, 1, in_f) if group is None else w.reshape(out_f, in_f // group, group)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        amax = g.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        q = torch.clamp(torch.round(g / scale), -qmax - 1, qmax)
        return (q * scale).reshape(out_f, in_f)
    qmax = 2**bits - 1
    lo = torch.clamp(g.amin(dim=-1, keepdim=True), max=0)
    hi = torch.clamp(g.amax(dim=-1, keepdim=True), min=0)
    rng = hi - lo
    scale = torch.where(rng > 0, rng / qmax, torch.ones_like(rng))
    zp = torch.clamp(torch.round(-lo / scale), 0, qmax)
    q = torch.clamp(torch.round(g / scale) + zp, 0, qmax)
    return ((q - zp) * scale).reshape(out_f, in_f)


def _ste_module(bits: int, group: int | None, symmetric: bool) -> Any:
    import torch

    class STEQuant(torch.nn.Module):
        """A parametrization: the weight as rounded in the forward pass, the identity in the backward."""

        def __init__(self) -> None:
            super().__init__()
            self.enabled = True

        def forward(self, w: Any) -> Any:
            if not self.enabled:
                return w
            return w + (fake_quantize(w.detach(), bits, group, symmetric) - w.detach())

    return STEQuant()


def quantized_linears(model: Any, group: int | None) -> list[tuple[str, Any]]:
    """(name, module) of every ``nn.Linear`` QAT rounds: all but the output head; checks the group."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    if not out:
        raise QuantizationError(
            "This model has no linear layers QAT can round (GPT-2's Conv1D layers are not supported)."
        )
    if group is not None:
        bad = [n for n, m in out if m.in_features % group]
        if bad:
            widths = sorted({m.in_features for n, m in out if n in bad})
            raise QuantizationError(
                f"{len(bad)} layers (e.g. {bad[0]}) take {', '.join(map(str, widths))} inputs, not a "
                f"multiple of the group of {group}.",
                hint="Choose a group that divides every layer's input width (32 usually does).",
            )
    return out


def _chunks(ids: list[int], seq_len: int, what: str, name: str) -> list[list[int]]:
    n = len(ids) // seq_len
    if n < 1:
        raise StudioError(
            f"The {what} text {name} has {len(ids)} tokens, fewer than one chunk of {seq_len}.",
            hint="Use a longer text or a smaller --seq-len.",
        )
    return [ids[i * seq_len : (i + 1) * seq_len] for i in range(n)]


def _mean_loss(model: Any, chunks: list[list[int]], device: str, ctx: JobContext) -> float:
    import torch

    total = 0.0
    with torch.inference_mode():
        for c in chunks:
            ctx.check_cancelled()
            t = torch.tensor([c], device=device)
            total += float(model(input_ids=t, labels=t).loss)
    return total / len(chunks)  # equal-length chunks: the mean over every scored token


def _cancel_hooks(modules: list[Any], ctx: JobContext) -> list[Any]:
    """Hooks that check for Cancel at every quantized linear, forward and backward (a step of a real
    model takes seconds; checking only between steps made Cancel wait for the step)."""

    def check_grad(grad: Any) -> Any:
        ctx.check_cancelled()
        return grad

    def before(_m: Any, _args: Any) -> None:
        ctx.check_cancelled()

    def after(_m: Any, _args: Any, out: Any) -> None:
        if getattr(out, "requires_grad", False):
            out.register_hook(check_grad)

    return [m.register_forward_pre_hook(before) for m in modules] + [
        m.register_forward_hook(after) for m in modules
    ]


def _peak_rss() -> int | None:
    try:
        import resource  # POSIX only (absent on Windows): tried where used
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def _as_text(source: str | os.PathLike[str] | EvalText) -> EvalText:
    return source if isinstance(source, EvalText) else load_text(source)


def run_qat(
    model: str | os.PathLike[str],
    train_text: str | os.PathLike[str] | EvalText,
    *,
    eval_text: str | os.PathLike[str] | EvalText = "sample",
    bits: int = 3,
    group: int | None = 32,
    symmetric: bool = False,
    steps: int = 20,
    lr: float = 1e-4,
    seq_len: int = 256,
    batch: int = 1,
    max_eval_chunks: int = 8,
    device: str = "cpu",
    output: str | os.PathLike[str] | None = None,
    ctx: JobContext | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> QatResult:
    """Fine-tune ``model`` (a Hugging Face folder) through the STE and compare; see the module docstring.

    ``output``: a folder to write the QAT weights to (already rounded, in the model's dtype, with its
    config and tokenizer), which ``quant-studio-cli export`` then takes like any checkpoint.
    ``on_step(step, loss)`` is called after every training step (a live loss curve).
    """
    import torch
    from torch.nn.utils import parametrize

    ctx = ctx or null_context()
    t0 = time.monotonic()
    if not 2 <= bits <= 8:
        raise QuantizationError(f"QAT rounds to 2 to 8 bits, not {bits}.")
    if group is not None and group < 1:
        raise QuantizationError(f"The group must be a positive number of values, not {group}.")
    for what, v in (
        ("steps", steps),
        ("sequence length", seq_len),
        ("batch", batch),
        ("eval chunks", max_eval_chunks),
    ):
        if v < 1:
            raise StudioError(f"The number of {what} must be at least 1, not {v}.")
    if not (lr > 0 and math.isfinite(lr)):
        raise StudioError(f"The learning rate must be a positive number, not {lr}.")
    out_dir = Path(output).expanduser() if output is not None else None
    if out_dir is not None and out_dir.exists() and any(out_dir.iterdir()):
        raise StudioError(f"The output folder {out_dir} is not empty; choose a new one.")
    train, evalt = _as_text(train_text), _as_text(eval_text)

    ctx.report(0, 1, f"Loading {Path(model).name}")
    backend = TransformersBackend(model, device=device, dtype="float32", n_ctx=seq_len)
    backend.load(ctx)
    try:
        net, tok = backend.torch_model, backend.tokenizer
        dev = backend.device
        if backend.n_ctx < seq_len:
            raise StudioError(
                f"{Path(model).name} handles at most {backend.n_ctx} positions; use --seq-len {backend.n_ctx}."
            )
        train_chunks = _chunks(backend.tokenize(train.text), seq_len, "training", train.name)
        eval_chunks = _chunks(backend.tokenize(evalt.text), seq_len, "evaluation", evalt.name)[
            :max_eval_chunks
        ]
        layers = quantized_linears(net, group)
        hooks = _cancel_hooks([m for _, m in layers], ctx)  # Cancel within a layer, not after a whole step
        n_evals = 4
        total = steps + n_evals
        ctx.report(0, total, "float loss")
        float_loss = _mean_loss(net, eval_chunks, dev, ctx)

        for p in net.parameters():
            p.requires_grad_(False)
        ste = []
        for _, m in layers:
            parametrize.register_parametrization(m, "weight", _ste_module(bits, group, symmetric))
            ste.append(m.parametrizations.weight[0])
            m.parametrizations.weight.original.requires_grad_(True)
        ctx.report(1, total, "PTQ loss")
        t_eval = time.monotonic()
        ptq_loss = _mean_loss(net, eval_chunks, dev, ctx)
        eval_seconds = time.monotonic() - t_eval

        params = [m.parametrizations.weight.original for _, m in layers]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        train_losses: list[float] = []
        t_train = time.monotonic()
        for step in range(steps):
            ctx.check_cancelled()
            rows = [train_chunks[(step * batch + i) % len(train_chunks)] for i in range(batch)]
            ids = torch.tensor(rows, device=dev)
            loss = net(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            try:
                loss.backward()
            except Exception:
                ctx.check_cancelled()  # a Cancel raised inside autograd's hooks arrives as the job's cancel
                raise
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            train_losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(step + 1, train_losses[-1])
            per_step = (time.monotonic() - t_train) / (step + 1)
            left = per_step * (steps - step - 1) + 2 * eval_seconds  # the steps left, then two evaluations
            ctx.report(
                2 + step,
                total,
                f"QAT step {step + 1}/{steps}: loss {train_losses[-1]:.3f} · ETA {format_eta(left)}",
            )
        train_seconds = time.monotonic() - t_train
        del opt

        ctx.report(2 + steps, total, "QAT loss")
        qat_loss = _mean_loss(net, eval_chunks, dev, ctx)
        for s in ste:
            s.enabled = False
        tuned_loss = _mean_loss(net, eval_chunks, dev, ctx)
        for s in ste:
            s.enabled = True
        ctx.report(total, total, "QAT done")
        for h in hooks:
            h.remove()

        result = QatResult(
            bits=bits,
            group=group,
            symmetric=symmetric,
            steps=steps,
            lr=lr,
            seq_len=seq_len,
            batch=batch,
            train_text=train.name,
            eval_text=evalt.name,
            train_tokens=len(train_chunks) * seq_len,
            eval_tokens=len(eval_chunks) * (seq_len - 1),
            float_loss=float_loss,
            ptq_loss=ptq_loss,
            qat_loss=qat_loss,
            finetuned_float_loss=tuned_loss,
            train_losses=tuple(train_losses),
            quantized_tensors=len(layers),
            quantized_params=sum(m.weight.numel() for _, m in layers),
            seconds=time.monotonic() - t0,
            train_seconds=train_seconds,
            peak_rss_bytes=_peak_rss(),
            device=dev,
            output=str(out_dir) if out_dir is not None else None,
        )
        if out_dir is not None:
            with torch.no_grad():
                for _, m in layers:  # keep the rounded weights: what qat_loss measured
                    parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
            _save(net, tok, Path(model).expanduser(), out_dir, result)
        return result
    finally:
        backend.close()


def qat_in_child(ctx: JobContext, emit: Callable[[Any], None], **kwargs: Any) -> QatResult:
    """``run_qat`` as a ``studio.core.childjob.call_in_child`` target: each step emits ``(step, loss)``."""
    return run_qat(ctx=ctx, on_step=lambda step, loss: emit((step, loss)), **kwargs)


def _save(net: Any, tok: Any, src: Path, out_dir: Path, result: QatResult) -> None:
    """Write the model folder to ``out_dir`` through a ``.partial`` sibling, then rename."""
    import torch

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        cfg = safejson.loads((src / "config.json").read_bytes(), "config.json", ValueError)
        src_dtype = cfg.get("dtype") or cfg.get("torch_dtype")
        if src_dtype in ("float16", "bfloat16"):
            net = net.to(getattr(torch, src_dtype))

        with no_hf_progress_bars():
            net.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        (tmp / QAT_INFO_NAME).write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")
        if out_dir.exists():
            out_dir.rmdir()  # checked empty before the run
        os.replace(tmp, out_dir)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise StudioError(f"Cannot write the QAT model to {out_dir}: {err.strerror or err}.") from None
