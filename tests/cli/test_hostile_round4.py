"""Hostile input, round 4 (issue 39): every row of the probe's table, and a FIFO for every file option.

Each row runs the real CLI in its own process, forked from one driver child that imported
``studio.cli`` once (so the rows stay independent and fast): in a new process group, under an
RLIMIT_AS of 2 GB, killed at ``ROW_LIMIT_S``. A row passes when it exits 2 with one ``error:`` line
naming the option, no traceback, within the limit, nothing in its output folder, and no process of
its group left running.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from studio.cli import build_parser
from studio.commands import _numbers
from studio.commands._check import SPECS, Kind, PathArg
from tests.hostile_children import HOLD, child_env, leftovers

ROOT = Path(__file__).resolve().parents[2]
ROW_LIMIT_S = 10.0
MEMORY_LIMIT = 2 << 30

DRIVER = r"""
import json, os, resource, signal, sys, time
cases, limit_s, out_dir, mem = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
from studio.cli import main  # once; each row runs in a fork of this process
results = {}
for name, argv in cases.items():
    err_path = os.path.join(out_dir, name + ".stderr")
    sys.stdout.flush(); sys.stderr.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except BaseException:
            import traceback
            traceback.print_exc()
            rc = 99
        sys.stderr.flush()
        os._exit(rc)
    status, timed_out = None, False
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() - t0 > limit_s:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
        else:
            time.sleep(0.01)
    seconds = time.monotonic() - t0
    left = False  # a process of the row's group still running (a child it did not end)
    t1 = time.monotonic()
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() - t1 > 3.0:
            left = True
            os.killpg(pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    with open(err_path, encoding="utf-8", errors="replace") as f:
        stderr = f.read()
    results[name] = {"rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out,
                     "seconds": seconds, "stderr": stderr, "left_running": left}
print(json.dumps(results))
"""

HUGE = "1" + "0" * 4000  # 10^4000
TWO_64 = str(2**64)


def _plan_with_pattern(path: Path, pattern: str) -> Path:
    """A recipe-only plan (remade for the model, so its override pattern is compiled)."""
    plan = {
        "version": 1,
        "name": "Q8_0",
        "ftype": 7,
        "recipe": {"kind": "preset", "preset": "Q8_0", "overrides": [[pattern, "Q8_0"]]},
    }
    path.write_text(json.dumps(plan), encoding="utf-8")
    return path


def _files(tmp: Path) -> dict[str, Path]:
    f = {
        "fifo": tmp / "fifo",
        "deep_list": tmp / "deep-list.json",
        "deep_obj": tmp / "deep-obj.json",
        "null": tmp / "null.json",
        "list": tmp / "list.json",
        "gguf": tmp / "header.gguf",
        "text": tmp / "text.txt",
    }
    os.mkfifo(f["fifo"])
    f["deep_list"].write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    f["deep_obj"].write_text('{"a":' * 100_000 + "1" + "}" * 100_000, encoding="utf-8")
    f["null"].write_text("null", encoding="utf-8")
    f["list"].write_text("[1, 2, 3]", encoding="utf-8")
    f["gguf"].write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    f["text"].write_text("some calibration text\n" * 20, encoding="utf-8")
    f["plan_recursive"] = _plan_with_pattern(tmp / "plan-recursive.json", "(?R)")
    f["plan_repeat"] = _plan_with_pattern(tmp / "plan-repeat.json", "(?:a{65535}){65535}")
    return f


def _table(m: str, f: dict[str, Path], out: str) -> dict[str, tuple[list[str], str]]:
    """``row: (argv, the option the sentence must name)``: the probe's rows that ended badly."""
    o = f"{out}/x.gguf"
    exp = ["export", m, "-o", o]
    shape = ["--layers", "2", "--kv-heads", "2", "--head-dim", "64"]
    qat = ["qat", m, "--bits", "4", "--text", str(f["text"]), "-o", f"{out}/qat"]
    rows: dict[str, tuple[list[str], str]] = {
        "plan-deep-list": ([*exp, "--plan", str(f["deep_list"])], "--plan"),
        "plan-deep-object": ([*exp, "--plan", str(f["deep_obj"])], "--plan"),
        "scan-deep-list": ([*exp, "--budget", "4bpw", "--scan", str(f["deep_list"])], "--scan"),
        "scan-deep-object": ([*exp, "--budget", "4bpw", "--scan", str(f["deep_obj"])], "--scan"),
        "scan-null": ([*exp, "--budget", "4bpw", "--scan", str(f["null"])], "--scan"),
        "scan-list": ([*exp, "--budget", "4bpw", "--scan", str(f["list"])], "--scan"),
        "plan-scan-null": (
            ["plan", m, "--budget", "4bpw", "-o", f"{out}/p.json", "--scan", str(f["null"])],
            "--scan",
        ),
        "plan-dev-zero": ([*exp, "--plan", "/dev/zero"], "--plan"),
        "scan-dev-zero": ([*exp, "--budget", "4bpw", "--scan", "/dev/zero"], "--scan"),
        "inspect-ctx-huge": (["inspect", m, "--ctx", HUGE], "--ctx"),
        "memory-ctx-huge": (["memory", "--params", "1e9", *shape, "--ctx", HUGE], "--ctx"),
        "memory-params-nan": (["memory", "--params", "nan", *shape, "--ctx", "512"], "--params"),
        "memory-params-inf": (["memory", "--params", "inf", *shape, "--ctx", "512"], "--params"),
        "memory-params-1e309": (["memory", "--params", "1e309", *shape, "--ctx", "512"], "--params"),
        "memory-layers-2^64": (
            [
                "memory",
                "--params",
                "1e9",
                "--layers",
                TWO_64,
                "--kv-heads",
                "2",
                "--head-dim",
                "64",
                "--ctx",
                "512",
            ],
            "--layers",
        ),
        "budget-vram-1e400": ([*exp, "--budget", "vram=1e400"], "budget"),
        "budget-memory-1e400GB": ([*exp, "--budget", "memory:1e400GB"], "budget"),
        "export-ctx-huge": ([*exp, "--budget", "vram=8GB", "--ctx", HUGE], "--ctx"),
        "qat-threads-2^64": ([*qat, "--steps", "1", "--threads", TWO_64], "--threads"),
        "qat-batch-2^64": ([*qat, "--steps", "1", "--batch", TWO_64], "--batch"),
        "qat-eval-chunks-2^64": ([*qat, "--steps", "1", "--eval-chunks", TWO_64], "--eval-chunks"),
        "qat-steps-2^64": ([*qat, "--steps", TWO_64], "--steps"),
        "override-recursive": ([*exp, "--preset", "Q4_K_M", "--override", "(?R)=Q8_0"], "(?R)"),
        "override-repeat": (
            [*exp, "--preset", "Q4_K_M", "--override", "(?:a{65535}){65535}=Q8_0"],
            "a{65535}",
        ),
        "plan-pattern-recursive": ([*exp, "--plan", str(f["plan_recursive"])], "(?R)"),
        "plan-pattern-repeat": ([*exp, "--plan", str(f["plan_repeat"])], "a{65535}"),
    }
    rows.update(_fifo_rows(m, f, out))
    return rows


def _fifo_rows(m: str, f: dict[str, Path], out: str) -> dict[str, tuple[list[str], str]]:
    """A FIFO given as each file option of every subcommand (from ``SPECS``, so a new one is covered)."""
    fifo, g, t = str(f["fifo"]), str(f["gguf"]), str(f["text"])
    base = {  # the other arguments each command needs, all valid
        "export": ["export", m, "-o", f"{out}/x.gguf", "--preset", "Q8_0"],
        "eval": ["eval", "--original", m, "--variant", g],
        "calibrate": ["calibrate", m, "-o", f"{out}/i.gguf"],
        "sensitivity": ["sensitivity", m],
        "plan": ["plan", m, "--budget", "4bpw", "-o", f"{out}/p.json"],
        "qat": ["qat", m, "--bits", "4", "--steps", "1", "--text", t, "-o", f"{out}/qat"],
        "hub upload": ["hub", "upload", "--repo", "me/x"],
    }
    rows = {}
    for cmd, specs in SPECS.items():
        for s in specs:
            if not isinstance(s, PathArg) or s.kind not in (Kind.TEXT, Kind.JSON, Kind.GGUF, Kind.IMATRIX):
                continue
            if cmd not in base:
                raise AssertionError(f"no base arguments for {cmd}: add them here")
            argv = list(base[cmd])
            if s.flag == "--plan":  # a plan replaces the preset (argparse: not both)
                del argv[argv.index("--preset") : argv.index("--preset") + 2]
            if s.flag.startswith("-"):
                if s.flag in argv:  # replace the valid value
                    argv[argv.index(s.flag) + 1] = fifo
                else:
                    argv += [s.flag, fifo]
                named = s.flag
            else:
                argv.insert(2, fifo)  # the positional file (hub upload FILE.gguf)
                named = "fifo"
            rows[f"fifo-{cmd.replace(' ', '-')}-{s.dest}"] = (argv, named)
    return rows


@pytest.fixture(scope="module")
def probe(tmp_path_factory, llama_model):
    tmp = tmp_path_factory.mktemp("round4")
    files = _files(tmp)
    outs = tmp / "outs"
    outs.mkdir()
    table = {}
    for name, (argv, named) in _table(str(llama_model), files, "OUT").items():
        (outs / name).mkdir()
        table[name] = (
            [a.replace("OUT", str(outs / name)) if a.startswith("OUT") else a for a in argv],
            named,
        )
    logs = tmp / "logs"
    logs.mkdir()
    env = {**child_env(), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            json.dumps({k: v[0] for k, v in table.items()}),
            str(ROW_LIMIT_S),
            str(logs),
            str(MEMORY_LIMIT),
        ],
        capture_output=True,
        text=True,
        timeout=30 + 15 * len(table),
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return table, json.loads(proc.stdout.strip().splitlines()[-1]), outs


ROW_NAMES = sorted(
    _table(
        "m",
        {
            k: Path(k)
            for k in (
                "fifo",
                "deep_list",
                "deep_obj",
                "null",
                "list",
                "gguf",
                "text",
                "plan_recursive",
                "plan_repeat",
            )
        },
        "OUT",
    )
)


@pytest.mark.parametrize("row", ROW_NAMES)
def test_hostile_row_is_one_sentence_and_leaves_nothing(probe, row):
    table, results, outs = probe
    r, named = results[row], table[row][1]
    assert not r["timed_out"], f"{row} ran past {ROW_LIMIT_S} s"
    assert r["rc"] == 2, r
    assert "Traceback" not in r["stderr"], r["stderr"][-2000:]
    last = r["stderr"].strip().splitlines()[-1]
    assert "error:" in last and named in last, r["stderr"][-2000:]  # the sentence names the option
    if row.startswith("fifo-"):  # refused for being a FIFO, not for another reason
        assert "pipe (FIFO), not a regular file" in last, last
    assert len(last) < 400, last
    assert not r["left_running"], f"{row} left a child process running"
    assert list((outs / row).iterdir()) == [], f"{row} left files behind"


def _actions(parser: argparse.ArgumentParser):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                yield from _actions(sub)
        else:
            yield a


def test_every_numeric_option_has_a_range_in_its_help():
    # the door for numbers: no bare int/float type, every ranged type's range shown in --help
    ranged = 0
    for a in _actions(build_parser()):
        assert a.type not in (int, float), f"{a.option_strings} takes a bare {a.type.__name__}"
        assert not isinstance(a.type, (_numbers.Whole, _numbers.Real)), "annotate binds every ranged type"
        if isinstance(a.type, _numbers._Option):
            assert f"range: {a.type.range_text}" in (a.help or ""), a.option_strings
            ranged += 1
    assert ranged >= 30


def test_sigterm_during_gptq_export_removes_the_spool_and_says_what_stopped(llama_model, tmp_path):
    from studio.core.factory import sample_text

    calib = tmp_path / "calib.txt"
    calib.write_text(sample_text() * 2, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "held"
    argv = [
        "export",
        str(llama_model),
        "-o",
        str(out / "a.gguf"),
        "--preset",
        "Q4_K_M",
        "--method",
        "gptq",
        "--calib-text",
        str(calib),
        "--calib-ctx",
        "64",
        "--calib-chunks",
        "2",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, "spool", str(flag), *argv],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not flag.exists():
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the export was never held"
            time.sleep(0.05)
        assert any(".spool-" in n for n in os.listdir(out))  # the spool exists while it runs
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=30)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    assert rc == 143, err[-2000:]
    assert "Traceback" not in err
    assert "SIGTERM" in err.strip().splitlines()[-1] and "stopped" in err, err[-2000:]
    assert leftovers(out) == [] and os.listdir(out) == []
    with pytest.raises(ProcessLookupError):  # no child of the export is left running
        os.killpg(proc.pid, 0)
