"""The scan's and the budget's options that ``sensitivity``, ``plan`` and ``export`` share (their use:
``studio.commands._scan``)."""

from __future__ import annotations

import argparse

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def add_scan_args(p: argparse.ArgumentParser, *, calib_text: bool = True) -> None:
    """The scan's options (candidates, mode, chunks, cache)."""
    if calib_text:
        p.add_argument(
            "--calib-text",
            metavar="FILE",
            help="calibration text (UTF-8, or a .jsonl of chats; default: the built-in text)",
        )
        p.add_argument(
            "--calib-ctx",
            type=numbers.CTX,
            default=512,
            metavar="N",
            help="tokens per calibration chunk (default 512)",
        )
        p.add_argument(
            "--calib-chunks",
            type=numbers.CHUNKS,
            default=None,
            metavar="N",
            help="use the first N chunks (default all)",
        )
        p.add_argument(
            "--device",
            default="cpu",
            choices=("cpu", "cuda", "mps"),
            help="where the calibration and the scan run (default cpu)",
        )
    p.add_argument(
        "--types",
        metavar="T,T,...",
        help="candidate qtypes (default: Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,Q8_0,IQ4_XS,IQ4_NL,Q4_0,Q4_1,Q5_0,Q5_1)",
    )
    p.add_argument("--exact", action="store_true", help="measure every (tensor, type) instead of the proxy")
    p.add_argument(
        "--scan-ctx", type=numbers.CTX, default=128, metavar="N", help="tokens per scan chunk (default 128)"
    )
    p.add_argument(
        "--scan-chunks", type=numbers.CHUNKS, default=2, metavar="N", help="scan chunks (default 2)"
    )
    p.add_argument(
        "--scan", metavar="SCAN.json", help="use a scan saved by sensitivity -o instead of scanning"
    )
    p.add_argument(
        "--scan-also",
        action="append",
        metavar="FILE",
        help=(
            "also measure the scan on this text (builtin: the studio's mixed text), so the plan fits more than one "
            "kind of text; the imatrix stays the calibration text's (repeatable)"
        ),
    )
    p.add_argument("--no-cache", action="store_true", help="scan again even when a cached scan matches")
    options.add_cluster(p)


def add_budget_args(p: argparse.ArgumentParser) -> None:
    """The budget plan's options beside ``--budget``."""
    p.add_argument(
        "--ctx",
        type=numbers.CTX,
        default=4096,
        metavar="N",
        help="context a memory budget (vram=…, gpu) is sized for",
    )
    p.add_argument(
        "--exclude",
        metavar="T,T,...",
        help=(
            "qtypes the allocator may not choose, as a candidate or as another's fallback (e.g. Q4_1,Q5_1 on "
            "a model dequantized from a Q4_1 file)"
        ),
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="also measure the plan's KL on the scan chunks with every tensor quantized at once",
    )
