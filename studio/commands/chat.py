"""``quant-studio-cli chat --model A [--compare B] --prompt TEXT``: one reply per model, side by side."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from studio.commands._common import ProgressLine, dequantized, print_json, print_notes
from studio.core.chat import ChatSession, Sampling, first_divergence, open_backend
from studio.core.chat.loading import load_seconds


def run(args: argparse.Namespace) -> int:
    """Generate with every model and print the replies."""
    sampling = Sampling(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    model = args.model
    if args.dequantize:
        with ProgressLine() as line:
            model = dequantized(model, line)
    paths = [model, *args.compare]
    backends = [
        open_backend(
            p,
            n_ctx=args.ctx,
            device=args.device,
            dtype=args.dtype,
            n_gpu_layers=args.gpu_layers,
            extra_buffers=args.llama_extra_buffers,
            allow_pickle=args.allow_pickle,
            kv_type=args.kv_type,
        )
        for p in paths
    ]
    # this process runs only this chat: the CLI may set torch's threads to the columns' share
    session = ChatSession(backends, system=args.system, set_torch_threads=set_torch_threads)
    try:
        outcomes = session.send(args.prompt, sampling, truncate=args.truncate)
    finally:
        session.close()
    share = session.share
    ref = outcomes[0].result
    rows: list[dict[str, Any]] = []
    for path, out in zip(paths, outcomes, strict=False):
        r = out.result
        row: dict[str, Any] = {
            "path": str(path),
            "label": out.label,
            "error": out.error,
            "notes": list(out.notes),
        }
        if r is not None:
            div = first_divergence(ref.tokens, r.tokens) if ref is not None else None
            row.update(
                text=r.text,
                tokens=list(r.token_ids),
                probs=[round(t.prob, 6) for t in r.tokens],
                prompt_tokens=r.prompt_tokens,
                stop_reason=r.stop_reason.value,
                ttft_s=round(r.ttft_s, 4),
                load_s=_load_s(backends[out.column]),
                threads=share.threads,
                tokens_per_s=round(r.tokens_per_s, 2),
                template=r.prompt.template if r.prompt else None,
                warning=r.prompt.warning if r.prompt else None,
                truncated_from=r.prompt.truncated_from if r.prompt else None,
                first_divergence=div,
            )
        rows.append(row)
    if args.json:
        print_json({"prompt": args.prompt, "sampling": sampling.as_dict(), "models": rows})
    else:
        for row in rows:
            print(f"=== {row['label']}")
            if row["error"]:
                print("failed (the error is below)")
                continue
            if row.get("warning"):
                print(f"warning: {row['warning']}")
            if row.get("truncated_from"):
                print(
                    f"note: the prompt had {row['truncated_from']} tokens; only its last "
                    f"{row['prompt_tokens']} were kept (--truncate)"
                )
            print(row["text"])
            div = row.get("first_divergence")
            # only columns after a first model that answered are compared with it
            if row is rows[0] or rows[0]["error"]:
                same = ""
            else:
                same = " · same as the first model" if div is None else f" · differs from token {div}"
            load = f", loaded in {row['load_s']:.1f} s before" if row.get("load_s") is not None else ""
            print(
                f"--- {len(row['tokens'])} tokens, {row['tokens_per_s']:.1f} tokens/s, "
                f"first token after {row['ttft_s'] * 1000:.0f} ms{load}, {share.describe()}, "
                f"ended: {row['stop_reason']}{same}"
            )
    sys.stdout.flush()
    print_notes(n for row in rows for n in row["notes"])
    for row in rows:
        if row["error"]:
            print(f"error: {row['error']}", file=sys.stderr)
    return 2 if any(row["error"] for row in rows) else 0


def _load_s(backend: Any) -> float | None:
    s = load_seconds(backend)
    return round(s, 3) if s is not None else None


def set_torch_threads(n: int) -> None:
    """``torch.set_num_threads(n)``: the transformers columns' share of the cores."""
    import torch

    torch.set_num_threads(n)
