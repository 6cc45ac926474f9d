"""The arguments of ``quant-studio-cli qat``; its handler is in ``studio.commands.qat``."""

from __future__ import annotations

import argparse
from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def _group(text: str) -> int | None:
    if text.lower() in ("channel", "0"):
        return None
    try:
        return numbers.Whole(1, 65_536)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"a group size (1 to 65,536) or 'channel', not {text[:30]!r}"
        ) from None


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
    p.add_argument(
        "--bits", type=numbers.BITS, required=True, metavar="B", help="bits per weight code (2 to 8)"
    )
    p.add_argument(
        "--group",
        type=_group,
        default=32,
        metavar="G",
        help="inputs per scale (default 32; 'channel': one per row)",
    )
    p.add_argument("--symmetric", action="store_true", help="symmetric codes (no zero point)")
    p.add_argument("--steps", type=numbers.STEPS, required=True, metavar="N", help="fine-tuning steps")
    p.add_argument("--text", required=True, metavar="TRAIN", help="UTF-8 text to fine-tune on")
    p.add_argument(
        "--eval-text",
        default="sample",
        metavar="EVAL",
        help="text to measure on (default: the built-in sample)",
    )
    p.add_argument(
        "--lr", type=numbers.LEARNING_RATE, default=1e-4, help="AdamW learning rate (default 1e-4)"
    )
    p.add_argument(
        "--seq-len",
        type=numbers.CTX,
        default=256,
        metavar="N",
        help="tokens per training chunk (default 256)",
    )
    p.add_argument("--batch", type=numbers.BATCH, default=1, metavar="N", help="chunks per step (default 1)")
    p.add_argument(
        "--eval-chunks", type=numbers.CHUNKS, default=8, metavar="N", help="evaluation chunks (default 8)"
    )
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, mps or auto")
    p.add_argument(
        "--threads",
        type=numbers.THREADS,
        default=None,
        metavar="N",
        help="CPU threads for torch (default: torch's choice)",
    )
    p.add_argument("-o", "--output", metavar="OUTDIR", help="write the QAT model folder here")
    options.add_json(p)
    p.set_defaults(handler="studio.commands.qat:run")
