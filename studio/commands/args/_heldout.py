"""The held-out judgement's options, shared by ``plan --budget`` and ``export --budget``."""

from __future__ import annotations

import argparse


def add_heldout_args(p: argparse.ArgumentParser) -> None:
    """``--heldout-text`` and ``--no-heldout``."""
    p.add_argument(
        "--heldout-text",
        metavar="FILE",
        help=(
            "judge the plan on this text (best of another kind than the calibration text) against llama.cpp's "
            "preset of the same size; default: the last quarter of the calibration text, kept from the "
            "imatrix and the scan"
        ),
    )
    p.add_argument(
        "--no-heldout",
        action="store_true",
        help="calibrate and scan on the whole calibration text and skip the held-out judgement",
    )
