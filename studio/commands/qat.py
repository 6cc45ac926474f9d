"""``quant-studio-cli qat MODEL --bits B --steps N --text TRAIN``: QAT with a straight-through estimator against PTQ."""

from __future__ import annotations

import argparse
from typing import Any

from studio.commands import _options as options
from studio.commands._common import ProgressLine, print_json
from studio.core.errors import StudioError
from studio.core.jobs import JobContext


def _group(text: str) -> int | None:
    if text.lower() in ("channel", "0"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a group size or 'channel', not {text!r}") from None


def register(subparsers: Any) -> None:
    """Add the ``qat`` subcommand."""
    p = subparsers.add_parser(
        "qat",
        help="quantization-aware training (straight-through estimator) against plain PTQ",
        description=(
            "Fake-quantize every linear layer of the model (INT of --bits, one scale and zero point per "
            "--group inputs) in the forward pass, pass gradients straight through the rounding, fine-tune "
            "--steps steps on the --text, and report the loss on --eval-text of the float model, of the "
            "model rounded without training (PTQ) and after QAT. -o writes the QAT weights as a model "
            "folder that quant-studio-cli export takes."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="a Hugging Face model folder")
    p.add_argument("--bits", type=int, required=True, metavar="B", help="bits per weight code (2 to 8)")
    p.add_argument(
        "--group",
        type=_group,
        default=32,
        metavar="G",
        help="inputs per scale (default 32; 'channel': one per row)",
    )
    p.add_argument("--symmetric", action="store_true", help="symmetric codes (no zero point)")
    p.add_argument("--steps", type=int, required=True, metavar="N", help="fine-tuning steps")
    p.add_argument("--text", required=True, metavar="TRAIN", help="UTF-8 text to fine-tune on")
    p.add_argument(
        "--eval-text",
        default="sample",
        metavar="EVAL",
        help="text to measure on (default: the built-in sample)",
    )
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    p.add_argument(
        "--seq-len", type=int, default=256, metavar="N", help="tokens per training chunk (default 256)"
    )
    p.add_argument("--batch", type=int, default=1, metavar="N", help="chunks per step (default 1)")
    p.add_argument("--eval-chunks", type=int, default=8, metavar="N", help="evaluation chunks (default 8)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, mps or auto")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for torch (default: torch's choice)",
    )
    p.add_argument("-o", "--output", metavar="OUTDIR", help="write the QAT model folder here")
    options.add_json(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``qat``."""
    from studio.core.lab.qat import run_qat

    if args.group is not None and args.group < 1:
        raise StudioError(f"--group must be a positive number of values, not {args.group}.")
    if args.threads is not None:
        if args.threads < 1:
            raise StudioError(f"--threads must be at least 1, not {args.threads}.")
        import torch

        torch.set_num_threads(args.threads)  # this process only runs this job: the CLI may set it
    with ProgressLine() as line:
        r = run_qat(
            args.model,
            args.text,
            eval_text=args.eval_text,
            bits=args.bits,
            group=args.group,
            symmetric=args.symmetric,
            steps=args.steps,
            lr=args.lr,
            seq_len=args.seq_len,
            batch=args.batch,
            max_eval_chunks=args.eval_chunks,
            device=args.device,
            output=args.output,
            ctx=JobContext(on_progress=line.fraction, on_log=line.log),
        )
    if args.json:
        print_json(r.to_dict(), indent=None)
        return 0
    grid = f"INT{r.bits} {'sym' if r.symmetric else 'asym'} " + (f"g{r.group}" if r.group else "per-channel")
    print(
        f"{grid} on {r.quantized_tensors} linear layers ({r.quantized_params:,} weights); {r.steps} steps on "
        f"{r.train_text}, measured on {r.eval_text} ({r.eval_tokens} tokens)"
    )
    for label, loss in (
        ("float", r.float_loss),
        ("PTQ", r.ptq_loss),
        ("QAT", r.qat_loss),
        ("fine-tuned, not rounded", r.finetuned_float_loss),
    ):
        print(f"  {label:<24} loss {loss:.4f}")
    rss = f", peak memory {r.peak_rss_bytes / 1e9:.2f} GB" if r.peak_rss_bytes else ""
    print(f"Training {r.train_seconds:.1f} s on {r.device} ({r.seconds:.1f} s in all){rss}")
    if r.output:
        print(f"QAT model written to {r.output}")
    return 0
