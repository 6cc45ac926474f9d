"""Wall time and peak RSS of every calibrated path on one checkpoint, beside llama.cpp's tool for the same job.

Each path runs in a child process (``quant-studio-cli ...`` or llama.cpp's tool); its peak resident memory is
the child's ``ru_maxrss`` (``os.wait4``), its time the wall clock. Printed per path: seconds, peak GB, the
llama.cpp figures and the ratio where a tool exists (``convert_hf_to_gguf.py --outtype bf16`` +
``llama-quantize`` for ``export --preset Q4_K_M``; ``llama-imatrix`` for ``calibrate``; ``llama-perplexity``
for ``eval``), and what dominates the path's time (the progress step that took longest, from the child's
progress lines). For the layer-wise paths also the ETA's error after the first layer: the total predicted
when the progress first leaves layer 1 (elapsed + ETA) against the real total.

Usage (the 8B-shaped fixture of ``bench/make_8b_fixture.py``, a short one at full widths and vocabulary)::

    python bench/make_8b_fixture.py /work/scratch/fx --layers 2
    python bench/scale.py /work/scratch/fx --work /work/scratch/scale [--calib-ctx 128 --calib-chunks 2]
        [--paths inspect,export,calibrate,gptq,awq,awq+gptq,scan,best,eval] [--json out.json]

Needs ``QS_LLAMA_BIN`` (or ``--llama-bin``) for llama.cpp's tools and ``--converter`` for its converter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALL_PATHS = ("inspect", "export", "calibrate", "gptq", "awq", "awq+gptq", "scan", "best", "eval")
_PROGRESS = re.compile(r"^\[\s*(\d+(?:\.\d+)?)%\]\s*(.*)$")
_ETA = re.compile(r"ETA\s+((?:\d+\s*h\s*)?(?:\d+\s*min\s*)?(?:\d+\s*s)?)")


@dataclass
class Run:
    """One child process: wall seconds, peak RSS bytes, exit status, its output lines with their times."""

    seconds: float
    peak: int
    rc: int
    lines: list[tuple[float, str]] = field(default_factory=list, repr=False)


@dataclass
class Row:
    """One path of the table."""

    path: str
    command: str
    seconds: float
    peak_gb: float
    rc: int
    dominated_by: str
    eta_error_pct: float | None = None
    llama_tool: str = ""
    llama_seconds: float | None = None
    llama_peak_gb: float | None = None


def run(argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> Run:
    """Run ``argv``; wall time, peak RSS (the child's ``ru_maxrss``) and its merged output lines, timed."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=0)
    lines: list[tuple[float, str]] = []
    buf = b""
    assert proc.stdout is not None
    while chunk := proc.stdout.read(4096):
        buf += chunk
        *done, buf = re.split(rb"[\r\n]", buf)
        now = time.monotonic() - t0
        lines += [(now, ln.decode("utf-8", "replace").strip()) for ln in done if ln.strip()]
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - t0
    if log is not None:
        log.write_text("\n".join(f"{t:9.2f} {ln}" for t, ln in lines) + "\n")
    return Run(seconds, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status), lines)


def _eta_seconds(text: str) -> float | None:
    m = _ETA.search(text)
    if not m or not m.group(1).strip():
        return None
    units = {"h": 3600, "min": 60, "s": 1}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+)\s*(h|min|s)\b", m.group(1))))


def _step(msg: str) -> str:
    """A progress message reduced to its kind of step: ``gptq mlp.down_proj``, ``head``, ``embeddings``."""
    msg = _ETA.sub("", msg).split("·")[0]
    msg = re.sub(r"^layer \d+/\d+:\s*", "", msg).strip()
    msg = re.sub(r"model\.layers\.\d+\.", "", msg)
    msg = re.sub(r"\.weight\b", "", msg)
    msg = re.sub(r"\d+/\d+", "", msg)
    return re.sub(r"\s+", " ", msg).strip() or "start-up"


def dominated_by(r: Run) -> str:
    """The step whose progress lines cover the most time, with its share of the wall time."""
    spans: dict[str, float] = {}
    prev_t, prev = 0.0, "start-up (imports, reading)"
    for t, ln in r.lines:
        m = _PROGRESS.match(ln)
        if not m:
            continue
        spans[prev] = spans.get(prev, 0.0) + t - prev_t
        prev_t, prev = t, _step(m.group(2))
    spans[prev] = spans.get(prev, 0.0) + r.seconds - prev_t
    top = max(spans, key=lambda k: spans[k])
    return f"{top} ({100 * spans[top] / max(r.seconds, 1e-9):.0f}%)"


def eta_error(r: Run) -> float | None:
    """Percent error of the total predicted when the progress leaves layer 1 (elapsed + ETA), the last time
    it does: a scan or a budget export runs a calibration first, whose own first layer says only how long
    that short run has left."""
    err = None
    in_first = False
    for t, ln in r.lines:
        m = _PROGRESS.match(ln)
        if not m:
            continue
        if re.match(r"layer 1/\d+", m.group(2)):
            in_first = True
        elif in_first:
            eta = _eta_seconds(m.group(2))
            if eta is not None:
                err = 100.0 * (t + eta - r.seconds) / r.seconds
                in_first = False
    return err


def _calib_text(work: Path, ctx: int, chunks: int) -> Path:
    # the same text for both sides, repeated until it holds the chunks (about 3.5 characters a token)
    parts = [ROOT / "resources" / "calibration" / n for n in ("prose.txt", "code.txt", "languages.txt")]
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in parts)
    reps = max(1, math.ceil(ctx * chunks * 4.5 / len(text)))
    out = work / f"calib-{ctx}x{chunks}.txt"
    out.write_text("\n\n".join([text] * reps), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the table and print it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--work", type=Path, required=True, help="folder for outputs (GGUFs, logs)")
    ap.add_argument("--paths", default=",".join(ALL_PATHS))
    ap.add_argument("--calib-ctx", type=int, default=128)
    ap.add_argument("--calib-chunks", type=int, default=2)
    ap.add_argument(
        "--llama-bin", type=Path, default=Path(os.environ.get("QS_LLAMA_BIN", "/work/llama.cpp/build/bin"))
    )
    ap.add_argument("--converter", type=Path, default=Path("/work/llama.cpp/convert_hf_to_gguf.py"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--device", default="cpu", help="where the studio's calibrated paths run (cpu, cuda, mps)"
    )
    ap.add_argument("--no-llama", action="store_true", help="leave llama.cpp's tools out (no build at hand)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args(argv)
    paths = [p.strip() for p in a.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(ALL_PATHS))
    if unknown:
        ap.error(f"unknown paths: {', '.join(unknown)}")
    a.work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": str(a.threads),
    }
    cli = [sys.executable, "-m", "studio.cli"]
    model, work, ctx, n = str(a.model), a.work, a.calib_ctx, a.calib_chunks
    text = _calib_text(work, ctx, n)
    dev = ["--device", a.device]
    calib = ["--calib-text", str(text), "--calib-ctx", str(ctx), "--calib-chunks", str(n), *dev]
    scan_ctx = ["--scan-ctx", str(min(128, ctx)), "--no-cache"]  # the scan's chunks fit the calibration's
    q4 = work / "studio-Q4_K_M.gguf"
    llama_q4 = work / "llama-Q4_K_M.gguf"
    bf16 = work / "llama-bf16.gguf"
    rows: list[Row] = []

    def studio(name: str, args: list[str]) -> Run:
        r = run([*cli, *args], env, work / f"{name}.log")
        cmd = "quant-studio-cli " + " ".join(args)
        rows.append(Row(name, cmd, round(r.seconds, 1), round(r.peak / 1e9, 2), r.rc, dominated_by(r)))
        if name not in ("inspect", "export", "eval"):
            err = eta_error(r)
            rows[-1].eta_error_pct = None if err is None else round(err, 1)
        print(f"{name}: {r.seconds:.1f} s, {r.peak / 1e9:.2f} GB, rc {r.rc}", file=sys.stderr, flush=True)
        if a.json:  # after every path, so a run stopped partway keeps what it measured
            a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
        return r

    def beside(tool: str, runs: list[Run]) -> None:
        rows[-1].llama_tool = tool
        rows[-1].llama_seconds = round(sum(r.seconds for r in runs), 1)
        rows[-1].llama_peak_gb = round(max(r.peak for r in runs) / 1e9, 2)
        if any(r.rc for r in runs):
            rows[-1].llama_tool += " (failed)"

    lb = a.llama_bin
    thr = ["-t", str(a.threads)]
    if "inspect" in paths:
        studio("inspect", ["inspect", model])
    if "export" in paths or (("best" in paths or "eval" in paths) and not q4.is_file()):
        studio("export", ["export", model, "-o", str(q4), "--preset", "Q4_K_M"])
    if ("export" in paths or "best" in paths or "eval" in paths) and not a.no_llama:
        conv = run([sys.executable, str(a.converter), model, "--outtype", "bf16", "--outfile", str(bf16)], env,
                   work / "llama-convert.log")  # fmt: skip
        quant = run([str(lb / "llama-quantize"), str(bf16), str(llama_q4), "Q4_K_M", str(a.threads)], env,
                    work / "llama-quantize.log")  # fmt: skip
        beside(f"convert {conv.seconds:.0f} s + llama-quantize {quant.seconds:.0f} s", [conv, quant])
    if "export" not in paths:  # made only as best's budget and eval's variant
        rows[:] = [r for r in rows if r.path != "export"]
    if "calibrate" in paths:
        studio("calibrate", ["calibrate", model, "-o", str(work / "studio-imatrix.gguf"), "--text", str(text),
                             "--ctx", str(ctx), "--chunks", str(n), *dev])  # fmt: skip
        if bf16.is_file() and not a.no_llama:
            imx = [
                str(lb / "llama-imatrix"),
                "-m",
                str(bf16),
                "-f",
                str(text),
                "-c",
                str(ctx),
                "--chunks",
                str(n),
            ]
            beside("llama-imatrix", [run([*imx, *thr, "-o", str(work / "llama-imatrix.gguf")], env,
                                         work / "llama-imatrix.log")])  # fmt: skip
    for method in ("gptq", "awq", "awq+gptq"):
        if method in paths:
            out = work / f"studio-Q4_K_M-{method.replace('+', '-')}.gguf"
            studio(
                method, ["export", model, "-o", str(out), "--preset", "Q4_K_M", "--method", method, *calib]
            )
    if "scan" in paths:
        studio("scan", ["sensitivity", model, "-o", str(work / "scan.json"), *calib, *scan_ctx])
    if "best" in paths and q4.is_file():
        budget = str(q4.stat().st_size)
        studio("best", ["export", model, "-o", str(work / "studio-best.gguf"), "--budget", budget,
                        "--method", "best", *calib, *scan_ctx])  # fmt: skip
    if "eval" in paths and q4.is_file():
        studio("eval", ["eval", "--original", model, "--variant", str(q4), "--text", str(text), "--ctx", str(ctx),
                        "--chunks", str(n), *dev])  # fmt: skip
        if llama_q4.is_file() and not a.no_llama:
            ppl = [str(lb / "llama-perplexity"), "-m", str(llama_q4), "-f", str(text), "-c", str(ctx)]
            beside("llama-perplexity (variant only)", [run([*ppl, "--chunks", str(n), *thr], env,
                                                           work / "llama-perplexity.log")])  # fmt: skip

    print(
        f"\n{a.model.name}: calibration {n} chunks of {ctx} tokens, {a.threads} threads, device {a.device}\n"
    )
    print(
        "| path | seconds | peak RSS | ETA error after layer 1 | llama.cpp | its seconds | its peak | time ratio | dominated by |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        eta = "" if r.eta_error_pct is None else f"{r.eta_error_pct:+.0f}%"
        ratio = f"{r.seconds / r.llama_seconds:.2f}×" if r.llama_seconds else ""
        lt = "" if r.llama_seconds is None else f"{r.llama_seconds:.0f}"
        lp = "" if r.llama_peak_gb is None else f"{r.llama_peak_gb:.2f} GB"
        bad = "" if r.rc == 0 else f" (rc {r.rc})"
        print(f"| {r.path}{bad} | {r.seconds:.0f} | {r.peak_gb:.2f} GB | {eta} | {r.llama_tool} | {lt} | {lp} | "
              f"{ratio} | {r.dominated_by} |")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    shutil.rmtree(work / "__pycache__", ignore_errors=True)
    return 0 if all(r.rc == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
