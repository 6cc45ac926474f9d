"""``quant-studio-cli sweep MODEL --tensor NAME``: error of every bit width, granularity and GGUF type on one tensor."""

from __future__ import annotations

import argparse
import math

from studio.commands._common import ProgressLine, format_table, print_json
from studio.core.jobs import JobContext
from studio.core.lab.sweep import sweep_tensor
from studio.core.model import open_model


def _snr(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.2f}"


def run(args: argparse.Namespace) -> int:
    """Handler of ``sweep``."""
    with open_model(args.model) as ck, ProgressLine() as line:
        result = sweep_tensor(ck, args.tensor, ctx=JobContext(on_progress=line.fraction, on_log=line.log))
    if args.json:
        print_json(result.to_dict(), indent=None)
        return 0
    rows, cols = result.shape
    print(f"{result.tensor}: {rows} × {cols}, {len(result.rows)} schemes in {result.seconds:.1f} s")
    body = [
        (
            r.scheme + (f" → {r.applied}" if r.applied else ""),
            f"{r.bpw:.3f}",
            _snr(r.snr_db),
            f"{r.mse:.3e}",
            f"{r.cosine:.5f}",
        )
        for r in result.rows
    ]
    print(format_table(("scheme", "bpw", "SNR dB", "MSE", "cosine"), body, right={1, 2, 3, 4}))
    for note in result.skipped:
        print(f"skipped: {note}")
    print(f"Cliff (SNR below {result.cliff_snr_db:g} dB): fewest bits still above the line, per series")
    for c in result.cliffs:
        where = f"g{c.group}" if c.granularity == "group" else c.granularity
        bits = "none" if c.lowest_good_bits is None else f"{c.lowest_good_bits} bits"
        cross = "" if c.bpw_at_line is None else f" (crosses at {c.bpw_at_line:.2f} bpw)"
        print(f"  {where:<12} {'sym' if c.symmetric else 'asym':<5} {bits}{cross}")
    return 0
