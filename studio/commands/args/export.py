"""The arguments of ``quant-studio-cli export``; its handler is in ``studio.commands.export``."""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.commands import _options as options
from studio.commands.args._heldout import add_heldout_args
from studio.commands.args._scan import add_budget_args, add_scan_args


def register(subparsers: Any) -> None:
    """Add the ``export`` subcommand."""
    p = subparsers.add_parser(
        "export",
        help="export a model to GGUF with a preset or a per-tensor plan",
        description=(
            "Convert a Hugging Face model folder to a GGUF file that llama.cpp runs, quantizing each "
            "tensor as a preset (Q4_K_M, Q8_0, ...) or a saved plan says. A GGUF MODEL is requantized "
            "the way llama-quantize --allow-requantize does it (metadata, tokenizer and chat template "
            "copied; tensors already of their planned type copied unchanged). The file is written to "
            "OUT.partial and renamed only when complete and validated."
        ),
    )
    p.add_argument(
        "model", metavar="MODEL", help="model folder, cached Hub id, or a .gguf file (requantized)"
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.gguf", help="the GGUF file to write")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--preset", metavar="NAME", help="F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, Q3_K_M, Q2_K, ..."
    )
    src.add_argument("--plan", metavar="PLAN.json", help="a plan saved by Quant Studio")
    src.add_argument(
        "--budget",
        metavar="SIZE",
        help=(
            "choose per-tensor types from a sensitivity scan for a budget: bytes, 4.5GB, 4.8bpw, vram=8GB "
            "or gpu (method imatrix unless --method says otherwise)"
        ),
    )
    src.add_argument(
        "--uniform",
        metavar="TYPE",
        help="every quantizable tensor at TYPE (Q8_0 for INT8, Q4_K or Q4_0 for INT4)",
    )
    p.add_argument(
        "--keep-first-last",
        metavar="N:TYPE",
        help=(
            "first and last N layers (plus embeddings and output) at TYPE; every other layer at the "
            "--uniform type or the preset's main type (Q4_K for Q4_K_M)"
        ),
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="REGEX=TYPE",
        help="tensors whose name matches REGEX get TYPE (repeatable; first match wins)",
    )
    p.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda", "mps"), help="where to quantize (default cpu)"
    )
    p.add_argument(
        "--backend", default="studio", choices=("studio", "llama.cpp"), help="quantizer (default studio)"
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="compare the file with the original model before it gets its final name",
    )
    options.add_extra_buffers(p, "--verify")
    p.add_argument("--save-plan", metavar="PLAN.json", help="also write the plan used to this file")
    p.add_argument(
        "--imatrix",
        metavar="FILE",
        help="importance matrix (llama.cpp's GGUF or legacy .dat format, e.g. from quant-studio-cli calibrate)",
    )
    p.add_argument(
        "--method",
        metavar="M",
        help=(
            "how codes and scales are chosen: rtn (llama.cpp's search, the default), imatrix, gptq, awq "
            "or awq+gptq (calibrated on --calib-text); best is awq+gptq, the rounding that measured best"
        ),
    )
    p.add_argument(
        "--calib-text",
        metavar="FILE",
        help="calibration text (UTF-8, or a .jsonl of chats) for a calibrated method; default: the built-in text",
    )
    p.add_argument(
        "--calib-ctx",
        type=numbers.CTX,
        default=512,
        metavar="N",
        help="tokens per calibration chunk (default 512)",
    )
    p.add_argument(
        "--calib-chunks",
        type=numbers.CHUNKS,
        default=None,
        metavar="N",
        help="use the first N chunks (default all)",
    )
    p.add_argument(
        "--in-order",
        action="store_true",
        help="gptq: sweep the columns in their order with scales searched on arrival (default: act-order, "
        "columns by decreasing activation energy, which measured better)",
    )
    options.add_allow_pickle(p)
    options.add_rotate(p)
    p.add_argument(
        "-v", "--verbose", action="store_true", help="list every fallback tensor (default: one summary line)"
    )
    add_budget_args(p)
    add_heldout_args(p)
    p.add_argument(
        "--keep-if-worse",
        action="store_true",
        help=(
            "keep a budget file even when llama.cpp measures it above its prediction ×3 or above llama.cpp's "
            "preset of the same size (default: not written, one sentence, non-zero exit)"
        ),
    )
    add_scan_args(p, calib_text=False)
    options.add_json(p)
    p.set_defaults(handler="studio.commands.export:run")
