"""``quant-studio-cli memory (MODEL | --params N --layers L --kv-heads H --head-dim D) --ctx N``: memory per precision."""

from __future__ import annotations

import argparse
from typing import Any

from studio.commands._common import format_table, print_json
from studio.core.errors import ModelOpenError, StudioError
from studio.core.lab.memory import (
    FORMULAS,
    GPU_SIZES_GB,
    ModelShape,
    memory_report,
    shape_from_hub,
    shape_from_info,
)
from studio.core.model import open_model
from studio.core.units import format_memory


def _shape(args: argparse.Namespace) -> Any:
    dims = (args.params, args.layers, args.kv_heads, args.head_dim)
    if args.model is not None:
        if any(d is not None for d in dims):
            raise StudioError("Give either MODEL or --params/--layers/--kv-heads/--head-dim, not both.")

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
