"""``quant-studio-cli eval --original MODEL --variant A.gguf ...``: perplexity, KL divergence and size per variant."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys

from studio.commands._cluster import open_cluster
from studio.commands._common import ProgressLine, dequantized, print_json
from studio.core.evaluate import evaluate
from studio.core.evaluate.record import save_records
from studio.core.evaluate.verdict import judge
from studio.core.jobs import JobContext


def _fmt(x: float, spec: str) -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, spec)


def run(args: argparse.Namespace) -> int:
    """Evaluate and print the results."""
    with ProgressLine() as line, contextlib.closing(open_cluster(args)) as executor:
        original = dequantized(args.original, line) if args.dequantize else args.original
        report = evaluate(
            original,
            args.variant,
            text=args.text,
            n_ctx=args.ctx,
            max_chunks=args.chunks,
            device=args.device,
            dtype=args.dtype,
            n_gpu_layers=args.gpu_layers,
            extra_buffers=args.llama_extra_buffers,
            allow_pickle=args.allow_pickle,
            ctx=JobContext(on_progress=line.fraction, on_log=lambda m: line.log(f"note: {m}")),
            kv_types=args.kv_type,
            executor=executor,
            original_mode=args.original_mode,
        )

    notes = save_records(report)  # beside each variant, for the model card of an upload
    failed = [v for v in report.variants if v.error]
    if args.json:
        print_json(report.to_dict())
    else:
        o = report.original
        print(
            f"{report.text_name}: {report.n_tokens} tokens, {report.n_chunks} chunks of {report.n_ctx} "
            f"({o.n_scored} scored), {report.seconds:.1f} s"
        )
        print(
            f"{'model':<28} {'PPL':>10} {'ΔPPL':>8} {'KL mean':>10} {'KL p99':>10} {'same top':>9} {'MB':>9} {'BPW':>6}"
            f" {'KV':>5} {'KV MB':>8}  verdict"
        )
        print(
            f"{o.label[:28]:<28} {_fmt(o.ppl, '10.4f')} {'':>8} {'':>10} {'':>10} {'':>9} {o.file_bytes / 1e6:9.2f} {_fmt(o.bpw, '6.2f')}"
        )
        for v in report.variants:
            if v.error:
                print(f"{v.label[:28]:<28} failed (the error is below)")
                continue
            print(
                f"{v.label[:28]:<28} {_fmt(v.ppl, '10.4f')} {_fmt(v.delta_ppl_pct(o.ppl), '+7.2f')}% "
                f"{_fmt(v.kld_mean, '10.6f')} {_fmt(v.kld_p99, '10.6f')} {_fmt(v.same_top_pct, '8.2f')}% "
                f"{v.file_bytes / 1e6:9.2f} {_fmt(v.bpw, '6.2f')} {v.kv_type:>5} {v.kv_cache_bytes / 1e6:8.2f}  "
                f"{judge(o.ppl, v.ppl).verdict.value}"
            )
    sys.stdout.flush()
    for note in notes:
        print(note, file=sys.stderr)
    for v in failed:
        print(f"error: {v.error}", file=sys.stderr)
    return 2 if failed else 0
