"""The arguments of ``quant-studio-cli sweep``; its handler is in ``studio.commands.sweep``."""

from __future__ import annotations

from typing import Any

from studio.commands import _options as options


def register(subparsers: Any) -> None:
    """Add the ``sweep`` subcommand."""
    p = subparsers.add_parser(
        "sweep",
        help="bit-width sweep of one tensor: SNR, MSE and cosine per bit width, granularity and GGUF type",
        description=(
            "Quantize one tensor to INT 2, 3, 4, 5, 6, 8 and 16 bits per tensor, per output channel and "
            "per group of 32, 64, 128 and 256 values, symmetric and asymmetric, then to FP8 and every GGUF "
            "type, and print MSE, SNR and cosine of each with its bits per weight. The cliff is where an "
            "INT series falls below 12 dB SNR."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="model folder, .safetensors/.gguf file, or cached Hub id")
    p.add_argument(
        "--tensor", required=True, metavar="NAME", help="the tensor (see quant-studio-cli inspect)"
    )
    options.add_json(p, "one JSON object instead of a table")
    p.set_defaults(handler="studio.commands.sweep:run")
