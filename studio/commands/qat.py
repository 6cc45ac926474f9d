"""``quant-studio-cli qat MODEL --bits B --steps N --text TRAIN``: QAT with a straight-through estimator against PTQ."""

from __future__ import annotations

import argparse

from studio.commands._common import ProgressLine, print_json
from studio.core.errors import StudioError
from studio.core.jobs import JobContext
from studio.core.lab.qat import run_qat


def run(args: argparse.Namespace) -> int:
    """Handler of ``qat``."""
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
