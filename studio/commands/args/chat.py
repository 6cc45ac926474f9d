"""The arguments of ``quant-studio-cli chat``; its handler is in ``studio.commands.chat``."""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def register(subparsers: Any) -> None:
    """Add the ``chat`` subcommand."""
    p = subparsers.add_parser(
        "chat",
        help="answer one prompt with a model (and compare it with others)",
        description=(
            "Render the prompt with each model's chat template (sandboxed), generate with the same "
            "sampling settings and seed in every model (greedy by default), and print each reply with "
            "its speed. A GGUF runs in llama.cpp (in a child process), a model folder in transformers."
        ),
    )
    p.add_argument("--model", required=True, metavar="A", help="a model folder or a GGUF file (the original)")
    p.add_argument(
        "--compare", action="append", default=[], metavar="B", help="another model to compare (repeatable)"
    )
    p.add_argument("--prompt", required=True, metavar="TEXT", help="the user message")
    p.add_argument("--system", default=None, metavar="TEXT", help="an optional system message")
    p.add_argument(
        "--max-tokens", type=numbers.TOKENS, default=128, metavar="N", help="tokens to generate (default 128)"
    )
    p.add_argument("--temperature", type=numbers.TEMPERATURE, default=0.0, help="0 (the default) is greedy")
    p.add_argument("--top-k", type=numbers.TOP_K, default=0, help="keep the K most likely tokens (0: all)")
    p.add_argument("--top-p", type=numbers.PROBABILITY, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--seed", type=numbers.SEED, default=0, help="random seed for sampling")
    p.add_argument("--ctx", type=numbers.CTX, default=2048, metavar="N", help="context window (default 2048)")
    p.add_argument("--device", default="auto", help="device for model folders: auto, cpu, cuda, mps")
    options.add_dtype(p)
    options.add_gpu_layers(p)
    p.add_argument("--truncate", action="store_true", help="keep only the end of a prompt that is too long")
    options.add_dequantize(p, "--model")
    options.add_allow_pickle(p)
    options.add_extra_buffers(p, "GGUF files")
    p.add_argument(
        "--kv-type",
        default=None,
        choices=("f32", "f16", "q8_0", "q4_0"),
        help="llama.cpp KV-cache type for GGUF models (default f32); q8_0 and q4_0 use flash attention",
    )
    options.add_json(p)
    p.set_defaults(handler="studio.commands.chat:run")
