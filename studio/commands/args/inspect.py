"""The arguments of ``quant-studio-cli inspect``; its handler is in ``studio.commands.inspect``."""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def register(subparsers: Any) -> None:
    """Add the ``inspect`` subcommand."""
    p = subparsers.add_parser(
        "inspect",
        help="list a model's tensors and estimate file size and memory per preset",
        description=(
            "Open a model (a Hugging Face folder, a Hub id already in the local cache, a .safetensors "
            "or .gguf file) without loading its weights; print its architecture, layers, parameters, "
            "tensors per role and, for each preset, the GGUF file size, the memory to run it and "
            "whether that fits this machine."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="model folder, .safetensors/.gguf file, or cached Hub id")
    p.add_argument(
        "--ctx",
        type=numbers.CTX,
        default=4096,
        metavar="N",
        help="context length for the KV cache (default 4096)",
    )
    options.add_json(p)
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="open a pickle pytorch_model.bin (loaded with torch.load(weights_only=True))",
    )
    p.set_defaults(handler="studio.commands.inspect:run")
