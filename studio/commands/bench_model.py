"""``quant-studio-cli bench-model``: fetch the 1.5B bench model once and print where it is."""

from __future__ import annotations

import argparse

from studio.commands._common import ProgressLine, print_json
from studio.core.benchmodel import BENCH_ALIAS, BENCH_NAME, BENCH_SHA256, BENCH_SIZE, fetch_bench_model
from studio.core.jobs import JobContext


def run(args: argparse.Namespace) -> int:
    """Handler of ``bench-model``."""
    with ProgressLine() as line:
        path = fetch_bench_model(ctx=JobContext(on_progress=line.fraction, min_interval=0.2))
    if args.json:
        print_json(
            {
                "path": str(path),
                "name": BENCH_NAME,
                "alias": BENCH_ALIAS,
                "bytes": BENCH_SIZE,
                "sha256": BENCH_SHA256,
            }
        )
    else:
        print(path)
    return 0
