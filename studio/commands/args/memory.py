"""The arguments of ``quant-studio-cli memory``; its handler is in ``studio.commands.memory``."""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def register(subparsers: Any) -> None:
    """Add the ``memory`` subcommand."""
    p = subparsers.add_parser(
        "memory",
        help="memory calculator: weights, KV cache and overhead per precision, and which GPU it fits",
        description=(
            "For FP32, FP16/BF16, FP8, INT8/Q8_0, Q6_K, Q5_K_M, Q4_K_M, INT4/Q4_0, Q3_K_M and Q2_K: the "
            "weights, the KV cache at --ctx tokens in --kv-type, llama.cpp's overhead, the total, and "
            "whether it fits an 8, 12, 16, 24, 48 or 80 GB card and this machine. The model is a local "
            "folder or file, a Hub id (only its config.json and parameter count are fetched), or a "
            "shape given by --params, --layers, --kv-heads and --head-dim."
        ),
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="model folder or file, or a Hub id")
    p.add_argument("--params", type=numbers.PARAMS, metavar="N", help="parameters (e.g. 70.6e9)")
    p.add_argument("--layers", type=numbers.LAYERS, metavar="L", help="transformer layers")
    p.add_argument("--kv-heads", type=numbers.HEADS, metavar="H", help="key/value heads (GQA)")
    p.add_argument("--head-dim", type=numbers.HEAD_DIM, metavar="D", help="size of one attention head")
    p.add_argument(
        "--vocab",
        type=numbers.VOCAB,
        default=0,
        metavar="V",
        help="vocabulary size (logits buffer; default 0)",
    )
    p.add_argument(
        "--ctx", type=numbers.CTX, required=True, metavar="N", help="context length in tokens (2K to 128K)"
    )
    # studio.core.llamacpp.kvcache.KV_TYPES (tests/cli/test_dispatch.py checks); importing it loads gguf-py
    kv_types = ("f32", "f16", "q8_0", "q4_0")
    p.add_argument("--kv-type", default="f16", choices=kv_types, help="KV-cache type (default f16)")
    options.add_json(p, "one JSON object instead of a table")
    p.set_defaults(handler="studio.commands.memory:run")
