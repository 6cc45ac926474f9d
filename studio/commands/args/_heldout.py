"""The held-out judgement's and the calibration mix's options, shared by ``plan`` and ``export``."""

from __future__ import annotations

import argparse


def add_heldout_args(p: argparse.ArgumentParser) -> None:
    """``--heldout-text``, ``--no-heldout`` and ``--calib-only`` (awq+gptq on the user's text alone)."""
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
    p.add_argument(
        "--calib-only",
        action="store_true",
        help=(
            "gptq, awq+gptq (best): calibrate on --calib-text alone (default: your text followed by the built-in "
            "mix of prose, chats, code and languages, which held better on other kinds of text)"
        ),
    )
