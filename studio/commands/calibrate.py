"""``quant-studio-cli calibrate MODEL -o imatrix.gguf``: activation statistics, outlier features and the imatrix."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from studio.commands._cluster import open_cluster
from studio.commands._common import ProgressLine, format_table, print_json, torch_original
from studio.commands._scan import calibration_preface
from studio.core.calib.analysis import layer_outlier_counts, top_outlier_features
from studio.core.calib.calibrate import calibrate
from studio.core.calib.collect import ActivationCollector
from studio.core.calib.data import BUILTIN
from studio.core.calib.imatrix import imatrix_from_stats, write_imatrix
from studio.core.calib.int8 import Int8Analysis
from studio.core.errors import StudioError
from studio.core.gguf.writer import check_output_path, clean_stale_partials
from studio.core.jobs import JobContext
from studio.core.model import open_model


def _imatrix_bytes(info: Any) -> int:
    """An upper bound of the imatrix file's size: float32 sums per input column of every matrix, plus counts."""
    total = 64 * 1024  # header, names and metadata
    for t in info.tensors:
        if len(t.shape) >= 2 and t.shape[-2]:
            n = 1
            for d in t.shape:
                n *= int(d)
            total += 4 * (n // int(t.shape[-2])) + 4 * (n // (int(t.shape[-2]) * int(t.shape[-1]) or 1))
    return total


def run(args: argparse.Namespace) -> int:
    """Handler of ``calibrate``."""
    if args.int8 and args.cluster:
        raise StudioError(
            "The LLM.int8() analysis reads every activation in this process; drop --int8 or --cluster."
        )
    out = Path(args.output).expanduser()
    check_output_path(out)  # a folder that cannot be written is refused before the long run
    clean_stale_partials(out.parent)  # what killed runs left in that folder
    args.model = torch_original(args.model, "calibration")
    with open_model(args.model, allow_pickle=args.allow_pickle) as ck:
        info = ck.info
    # The disk must hold the imatrix before the long run, not after it: sums and counts per input column.
    check_output_path(out, need_bytes=_imatrix_bytes(info))
    # its expected memory and time, as an export's calibration says them (the same arguments, renamed)
    hint = argparse.Namespace(
        calib_chunks=args.chunks, calib_text=args.text or args.chat, calib_ctx=args.ctx, device=args.device
    )
    preface = calibration_preface(hint, info, ["imatrix"])

    collector = ActivationCollector()
    consumers: list[Any] = []
    int8 = None
    if args.int8:
        int8 = Int8Analysis(collector)
        consumers.append(int8)
    with (
        ProgressLine(preface=preface) as line,
        contextlib.closing(open_cluster(args, args.device)) as executor,
    ):
        ctx = JobContext(on_progress=line.fraction, on_log=line.log, min_interval=0.2)
        stats = calibrate(
            info.path,
            args.text or args.chat or BUILTIN,
            n_ctx=args.ctx,
            n_chunks=args.chunks,
            device=args.device,
            dtype=args.dtype,
            process_output=args.process_output,
            consumers=consumers,
            collector=collector,
            allow_pickle=args.allow_pickle,
            ctx=ctx,
            executor=executor,
        )
    imatrix = write_imatrix(
        imatrix_from_stats(stats, info, process_output=args.process_output), out, args.format
    )
    run_info = stats.info
    seconds = run_info.seconds if run_info else 0.0
    top = top_outlier_features(stats, limit=max(0, args.top))
    layers = layer_outlier_counts(stats)
    result: dict[str, Any] = {
        "output": str(out),
        "format": args.format or ("dat" if str(out).lower().endswith(".dat") else "gguf"),
        "entries": len(imatrix),
        "chunks": stats.n_chunks,
        "ctx": stats.n_ctx,
        "tokens": stats.n_tokens,
        "dataset": stats.dataset,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(stats.n_tokens / seconds, 1) if seconds > 0 else None,
        "mode": run_info.mode.value if run_info else None,
        "device": run_info.device if run_info else None,
        "dtype": run_info.dtype if run_info else None,
        "outlier_features": [
            {
                "layer": f.layer,
                "input": f.site,
                "channel": f.channel,
                "absmax": round(f.absmax, 4),
                "x_median": round(f.ratio, 2),
            }
            for f in top
        ],
        "layers": [
            {
                "layer": lo.layer,
                "outlier_features": lo.n_features,
                "channels": list(lo.channels),
                "max_absmax": round(lo.max_absmax, 4),
            }
            for lo in layers
        ],
        "warnings": list(stats.warnings),
    }
    if int8 is not None:
        rep = int8.report()
        result["int8"] = {
            "sample_tokens": rep.sample_tokens,
            "layers": [
                {
                    "layer": s.layer,
                    "rule": s.rule,
                    "outlier_features": s.n_features,
                    "err_int8": s.err_int8,
                    "err_mixed": s.err_mixed,
                }
                for s in rep.layers
            ],
        }
    if args.json:
        print_json(result)
        return 0
    rate = f", {result['tokens_per_s']:.0f} tokens/s" if result["tokens_per_s"] else ""
    print(
        f"wrote {out} ({len(imatrix)} entries; {stats.n_chunks} chunks × {stats.n_ctx} tokens of {stats.dataset}; "
        f"{seconds:.1f} s{rate}; {result['mode']} on {result['device']}, {result['dtype']})"
    )
    for w in stats.warnings:
        print(f"note: {w}")
    if top:
        print("\nlargest outlier features (|x| ≥ 6):")
        rows = [(str(f.layer), f.site, str(f.channel), f"{f.absmax:.2f}", f"{f.ratio:.1f}") for f in top]
        print(format_table(("layer", "input of", "channel", "max |x|", "× median"), rows, right={0, 2, 3, 4}))
    flagged = [lo for lo in layers if lo.n_features]
    print(f"\nlayers with outlier features: {len(flagged)} of {len(layers)}")
    if int8 is not None:
        rep = int8.report()
        print(f"\nLLM.int8() analysis ({rep.sample_tokens} tokens per linear):")
        rows = [
            (str(s.layer), s.rule, str(s.n_features), f"{s.err_int8:.5f}", f"{s.err_mixed:.5f}")
            for s in rep.layers
        ]
        print(
            format_table(
                ("layer", "outliers", "features", "INT8 error", "with FP16 outliers"),
                rows,
                right={0, 2, 3, 4},
            )
        )
    return 0
