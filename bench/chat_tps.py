"""Tokens/s of our llama.cpp chat back end against llama-cpp-python called directly, on the same GGUF;
and (``--extra-buffers-ab``) of llama.cpp with its extra buffer types (repacked weights) on against off.

    python bench/chat_tps.py [--hidden 1024] [--layers 8] [--preset Q8_0] [--tokens 128] [--repeat 3]
                             [--llama-extra-buffers auto|on|off]
    python bench/chat_tps.py --extra-buffers-ab [--preset Q8_0,Q4_K_M,Q4_0] [--prompt-tokens 128]

Builds (once, cached under --cache) a factory model bigger than the test ones and exports it. Then,
alternating A/B for --repeat rounds: ours = ``LlamaCppBackend`` (child process, our sampler, one pipe
message per token, probabilities computed) and direct = ``llama_cpp.Llama.generate`` in this process
with greedy sampling, both with an F32 KV cache, the same prompt ids and llama.cpp's default thread
count. Decode speed counts the tokens after the first one over the time after the first one; the
best round of each side is compared (target: ours/direct ≥ 0.95). Also prints the time from
``request_stop`` to the end of a long generation, and peak RSS of this process and of the children.
Both sides load with the extra-buffer decision of ``LlamaRunner`` for ``--llama-extra-buffers``.

``--extra-buffers-ab``: for every preset, two children (``LlamaRunner``, explicit on and off) run
alternately, timed inside the child: prompt processing (the prompt as one batch) and generation
(prompt fed one token per decode, then greedy tokens one by one, so no batched matmul runs). On a
CPU with AMX the batched decode with extra buffers on dies (llama.cpp #20824): the bench reports
the crash and still times the generation, which uses only single-token decodes. The ratio on/off
is what the ``auto`` default is chosen on.

Then the transformers back end against plain ``model.generate`` on the same loaded model in the same
run (``--hf-model``: a model folder, by default the demo SmolLM2-135M-Instruct; ``none`` skips it):
``TransformersBackend.stream`` (our loop, sampler and per-token probabilities) and greedy
``generate`` with a streamer that timestamps each token, alternating; target ours/generate ≥ 0.9.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import peak_mib  # noqa: E402

PROMPT = "The river runs past the mill and under the old stone bridge, and the town grew up around it."


def build(cache: Path, hidden: int, layers: int, preset: str) -> Path:
    from studio.core.export.run import export_gguf
    from studio.core.factory import make_tiny_model

    model = cache / f"llama-h{hidden}-l{layers}"
    if not model.exists():
        print(f"building a {layers}-layer llama with hidden {hidden} …", file=sys.stderr)
        make_tiny_model(model, "llama", hidden=hidden, layers=layers, outliers=False)
    gguf = cache / f"llama-h{hidden}-l{layers}-{preset}.gguf"
    if not gguf.exists():
        export_gguf(model, gguf, preset)
    return gguf


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def ours_round(backend, ids: list[int], n: int) -> tuple[float, int, float]:
    """(decode tokens/s, tokens, CPU seconds per token of child + consuming thread)."""
    from studio.core.chat import Sampling

    stamps: list[float] = []
    pid = backend.worker.pid
    c0, t0 = _proc_cpu(pid), time.thread_time()
    gen = backend.stream(ids, Sampling(max_tokens=n))
    for _ in gen:
        stamps.append(time.perf_counter())
    cpu = _proc_cpu(pid) - c0 + time.thread_time() - t0
    return _rate(stamps), len(stamps), cpu / max(len(stamps), 1)


def direct_round(llm, ids: list[int], n: int) -> tuple[float, int, float]:
    """(decode tokens/s, tokens, CPU seconds per token of this process)."""
    stamps: list[float] = []
    llm.reset()
    eog = llm.token_eos()
    c0 = time.process_time()
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        if tok == eog:
            break
        stamps.append(time.perf_counter())
        if len(stamps) >= n:
            break
    return _rate(stamps), len(stamps), (time.process_time() - c0) / max(len(stamps), 1)


def _rate(stamps: list[float]) -> float:
    if len(stamps) < 2:
        return float("nan")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def stop_latency(backend, ids: list[int]) -> tuple[float, int, str]:
    """(seconds from request_stop to the end of the stream, tokens streamed, why it ended)."""
    from studio.core.chat import Sampling

    seen = threading.Event()
    count = [0]
    done: list[float] = []
    reason: list[str] = []

    def run() -> None:
        gen = backend.stream(ids, Sampling(max_tokens=100_000))
        while True:
            try:
                next(gen)
            except StopIteration as end:
                reason.append(str(getattr(end.value, "value", end.value)))
                break
            count[0] += 1
            if count[0] == 10:
                seen.set()
        done.append(time.perf_counter())

    t = threading.Thread(target=run)
    t.start()
    seen.wait(120)
    t0 = time.perf_counter()
    backend.request_stop()
    t.join(60)
    return (done[0] - t0 if done else float("nan")), count[0], (reason[0] if reason else "?")


def _ab_round(runner, reload, ids: list[int], n_gen: int) -> tuple[float | str, float | str]:
    """(prompt tok/s, generation tok/s) of one child timed inside it; a crash is named and the child reloaded."""
    from studio.core.errors import ChildProcessError_

    out: list[float | str] = []
    for kw in ({"ids": ids, "n_gen": 0}, {"ids": ids[:8], "n_gen": n_gen, "one_by_one": True}):
        try:
            r = runner.request("bench_decode", **kw)
            out.append(r["n_prompt"] / r["prompt_s"] if kw["n_gen"] == 0 else r["n_gen"] / r["gen_s"])
        except ChildProcessError_:
            out.append(f"crashed ({runner.worker.exit_how.removeprefix('signal ')})")
            reload()
    return out[0], out[1]


def _best(values: list[float | str]) -> float | str:
    nums = [v for v in values if isinstance(v, float)]
    return max(nums) if nums else next((v for v in values if isinstance(v, str)), "-")


def _fmt(v: float | str) -> str:
    return f"{v:16.1f}" if isinstance(v, float) else f"{v:>16}"


def _ratio(a: float | str, b: float | str) -> str:
    return f"{a / b:6.3f}" if isinstance(a, float) and isinstance(b, float) else f"{'-':>6}"


def extra_buffers_ab(args: argparse.Namespace) -> int:
    """Extra buffers on against off, per preset; see the module docstring."""
    from studio.core.llamacpp import LlamaRunner, LoadOptions
    from studio.core.llamacpp.cpu import cpu_has_amx

    memory = Path(tempfile.mkdtemp(prefix="qs-bench-memory-"))  # never the user's remembered choice
    threads = args.threads or "llama.cpp's default number of"
    print(f"CPU with AMX: {cpu_has_amx()}; {os.cpu_count()} CPUs; {threads} threads")
    print(
        f"{'preset':<8} {'pp off':>16} {'pp on':>16} {'on/off':>6}   {'tg off':>16} {'tg on':>16} {'on/off':>6}"
        "   (tokens/s)"
    )
    for preset in args.preset.split(","):
        gguf = build(args.cache, args.hidden, args.layers, preset)
        rows: dict[str, tuple[list[float | str], list[float | str]]] = {"off": ([], []), "on": ([], [])}
        runners = {}
        for eb in ("off", "on"):
            runners[eb] = LlamaRunner(
                label=f"llama.cpp ({eb})", extra_ops="_llama_bench_ops", cache_dir=memory
            )
            runners[eb].load(gguf, LoadOptions(n_ctx=args.ctx, n_threads=args.threads, extra_buffers=eb))
        ids = (runners["off"].request("tokenize", text=PROMPT * 20, add_bos=True) * 8)[: args.prompt_tokens]
        for rnd in range(args.repeat + 1):  # round 0 warms both children up and is not counted
            for eb in ("off", "on"):  # alternate so drift on a shared machine hits both sides
                r = runners[eb]
                pp, tg = _ab_round(
                    r,
                    lambda r=r, eb=eb, g=gguf: r.load(
                        g, LoadOptions(n_ctx=args.ctx, n_threads=args.threads, extra_buffers=eb)
                    ),
                    ids,
                    args.tokens,
                )
                if rnd:
                    rows[eb][0].append(pp)
                    rows[eb][1].append(tg)
        for r in runners.values():
            r.close()
        pp_off, pp_on = _best(rows["off"][0]), _best(rows["on"][0])
        tg_off, tg_on = _best(rows["off"][1]), _best(rows["on"][1])
        print(
            f"{preset:<8} {_fmt(pp_off)} {_fmt(pp_on)} {_ratio(pp_on, pp_off)}   "
            f"{_fmt(tg_off)} {_fmt(tg_on)} {_ratio(tg_on, tg_off)}"
        )
    print(
        f"model: llama hidden {args.hidden}, {args.layers} layers; prompt {args.prompt_tokens} tokens, "
        f"{args.tokens} generated; best of {args.repeat}; peak RSS of the children "
        f"{peak_mib(resource.RUSAGE_CHILDREN):.0f} MiB"
    )
    return 0


HF_PROMPT = "Write a long story about a river, a mill and the town that grew up around them."


def transformers_vs_generate(model_dir: str, tokens: int, repeat: int) -> float:
    """Decode tokens/s of ``TransformersBackend.stream`` and of ``model.generate`` (greedy, same weights,
    same prompt ids, alternating rounds); prints both and returns the best-round ratio ours/generate."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    from studio.core.chat import Message, Sampling
    from studio.core.chat.hf_backend import TransformersBackend

    if model_dir == "demo":
        from studio.core.demo import demo_model_path

        model_dir = str(demo_model_path())
    ours = TransformersBackend(model_dir, device="cpu", dtype="float32", n_ctx=2048)
    ours.load()
    ids = list(ours.prompt([Message("user", HF_PROMPT)], max_tokens=tokens).ids)
    model = ours._model  # the very weights our loop uses

    class Stamps(BaseStreamer):
        def __init__(self) -> None:
            self.t: list[float] = []
            self.first = True

        def put(self, value) -> None:
            if self.first:  # generate() puts the prompt first
                self.first = False
                return
            self.t.append(time.perf_counter())

        def end(self) -> None:
            pass

    # CPU seconds of this process per token as well: on a shared machine wall-clock rates swing with
    # the load, the CPU cost of a token much less
    def ours_rate(n: int) -> tuple[float, int, float]:
        c0 = time.process_time()
        stamps = [time.perf_counter() for _ in ours.stream(ids, Sampling(max_tokens=n, temperature=0.0))]
        return _rate(stamps), len(stamps), (time.process_time() - c0) / max(len(stamps), 1)

    def generate_rate(n: int) -> tuple[float, int, float]:
        st = Stamps()
        c0 = time.process_time()
        with torch.inference_mode():
            model.generate(
                torch.tensor([ids]), max_new_tokens=n, do_sample=False, streamer=st, pad_token_id=0
            )
        return _rate(st.t), len(st.t), (time.process_time() - c0) / max(len(st.t), 1)

    ours_rate(8)  # warm both up
    generate_rate(8)
    mine, theirs, mine_cpu, theirs_cpu = [], [], [], []
    for r in range(repeat):
        (a, na, ca), (b, nb, cb) = ours_rate(tokens), generate_rate(tokens)
        mine.append(a)
        theirs.append(b)
        mine_cpu.append(ca)
        theirs_cpu.append(cb)
        print(
            f"transformers round {r + 1}: ours {a:8.2f} tok/s ({na} tokens, {ca * 1000:.1f} ms CPU/token)   "
            f"generate {b:8.2f} tok/s ({nb} tokens, {cb * 1000:.1f} ms CPU/token)"
        )
    ours.close()
    ratio = max(mine) / max(theirs)
    print(
        f"transformers (TransformersBackend.stream vs model.generate, {Path(model_dir).name}, float32 CPU): "
        f"best {max(mine):.2f} vs {max(theirs):.2f} tok/s; ratio ours/generate {ratio:.3f} (best), "
        f"{statistics.median(mine) / statistics.median(theirs):.3f} (median); CPU per token ratio "
        f"generate/ours {statistics.median(theirs_cpu) / statistics.median(mine_cpu):.3f}; target >= 0.9"
    )
    return ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--preset", default="Q8_0")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "quant-studio-bench")
    ap.add_argument("--llama-extra-buffers", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--extra-buffers-ab", action="store_true", help="time extra buffers on against off")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length of --extra-buffers-ab")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="llama.cpp threads of --extra-buffers-ab (default: llama.cpp's)",
    )
    ap.add_argument(
        "--hf-model", default="demo", help="model folder for the transformers ratio ('none': skip)"
    )
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.extra_buffers_ab:
        return extra_buffers_ab(args)
    gguf = build(args.cache, args.hidden, args.layers, args.preset)

    import llama_cpp

    from studio.core.chat.llama_backend import LlamaCppBackend
    from studio.core.llamacpp.worker import model_params

    ours = LlamaCppBackend(gguf, n_ctx=args.ctx, extra_buffers=args.llama_extra_buffers)
    ours.load()
    ids = ours.tokenize(PROMPT, True)
    use_extra = bool(ours.runner.extra_buffers)
    print(f"extra buffers: {ours.runner.decision.describe()}")
    with model_params(use_extra):  # the same use_extra_bufts as our child
        direct = llama_cpp.Llama(model_path=str(gguf), n_ctx=args.ctx, verbose=False, type_k=0, type_v=0)
    assert direct.tokenize(PROMPT.encode(), add_bos=True) == ids, "tokenizations differ"

    ours_rates, direct_rates, ours_cpu, direct_cpu = [], [], [], []
    ours_round(ours, ids, 8)  # warm both up
    direct_round(direct, ids, 8)
    for r in range(args.repeat):
        rate_o, n_o, cpu_o = ours_round(ours, ids, args.tokens)
        rate_d, n_d, cpu_d = direct_round(direct, ids, args.tokens)
        ours_rates.append(rate_o)
        direct_rates.append(rate_d)
        ours_cpu.append(cpu_o)
        direct_cpu.append(cpu_d)
        print(
            f"round {r + 1}: ours {rate_o:8.2f} tok/s ({n_o} tokens, {cpu_o * 1000:.2f} ms CPU/token)   "
            f"direct {rate_d:8.2f} tok/s ({n_d} tokens, {cpu_d * 1000:.2f} ms CPU/token)"
        )
    stop_s, stop_n, stop_why = stop_latency(ours, ids)
    ours.close()
    del direct

    best_o, best_d = max(ours_rates), max(direct_rates)
    self_mib = peak_mib()
    child_mib = peak_mib(resource.RUSAGE_CHILDREN)
    print(
        f"model: {gguf.name} ({gguf.stat().st_size / 1e6:.1f} MB), prompt {len(ids)} tokens, {args.tokens} generated"
    )
    print(
        f"ours   (LlamaCppBackend, child process): best {best_o:.2f} tok/s, median {statistics.median(ours_rates):.2f}"
    )
    print(
        f"direct (llama_cpp.Llama.generate):       best {best_d:.2f} tok/s, median {statistics.median(direct_rates):.2f}"
    )
    print(
        f"ratio ours/direct: {best_o / best_d:.3f} (best), {statistics.median(ours_rates) / statistics.median(direct_rates):.3f} (median); target >= 0.95"
    )
    print(
        f"CPU per token: ours {statistics.median(ours_cpu) * 1000:.2f} ms (child + reader thread), "
        f"direct {statistics.median(direct_cpu) * 1000:.2f} ms; ratio direct/ours "
        f"{statistics.median(direct_cpu) / statistics.median(ours_cpu):.3f} (load-independent speed ratio)"
    )
    print(
        f"stop latency (request_stop -> generation ended): {stop_s * 1000:.1f} ms "
        f"(ended: {stop_why}, after {stop_n} tokens)"
    )
    print(
        f"peak RSS: this process {self_mib:.0f} MiB (holds the direct model), llama.cpp child {child_mib:.0f} MiB"
    )
    if args.hf_model != "none":
        transformers_vs_generate(args.hf_model, args.tokens, args.repeat)
        print(f"peak RSS after the transformers rounds: {peak_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
