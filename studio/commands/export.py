"""``quant-studio-cli export MODEL -o OUT.gguf``: write a GGUF file following a preset or a plan."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from studio.commands._common import (
    ProgressLine,
    add_allow_pickle_option,
    add_extra_buffers_option,
    print_json,
    print_notes,
    read_text,
    write_text,
)
from studio.core.errors import StudioError
from studio.core.units import format_bytes


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
        "--verify", action="store_true", help="compare the result with the original model afterwards"
    )
    add_extra_buffers_option(p, "--verify")
    p.add_argument("--save-plan", metavar="PLAN.json", help="also write the plan used to this file")
    p.add_argument(
        "--imatrix",
        metavar="FILE",
        help="importance matrix (llama.cpp's GGUF or legacy .dat format, e.g. from quant-studio-cli calibrate)",
    )
    add_allow_pickle_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(handler=run)


def _parse_keep(spec: str) -> tuple[int, str]:
    try:
        n, t = spec.split(":", 1)
        return int(n), t.strip().upper()
    except ValueError:
        raise StudioError(f"--keep-first-last wants N:TYPE (e.g. 1:Q8_0), not {spec!r}.") from None


def build_plan(args: argparse.Namespace, info: Any) -> Any:
    """The plan the arguments describe, for the model ``info``: made by the core's plan verbs."""
    from studio.core.quant.plan import (
        Override,
        Plan,
        plan_first_last,
        plan_from_preset,
        plan_uniform,
        with_overrides,
    )
    from studio.core.quant.presets import PRESETS

    overrides = []
    for o in args.override:
        if "=" not in o:
            raise StudioError(f"--override wants REGEX=TYPE, not {o!r}.")
        rx, t = o.rsplit("=", 1)
        overrides.append(Override(rx, t.strip().upper()))
    if args.plan:
        if args.keep_first_last:
            raise StudioError(
                "--keep-first-last goes with --preset or --uniform; a --plan already sets every tensor."
            )
        plan = Plan.from_json(read_text(args.plan, "plan"), info, source=args.plan)
        return with_overrides(plan, info, overrides) if overrides else plan
    if args.keep_first_last:
        n, high = _parse_keep(args.keep_first_last)
        low = (args.uniform or args.preset or "").upper()
        if low in PRESETS:  # as documented: the rest at the preset's main qtype, not its mixture
            low = PRESETS[low].default_type
        return plan_first_last(info, n, high, low, overrides)
    if args.uniform:
        return plan_uniform(info, args.uniform, overrides)
    return plan_from_preset(info, args.preset, overrides, imatrix=bool(getattr(args, "imatrix", None)))


def _gguf_source(ck: Any) -> Any:
    """The ``SourceSummary`` of a GGUF original (requantization), None for other checkpoints."""
    g = getattr(ck, "gguf", None)
    if g is None:
        return None
    from studio.core.model.gguf_source import source_summary

    return source_summary(g)


def run(args: argparse.Namespace) -> int:
    """Handler of ``export``."""
    from studio.core.export import check_exportable, export_gguf
    from studio.core.jobs import JobContext
    from studio.core.model import open_model

    with open_model(args.model, allow_pickle=args.allow_pickle) as ck:
        info = ck.info
        source = _gguf_source(ck)
    check_exportable(info)
    if source is not None and source.warning and not args.json:
        print(f"warning: {source.warning}", file=sys.stderr)
    if args.verify:
        from studio.core.verify import check_verifiable

        check_verifiable(info.path)  # refuse before a long export, not after it
    imatrix = None
    if args.imatrix:
        from studio.core.calib.imatrix import check_for_model, read_imatrix

        imatrix = read_imatrix(args.imatrix)
        check_for_model(imatrix, info)  # another model's imatrix: one sentence, before any work
    plan = build_plan(args, info)
    if args.save_plan:
        write_text(args.save_plan, plan.to_json(), "plan")
    with ProgressLine() as line:
        ctx = JobContext(on_progress=line.fraction, min_interval=0.2)
        res = export_gguf(
            info.path,
            args.output,
            plan,
            device=args.device,
            backend=args.backend,
            ctx=ctx,
            allow_pickle=args.allow_pickle,
            imatrix=imatrix,
        )
    out: dict[str, Any] = {
        "output": str(res.path),
        "backend": res.backend,
        "device": res.device,
        "plan": res.plan_name,
        "file_bytes": res.file_bytes,
        "tensor_bytes": res.tensor_bytes,
        "bpw": round(res.bpw, 4),
        "tensors": res.n_tensors,
        "seconds": round(res.seconds, 3),
        "types": dict(res.tensor_types),
        "fallbacks": [f.to_dict() for f in res.fallbacks],
        "notes": list(res.notes),
    }
    if source is not None:
        out["source"] = source.to_dict()
    if imatrix is not None:
        out["imatrix"] = {"file": args.imatrix, "entries": len(imatrix), "chunks": imatrix.chunk_count}
    if args.verify:
        from studio.core.verify import verify_gguf

        print("verifying against the original model ...", file=sys.stderr)
        v = verify_gguf(res.path, info.path, device=args.device, extra_buffers=args.llama_extra_buffers)
        print_notes(v.notes)
        out["verify"] = {
            "tokens": v.n_tokens,
            "top1_agreement": v.top1_agreement,
            "mean_kl": v.mean_kl,
            "max_abs_diff": v.max_abs_diff,
            "relative_max_diff": v.relative_max_diff,
            "mean_cosine": v.mean_cosine,
            "notes": list(v.notes),
        }
    if args.json:
        print_json(out)
        return 0
    counts: dict[str, int] = {}
    for t in res.tensor_types.values():
        counts[t] = counts.get(t, 0) + 1
    print(
        f"wrote {res.path} ({format_bytes(res.file_bytes)}, {res.bpw:.2f} bpw, {res.n_tensors} tensors, "
        f"{res.seconds:.1f} s)"
    )
    print("types: " + ", ".join(f"{k}×{v}" for k, v in sorted(counts.items())))
    for f in res.fallbacks:
        print(f"fallback: {f.tensor}: {f.wanted} → {f.got} ({f.reason})")
    if "verify" in out:
        v = out["verify"]
        if v["top1_agreement"] is not None:
            print(
                f"verify: top-1 agreement {100 * v['top1_agreement']:.1f}%, mean KL {v['mean_kl']:.5f} over {v['tokens']} tokens"
            )
        else:
            print(
                f"verify: mean cosine {v['mean_cosine']:.6f}, max diff {v['max_abs_diff']:.3g} over {v['tokens']} tokens"
            )
    return 0
