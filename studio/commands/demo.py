"""``quant-studio-cli demo``: prepare the demo model (SmolLM2-135M-Instruct) once and print where it is."""

from __future__ import annotations

import argparse

from studio.commands._common import ProgressLine, print_json
from studio.core.demo import DEMO_NAME, DEMO_QUESTION, DEMO_TENSOR, demo_model_path, demo_source
from studio.core.jobs import JobContext


def run(args: argparse.Namespace) -> int:
    """Handler of ``demo``."""
    with ProgressLine() as line:
        path = demo_model_path(ctx=JobContext(on_progress=line.fraction, min_interval=0.2))
    try:
        src = demo_source()
        source, version = str(src.path), src.version
    except Exception:  # noqa: BLE001 - the prepared folder works without its package
        source, version = None, None
    if args.json:
        print_json(
            {
                "path": str(path),
                "name": DEMO_NAME,
                "source": source,
                "package_version": version,
                "question": DEMO_QUESTION,
                "tensor": DEMO_TENSOR,
            }
        )
    else:
        print(path)
    return 0
