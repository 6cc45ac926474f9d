"""The arguments of ``quant-studio-cli calibrate``; its handler is in ``studio.commands.calibrate``."""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def register(subparsers: Any) -> None:
    """Add the ``calibrate`` subcommand."""
    p = subparsers.add_parser(
        "calibrate",
        help="run calibration text through a model: imatrix, activation outliers, LLM.int8() analysis",
        description=(
            "Run a calibration text through the model layer by layer and write its importance matrix "
            "in llama.cpp's format (GGUF, or the legacy .dat with --format dat), as llama-imatrix does: "
            "the text is tokenized once and cut into chunks of --ctx tokens, every position counted. "
            "Also lists the activation outlier features. Without --text or --chat the built-in "
            "calibration text is used (prose, chats in the model's template, code, several languages)."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="model folder (or cached Hub id)")
    p.add_argument("-o", "--output", required=True, metavar="imatrix.gguf", help="the imatrix file to write")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", metavar="FILE", help="a UTF-8 text file")
    src.add_argument(
        "--chat", metavar="FILE.jsonl", help='JSON lines of {"messages": [{"role", "content"}, ...]}'
    )
    p.add_argument("--ctx", type=numbers.CTX, default=512, metavar="N", help="tokens per chunk (default 512)")
    p.add_argument(
        "--chunks",
        type=numbers.CHUNKS,
        default=None,
        metavar="N",
        help="use the first N chunks (default all)",
    )
    p.add_argument(
        "--format", choices=("gguf", "dat"), default=None, help="file format (default: from the suffix)"
    )
    p.add_argument(
        "--process-output",
        action="store_true",
        help="also collect output.weight (llama-imatrix --process-output)",
    )
    p.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda", "mps"), help="where to run (default auto)"
    )
    options.add_dtype(p, "compute precision")
    p.add_argument("--int8", action="store_true", help="also run the LLM.int8() analysis per layer")
    p.add_argument(
        "--top", type=numbers.LISTED, default=10, metavar="N", help="outlier features to list (default 10)"
    )
    options.add_allow_pickle(p)
    options.add_cluster(p)
    options.add_json(p)
    p.set_defaults(handler="studio.commands.calibrate:run")
