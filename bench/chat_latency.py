"""The chat's first token and tokens/s per column against llama_cpp and transformers called directly.

    python bench/chat_latency.py [--model DEMO_FOLDER] [--gguf FILE | --preset Q4_K_M] [--tokens 32]
                                 [--repeat 5] [--cores N]

On the demo (SmolLM2-135M-Instruct: the float32 folder in transformers, and a GGUF export of it in
llama.cpp; the export is made once with the CLI and cached), in one run:

* studio, together: a ``ChatSession`` with both columns, as the Chat page runs them: each column's
  model in its own child process (llama.cpp's and, since issue 26, transformers' too), this process
  rendering the prompts and reading the tokens as the window does. Both models are loaded first (the
  page loads a model when its column is added; the load time is printed apart), then every Send
  streams both columns at once, each on its share of the cores (``studio.core.chat.threads``).
  First token = Send → the first token's arrival here (rendering, tokenizing and the prompt
  included); tokens/s = tokens after the first over the time after the first, by arrival here.
* studio, alone: the same back ends in a session of one column (the column then gets every core).
* direct, alone: ``llama_cpp.Llama.create_completion`` (streamed) and transformers' ``model.generate``
  (greedy, a streamer timestamping each token), each in its own process, on the same prompt ids, for
  every thread count from 1 to the cores; the best thread setting is kept (lowest first-token time,
  highest tokens/s, each on its own).
* direct, together: both direct calls at the same moment in two processes, each with the same
  thread count (1 … cores), best setting kept — what the studio's "together" is compared with.
  Every round starts in both at once and the next waits for both, as a Send waits for every column.

Every process is loaded once, first; then the rounds are interleaved: each round runs the studio's
Sends (together, then each column alone) and then every direct call, one after another, on that
round's question. A virtual machine's speed drifts by tens of percent over minutes, and with the
studio's phase first and the direct phase after it, that drift decided the ratios.

The children send tokens in batches (at most one message per 40 ms). The judged tokens/s is the
rate at which they arrived in this process (the window's), the honest figure; the ``made`` column is
the rate the window shows, counted when the child made each token (``TokenEvent.lag``), for
comparison. The direct calls stamp each token as it reaches their caller too.

Every measurement is the median of ``--repeat`` rounds after one warm-up round. Acceptance (issue 26):
studio first token ≤ 1.3 × direct, studio tokens/s (by arrival) ≥ 0.85 × direct best, for each
column, alone against alone and together against together. ``uptime`` is printed before and after,
and a run that starts with other programs keeping cores busy (load average ≥ 0.5 beyond this run)
says so: on a shared machine the load moves every number, so rerun it on a quiet one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COUNTRIES = ("France", "Italy", "Spain", "Germany", "Poland", "Norway", "Greece", "Canada", "Japan", "Peru")


def question(round_: int) -> str:
    """A different question each round, of the same shape: llama.cpp may keep the chat template's
    cached prefix (studio and direct alike) but evaluates each question afresh. It asks for a
    paragraph: the demo answered half of "Tell me about the capital of X in three sentences." in 7
    tokens, a rate over six gaps of which the last (the model's end-of-text step, which the studio's
    child must wait for before it sends the held tokens) was a sixth; this one gets 32 tokens for
    each of the ten countries."""
    return f"Write a short paragraph about the history of {COUNTRIES[round_ % len(COUNTRIES)]}."


TTFT_LIMIT = 1.3
TPS_LIMIT = 0.85
SETTLE_S = 0.3  # between two measurements: the last one's spinning OpenMP/ggml threads go to sleep
BUSY_WARN = 0.5  # cores other programs keep busy at the start, above which the run is flagged


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load average {os.getloadavg()}"


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def _rate(stamps: list[float]) -> float:
    return (
        (len(stamps) - 1) / (stamps[-1] - stamps[0])
        if len(stamps) >= 2 and stamps[-1] > stamps[0]
        else float("nan")
    )


# -- the direct calls, each in its own process ---------------------------------------------------


def _direct_llama(
    path: str, ids: list[list[int]], threads: int, tokens: int, go: Any, done: Any, extra_buffers: bool
) -> None:
    from llama_cpp import Llama

    from studio.core.llamacpp.worker import model_params

    # the same extra-buffer decision and F32 KV cache as the studio's child, so both do the same work
    with model_params(extra_buffers):
        llm = Llama(
            model_path=path,
            n_ctx=2048,
            n_threads=threads,
            n_threads_batch=threads,
            type_k=0,
            type_v=0,
            verbose=False,
        )
    while True:
        go()  # appends this round's prompt ids (or ends the child)
        t0 = time.perf_counter()
        stamps = []
        for _chunk in llm.create_completion(ids[-1], max_tokens=tokens, temperature=0.0, stream=True):
            stamps.append(time.perf_counter())
        done(stamps[0] - t0 if stamps else float("nan"), _rate(stamps))


def _direct_hf(
    path: str, ids: list[list[int]], threads: int, tokens: int, go: Any, done: Any, extra_buffers: bool
) -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    from studio.core.model.hf_progress import no_hf_progress_bars

    torch.set_num_threads(threads)
    with no_hf_progress_bars():  # its "Loading weights" bar cluttered the bench's table
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    class Stamps(BaseStreamer):
        def __init__(self) -> None:
            self.t: list[float] = []

        def put(self, value: Any) -> None:
            self.t.append(time.perf_counter())

        def end(self) -> None:
            pass

    while True:
        go()
        x = torch.tensor([ids[-1]])
        s = Stamps()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=tokens,
                do_sample=False,
                streamer=s,
                pad_token_id=model.config.eos_token_id,
            )
        new = s.t[1:]  # the first put is the prompt
        done(new[0] - t0 if new else float("nan"), _rate(new))


def child_main(spec: dict) -> None:
    """Run one direct measurement (``--child JSON``): prints ``ready`` when loaded, then runs one round
    per ``go IDS`` line it reads (the prompt's ids as JSON) and prints ``ROUND {"ttft", "tps"}`` after each."""
    print("ready", flush=True)
    prompts: list[list[int]] = []

    def go() -> None:
        line = sys.stdin.readline()
        if not line.startswith("go "):
            raise SystemExit(0)  # the bench closed our stdin: no more rounds
        prompts.append(json.loads(line[3:]))

    def done(ttft: float, tps: float) -> None:
        print("ROUND " + json.dumps({"ttft": ttft, "tps": tps}), flush=True)

    fn = _direct_llama if spec["kind"] == "llama_cpp" else _direct_hf
    fn(spec["path"], prompts, spec["threads"], spec["tokens"], go, done, spec["extra_buffers"])


def _line(proc: subprocess.Popen, prefix: str) -> str:
    """The next line of ``proc`` that starts with ``prefix`` (libraries may print others)."""
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"a direct child ended without a {prefix.strip()!r} line (exit {proc.wait()})")


class Direct:
    """Direct-call children, loaded once; ``round`` starts one round in all of them at the same moment and
    waits until each has finished, as a Send of the studio waits for every column (rounds left to run
    on their own drifted apart: the quick llama.cpp child finished its rounds while the transformers
    child still ran, which then met no competition in the rounds that counted)."""

    def __init__(self, specs: list[dict]) -> None:
        self.specs = specs
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--child", json.dumps(s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": str(s["threads"])},
            )
            for s in specs
        ]
        self.rounds: list[list[dict]] = [[] for _ in specs]
        for p in self.procs:
            _line(p, "ready")

    def round(self, ids: list[int]) -> None:
        for p in self.procs:
            p.stdin.write("go " + json.dumps(ids) + "\n")
            p.stdin.flush()
        for p, got in zip(self.procs, self.rounds, strict=True):
            got.append(json.loads(_line(p, "ROUND ")[6:]))

    def results(self) -> list[dict]:
        """Per child, the medians of its rounds after the first (the warm-up)."""
        return [
            {"ttft": _median([r["ttft"] for r in got[1:]]), "tps": _median([r["tps"] for r in got[1:]])}
            for got in self.rounds
        ]

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- the studio ------------------------------------------------------------------------------------


class Studio:
    """The studio's columns as the Chat page runs them: every model loaded once (timed apart), then one
    ``ChatSession`` per way of running them (both columns together, each alone), sharing the back ends.

    Per Send and column: ``ttft`` is Send → the first token's arrival here; ``tps`` the rate by arrival
    in this process (judged); ``made`` the rate the window shows, counted when the child made each token."""

    def __init__(self, paths: list[Path], cores: int | None) -> None:
        from studio.core.chat import threads as chat_threads
        from studio.core.chat.session import ChatSession, open_backend

        self.cores = cores
        self.backends = [open_backend(p, n_ctx=2048, device="cpu") for p in paths]
        self.sessions: dict[str, Any] = {}
        try:
            # the page loads each model when its column is added, on its share of the cores
            chat_threads.apply(self.backends, cores)
            _set_torch_threads(chat_threads.torch_threads(self.backends))
            errors = ChatSession(self.backends, cores=cores).load_all()
            if any(errors):
                raise RuntimeError(f"loading failed: {errors}")
            self.sessions["together"] = ChatSession(
                self.backends, cores=cores, set_torch_threads=_set_torch_threads
            )
            for i, b in enumerate(self.backends):
                self.sessions[f"alone{i}"] = ChatSession(
                    [b], cores=cores, set_torch_threads=_set_torch_threads
                )
        except BaseException:
            self.close()
            raise
        self.per: dict[str, list[dict]] = {
            k: [{"ttft": [], "tps": [], "made": []} for _ in s.backends] for k, s in self.sessions.items()
        }

    def send(self, mode: str, text: str, tokens: int) -> list[int]:
        """One Send in ``mode`` ("together", "alone0", …); returns the first column's prompt ids."""
        from studio.core.chat import Sampling

        session = self.sessions[mode]
        session.reset()  # each round a new conversation, as the direct calls get a fresh prompt
        outs = session.send(text, Sampling(max_tokens=tokens))
        for i, o in enumerate(outs):
            if o.error:
                raise RuntimeError(o.error)
            got = self.per[mode][i]
            got["ttft"].append(o.result.ttft_s)
            got["tps"].append(_rate([t.seconds for t in o.result.tokens]))  # a batch arrives together
            got["made"].append(o.result.tokens_per_s)
        return list(outs[0].result.prompt.ids)

    def results(self, mode: str) -> list[dict]:
        """Per column of ``mode``, the medians after the warm-up round."""
        session = self.sessions[mode]
        return [
            {
                "ttft": _median(p["ttft"][1:]),
                "tps": _median(p["tps"][1:]),
                "made": _median(p["made"][1:]),
                "load": getattr(b, "load_seconds", float("nan")),
                "threads": session.share.threads,
                "extra_buffers": bool(getattr(getattr(b, "runner", None), "extra_buffers", False)),
            }
            for p, b in zip(self.per[mode], session.backends, strict=True)
        ]

    def close(self) -> None:
        for b in self.backends:
            with contextlib.suppress(Exception):
                b.close()


def _set_torch_threads(n: int | None) -> None:
    """The Chat page's ``_set_torch_threads``: torch in this process, only for an in-process column."""
    if n:
        import torch

        torch.set_num_threads(n)


def export_once(model: Path, preset: str, cache: Path) -> Path:
    out = cache / f"{model.name}-{preset}.gguf"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"exporting {model.name} as {preset} (once, cached in {cache}) …", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "studio.cli", "export", str(model), "-o", str(out), "--preset", preset],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="HF model folder (default: the demo)")
    ap.add_argument("--gguf", type=Path, help="GGUF file for the llama.cpp column (default: an export)")
    ap.add_argument("--preset", default="Q4_K_M", help="preset of the default export")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cores", type=int, default=None, help="cores to share (default: this process's)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "quant-studio" / "bench")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return 0

    from studio.core.chat.threads import busy_cores, cpu_cores

    cores = args.cores or cpu_cores()
    if args.model is None:
        from studio.core.demo import demo_model_path

        args.model = demo_model_path()
    gguf = args.gguf or export_once(args.model, args.preset, args.cache)
    rounds = args.repeat + 1
    busy_before = busy_cores()  # other programs' runnable threads now, the load average at most
    print(f"before: {_uptime()}")
    print(
        f"cores {cores}; {args.tokens} tokens; median of {args.repeat} rounds after a warm-up; prompts like {question(0)!r}"
    )
    kinds = [("transformers", args.model), ("llama_cpp", gguf)]
    studio = Studio([p for _, p in kinds], args.cores)
    direct: dict[tuple[str, int], Direct] = {}
    try:

        def spec(kind: str, path: Path, t: int) -> dict:
            return {
                "kind": kind,
                # the same extra-buffer decision as the studio's child, so both do the same work
                "extra_buffers": studio.results("together")[1]["extra_buffers"],
                "path": str(path),
                "threads": t,
                "tokens": args.tokens,
            }

        for t in range(1, cores + 1):
            for i, (kind, path) in enumerate(kinds):
                direct[(f"alone{i}", t)] = Direct([spec(kind, path, t)])
            direct[("together", t)] = Direct([spec(kind, path, t) for kind, path in kinds])
        # Round by round, every way of running is measured once, close in time: the machine's speed
        # drifted by ±30 % between the minutes-long phases of the earlier layout (studio first, then
        # direct), which decided ratios by when each phase ran. Idle children sleep on their pipes.
        for r in range(rounds):
            time.sleep(SETTLE_S)
            ids = studio.send("together", question(r), args.tokens)
            for i in range(len(kinds)):
                time.sleep(SETTLE_S)
                studio.send(f"alone{i}", question(r), args.tokens)
            for group in direct.values():
                time.sleep(SETTLE_S)
                group.round(ids)
            print(f"round {r + 1}/{rounds} done ({_uptime()})", file=sys.stderr)
        together = studio.results("together")
        alone = [studio.results(f"alone{i}")[0] for i in range(len(kinds))]
        d_alone: list[dict] = [{"ttft": float("inf"), "tps": 0.0, "t_ttft": 0, "t_tps": 0} for _ in kinds]
        d_tog: list[dict] = [{"ttft": float("inf"), "tps": 0.0, "t_ttft": 0, "t_tps": 0} for _ in kinds]
        for (mode, t), group in direct.items():
            res = group.results()
            if mode == "together":
                for i, r_ in enumerate(res):
                    _keep(d_tog[i], r_, t)
            else:
                _keep(d_alone[int(mode[5:])], res[0], t)
    finally:
        studio.close()
        for group in direct.values():
            group.close()

    ok = True
    print()
    print(
        f"{'column':<13} {'mode':<9} {'threads':>7} {'load s':>7} {'1st ms':>8} {'direct':>8} {'(thr)':>5} "
        f"{'ratio':>6} {'tok/s':>7} {'direct':>7} {'(thr)':>5} {'ratio':>6} {'made':>7}  verdict"
    )
    for mode, studio_rows, direct_rows in (("alone", alone, d_alone), ("together", together, d_tog)):
        for (kind, _), s, d in zip(kinds, studio_rows, direct_rows, strict=True):
            r_ttft = s["ttft"] / d["ttft"]
            r_tps = s["tps"] / d["tps"]
            good = r_ttft <= TTFT_LIMIT and r_tps >= TPS_LIMIT
            ok &= good
            print(
                f"{kind:<13} {mode:<9} {s['threads']:>7} {s['load']:>7.2f} {s['ttft'] * 1000:>8.0f} "
                f"{d['ttft'] * 1000:>8.0f} {d['t_ttft']:>5} {r_ttft:>6.2f} {s['tps']:>7.1f} {d['tps']:>7.1f} "
                f"{d['t_tps']:>5} {r_tps:>6.2f} {s['made']:>7.1f}  {'ok' if good else 'MISSED'}"
            )
    print(
        f"\nlimits: first token ≤ {TTFT_LIMIT} × direct, tokens/s ≥ {TPS_LIMIT} × direct best "
        "(studio: by arrival in this process, the window's; 'made': as the window shows it, when the child made them)"
    )
    print(f"after: {_uptime()}")
    if busy_before >= BUSY_WARN:
        print(
            f"warning: other programs kept {busy_before:.1f} cores busy when the run started; "
            "the ratios are not a quiet machine's, rerun when `uptime` shows a load under 0.5"
        )
    print("all columns within the limits" if ok else "some column missed a limit")
    return 0 if ok else 1


def _keep(best: dict, r: dict, t: int) -> None:
    if r["ttft"] < best["ttft"]:
        best["ttft"], best["t_ttft"] = r["ttft"], t
    if r["tps"] > best["tps"]:
        best["tps"], best["t_tps"] = r["tps"], t


if __name__ == "__main__":
    sys.exit(main())
