"""How late the llama.cpp column's tokens reach the window's process while the transformers column
generates beside it: with transformers in this process (as before issue 26) and in its own child.

    python bench/chat_delivery.py [--model DEMO_FOLDER] [--gguf FILE] [--tokens 32] [--repeat 4]

Both columns run together in a ``ChatSession`` (one thread each, as the Chat page runs them); the
llama.cpp child sends every token at once with the moment it sent it (``_chat_delivery_ops``), and
this process notes when it got it. The delay is the pipe plus the wait of the reading thread for
the GIL: a transformers loop in this process holds the GIL (CPython hands it over every
``sys.getswitchinterval()``, 5 ms by default, 0.5 ms in the window), a transformers child does not.
Printed per setting: the median, 90th percentile and largest delay over every token after a
warm-up round. Unlike ``chat_latency.py`` the delay is a difference of two clocks read around one
pipe message, so other programs' load blurs it less (it still adds their time slices); Linux only
(one monotonic clock for every process).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COUNTRIES = ("France", "Italy", "Spain", "Germany", "Poland", "Norway", "Greece", "Canada", "Japan", "Peru")


def measure(
    model: Path, gguf: Path, in_process: bool, switch_s: float, tokens: int, rounds: int
) -> list[float]:
    """Delivery delays (s) of the llama.cpp column's tokens after the warm-up round."""
    from studio.core.chat import Sampling
    from studio.core.chat.hf_backend import TransformersBackend
    from studio.core.chat.hf_process import TransformersChildBackend
    from studio.core.chat.llama_backend import LlamaCppBackend
    from studio.core.chat.session import ChatSession

    sys.setswitchinterval(switch_s)
    if in_process:
        hf = TransformersBackend(model, n_ctx=2048, device="cpu")
    else:
        hf = TransformersChildBackend(model, n_ctx=2048, device="cpu")
    llama = LlamaCppBackend(gguf, n_ctx=2048, extra_ops="_chat_delivery_ops")
    llama.stream_window_s = 0.0

    def set_torch_threads(n: int) -> None:
        import torch

        torch.set_num_threads(n)

    session = ChatSession([hf, llama], cores=2, set_torch_threads=set_torch_threads)
    delays: list[float] = []
    try:
        if session.load_all() != [None, None]:
            raise RuntimeError("loading failed")
        for r in range(rounds):
            session.reset()
            got: list[float] = []

            def on_token(column: int, ev, got: list[float] = got) -> None:
                if column == 1:
                    got.append(time.monotonic() - ev.lag)  # ``lag`` carries the child's send time

            question = f"Tell me about the capital of {COUNTRIES[r % len(COUNTRIES)]} in three sentences."
            outs = session.send(question, Sampling(max_tokens=tokens), on_token=on_token)
            if any(o.error for o in outs):
                raise RuntimeError([o.error for o in outs])
            if r:
                delays += got
    finally:
        session.close()
    return delays


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="HF model folder (default: the demo)")
    ap.add_argument(
        "--gguf", type=Path, help="GGUF for the llama.cpp column (default: chat_latency.py's export)"
    )
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()
    if args.model is None:
        from studio.core.demo import demo_model_path

        args.model = demo_model_path()
    if args.gguf is None:
        from chat_latency import export_once  # the sibling bench script (bench/ is on sys.path)

        args.gguf = export_once(args.model, "Q4_K_M", Path.home() / ".cache" / "quant-studio" / "bench")
    print("before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{'transformers':<12} {'switch':>7} {'median ms':>10} {'p90 ms':>8} {'max ms':>8} {'tokens':>7}")
    for in_process, switch in ((True, 0.005), (True, 0.0005), (False, 0.005)):
        d = sorted(measure(args.model, args.gguf, in_process, switch, args.tokens, args.repeat + 1))
        if not d:
            print("no tokens")
            continue
        where = "this process" if in_process else "a child"
        print(
            f"{where:<12} {switch * 1000:>5.1f}ms {d[len(d) // 2] * 1000:>10.2f} "
            f"{d[min(len(d) - 1, int(0.9 * len(d)))] * 1000:>8.2f} {d[-1] * 1000:>8.2f} {len(d):>7}"
        )
    print("after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
