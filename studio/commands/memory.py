"""``quant-studio-cli memory (MODEL | --params N --layers L --kv-heads H --head-dim D) --ctx N``: memory per precision."""

from __future__ import annotations

import argparse
from typing import Any

from studio.commands import _options as options
from studio.commands._common import format_table, print_json
from studio.core.errors import ModelOpenError, StudioError
from studio.core.llamacpp.kvcache import KV_TYPES
from studio.core.units import format_memory


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
    p.add_argument("--params", type=float, metavar="N", help="parameters (e.g. 70.6e9)")
    p.add_argument("--layers", type=int, metavar="L", help="transformer layers")
    p.add_argument("--kv-heads", type=int, metavar="H", help="key/value heads (GQA)")
    p.add_argument("--head-dim", type=int, metavar="D", help="size of one attention head")
    p.add_argument(
        "--vocab", type=int, default=0, metavar="V", help="vocabulary size (logits buffer; default 0)"
    )
    p.add_argument(
        "--ctx", type=int, required=True, metavar="N", help="context length in tokens (2K to 128K)"
    )
    p.add_argument("--kv-type", default="f16", choices=KV_TYPES, help="KV-cache type (default f16)")
    options.add_json(p, "one JSON object instead of a table")
    p.set_defaults(handler=run)


def _shape(args: argparse.Namespace) -> Any:
    from studio.core.lab.memory import ModelShape, shape_from_hub, shape_from_info

    dims = (args.params, args.layers, args.kv_heads, args.head_dim)
    if args.model is not None:
        if any(d is not None for d in dims):
            raise StudioError("Give either MODEL or --params/--layers/--kv-heads/--head-dim, not both.")
        from studio.core.model import open_model

        try:
            with open_model(args.model) as ck:
                return shape_from_info(ck.info)
        except ModelOpenError:
            if "/" not in args.model or args.model.startswith((".", "/", "~")):
                raise
            return shape_from_hub(args.model)  # not local: ask the Hub for config.json only
    if any(d is None for d in dims):
        raise StudioError("Give a MODEL, or all of --params, --layers, --kv-heads and --head-dim.")
    if args.params != int(args.params):
        raise StudioError(f"--params must be a whole number of parameters, not {args.params}.")
    return ModelShape("shape", int(args.params), args.layers, args.kv_heads, args.head_dim, args.vocab)


def run(args: argparse.Namespace) -> int:
    """Handler of ``memory``."""
    from studio.core.lab.memory import FORMULAS, GPU_SIZES_GB, memory_report

    report = memory_report(_shape(args), args.ctx, args.kv_type)
    if args.json:
        print_json(report.to_dict(), indent=None)
        return 0
    s = report.shape
    print(
        f"{s.name}: {s.params:,} parameters, {s.layers} layers, {s.kv_heads} KV heads × {s.head_dim}; "
        f"context {report.ctx_len} ({report.ctx_allocated} allocated), KV cache {report.kv_type.upper()} "
        f"{format_memory(report.kv_cache_bytes)}"
    )
    header = (
        "precision",
        "bpw",
        "weights",
        "KV cache",
        "overhead",
        "total",
        *(f"{g}GB" for g in GPU_SIZES_GB),
        "this machine",
    )
    body = [
        (
            r.precision + ("" if r.bpw_source == "format" else f" ({r.bpw_source})"),
            f"{r.bpw:.3f}",
            format_memory(r.weights_bytes),
            format_memory(r.kv_cache_bytes),
            format_memory(r.overhead_bytes),
            format_memory(r.total_bytes),
            *("yes" if r.fits[f"{g}GB"] else "-" for g in GPU_SIZES_GB),
            r.this_machine,
        )
        for r in report.rows
    ]
    print(format_table(header, body, right=set(range(1, 6 + len(GPU_SIZES_GB)))))
    print(f"This machine: {report.machine}")
    print("Formulas:\n" + "\n".join("  " + line for line in FORMULAS.splitlines()))
    return 0
