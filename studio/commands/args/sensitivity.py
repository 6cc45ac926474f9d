"""The arguments of ``quant-studio-cli sensitivity``; its handler is in ``studio.commands.sensitivity``."""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options
from studio.commands.args._scan import add_scan_args


def register(subparsers: Any) -> None:
    """Add the ``sensitivity`` subcommand."""
    p = subparsers.add_parser(
        "sensitivity",
        help="per-tensor sensitivity: the KL when only one tensor is quantized, per candidate type",
        description=(
            "For every quantizable tensor and candidate type, the KL divergence of the next-token "
            "distributions from the original's on a few calibration chunks when only that tensor is "
            "quantized (llama.cpp's search weighted by the calibration text's imatrix). The default proxy "
            "measures a sample of tensors and predicts the rest from their imatrix-weighted quantization "
            "error; --exact measures every pair. Scans are cached."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="model folder (or cached Hub id)")
    add_scan_args(p)
    p.add_argument("-o", "--output", metavar="SCAN.json", help="also write the scan to this file")
    p.add_argument(
        "--top",
        type=numbers.LISTED,
        default=12,
        metavar="N",
        help="most sensitive tensors to list (default 12)",
    )
    options.add_rotate(p)
    options.add_json(p)
    p.set_defaults(handler="studio.commands.sensitivity:run")
