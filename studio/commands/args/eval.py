"""The arguments of ``quant-studio-cli eval``; its handler is in ``studio.commands.eval``."""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def register(subparsers: Any) -> None:
    """Add the ``eval`` subcommand."""
    p = subparsers.add_parser(
        "eval",
        help="compare quantized GGUF variants with their original (perplexity, KL divergence, size)",
        description=(
            "Run the original model and every variant on the same tokens of a text, llama.cpp-style "
            "(chunks of --ctx tokens, second half of each chunk scored), and report perplexity, the KL "
            "divergence of each variant's next-token distribution from the original's (mean and 99th "
            "percentile), how often the top token agrees, and file size and bits per weight."
        ),
    )
    p.add_argument("--original", required=True, metavar="MODEL", help="the original model folder (or a GGUF)")
    p.add_argument(
        "--variant", action="append", default=[], metavar="A.gguf", help="a quantized GGUF (repeatable)"
    )
    p.add_argument(
        "--text",
        default="sample",
        metavar="FILE",
        help="a UTF-8 text file, 'sample' (built-in English prose, the default) or 'wikitext-2' (needs datasets)",
    )
    p.add_argument("--ctx", type=numbers.CTX, default=512, metavar="N", help="tokens per chunk (default 512)")
    p.add_argument(
        "--chunks", type=numbers.CHUNKS, default=None, metavar="N", help="evaluate at most N chunks"
    )
    p.add_argument("--device", default="auto", help="device for the original: auto, cpu, cuda, mps")
    options.add_dtype(p, "original's dtype")
    p.add_argument(
        "--original-mode",
        choices=("auto", "whole", "layers"),
        default="auto",
        help="how an original checkpoint runs: whole through transformers, or layers, one decoder layer in "
        "memory at a time (auto, the default: layers when whole would take over 4 GB or the free RAM)",
    )
    options.add_gpu_layers(p)
    options.add_dequantize(p, "--original")
    options.add_allow_pickle(p)
    options.add_extra_buffers(p, "the GGUF files")
    p.add_argument(
        "--kv-type",
        action="append",
        default=[],
        choices=("f32", "f16", "q8_0", "q4_0"),
        help="llama.cpp KV-cache type for the variants (repeatable: each variant runs once per type; "
        "default f32, exact); q8_0 and q4_0 run with flash attention",
    )
    options.add_cluster(p)
    options.add_json(p, "one JSON object instead of a table")
    p.set_defaults(handler="studio.commands.eval:run")
