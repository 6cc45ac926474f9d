"""Bad input before work (issue 26): for every subcommand a missing path or a wrong kind of file
fails within 3 s with one sentence, before any model is loaded.

Every case runs in one fresh child process (``_CHILD``), so "before any model is loaded" is checked
for real: torch, transformers and llama_cpp must still be unimported after the command failed. The
other arguments are valid (a real tiny model folder, a real GGUF header), so without the check each
command would start its work (load the original, calibrate, scan) and fail much later.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from studio.cli import COMMANDS, build_parser
from studio.commands._check import SPECS, Kind, PathArg

HEAVY = ("torch", "transformers", "llama_cpp")

_CHILD = (
    f"HEAVY = {HEAVY!r}\n"
    + r"""
import json, sys, time
t_import = time.monotonic()
from studio.cli import main
import io, contextlib
cases = json.loads(sys.argv[1])
out = {}
for name, argv in cases.items():
    err = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    out[name] = {
        "rc": rc,
        "seconds": time.monotonic() - t0,
        "stderr": err.getvalue(),
        "heavy": [m for m in HEAVY if m in sys.modules],
    }
print(json.dumps(out))
"""
)


def _cases(model: Path, gguf: Path, text: Path, binary: Path, tmp: Path) -> dict[str, tuple[list[str], str]]:
    """``name: (argv, what stderr must say)``: two per subcommand that takes a path (missing, wrong kind)."""
    m, g, t, b = str(model), str(gguf), str(text), str(binary)
    missing = str(tmp / "missing.gguf")
    gone = str(tmp / "nowhere")
    out = str(tmp / "out.gguf")
    return {
        "inspect-missing": (["inspect", gone], "does not exist"),
        "inspect-kind": (["inspect", t], "is neither a GGUF file"),
        "export-missing": (
            ["export", m, "-o", out, "--preset", "Q8_0", "--imatrix", missing],
            "does not exist",
        ),
        "export-kind": (
            ["export", m, "-o", out, "--method", "gptq", "--preset", "Q4_K_M", "--calib-text", b],
            "not UTF-8",
        ),
        "export-plan-kind": (["export", m, "-o", out, "--plan", t], "is not a JSON file"),
        "export-outdir": (
            ["export", m, "-o", str(tmp / "no" / "x.gguf"), "--preset", "Q8_0"],
            "does not exist",
        ),
        "eval-missing": (["eval", "--original", m, "--variant", g, "--variant", missing], "does not exist"),
        "eval-kind": (["eval", "--original", m, "--variant", t], "is not a GGUF file"),
        "eval-text-kind": (["eval", "--original", m, "--variant", g, "--text", b], "not UTF-8"),
        "chat-missing": (["chat", "--model", m, "--compare", missing, "--prompt", "hi"], "does not exist"),
        "chat-kind": (["chat", "--model", m, "--compare", t, "--prompt", "hi"], "is neither a GGUF file"),
        "calibrate-missing": (["calibrate", m, "-o", out, "--text", gone], "does not exist"),
        "calibrate-kind": (["calibrate", m, "-o", out, "--text", b], "not UTF-8"),
        "sensitivity-missing": (["sensitivity", m, "--calib-text", gone], "does not exist"),
        "sensitivity-kind": (["sensitivity", m, "--scan", t], "is not a JSON file"),
        "plan-missing": (
            ["plan", m, "--budget", "4bpw", "-o", str(tmp / "p.json"), "--scan", gone],
            "does not exist",
        ),
        "plan-kind": (
            ["plan", m, "--budget", "4bpw", "-o", str(tmp / "p.json"), "--calib-text", b],
            "not UTF-8",
        ),
        "sweep-missing": (["sweep", gone, "--tensor", "x"], "does not exist"),
        "sweep-kind": (["sweep", t, "--tensor", "x"], "is neither a GGUF file"),
        "memory-missing": (["memory", gone, "--ctx", "512"], "does not exist"),
        "memory-kind": (["memory", t, "--ctx", "512"], "is neither a GGUF file"),
        "qat-missing": (["qat", m, "--bits", "4", "--steps", "1", "--text", gone], "does not exist"),
        "qat-kind": (["qat", g, "--bits", "4", "--steps", "1", "--text", t], "is a GGUF file"),
        "hub-upload-missing": (["hub", "upload", missing, "--repo", "me/x"], "does not exist"),
        "hub-upload-kind": (["hub", "upload", t, "--repo", "me/x"], "is not a GGUF file"),
        "hub-cache-kind": (["hub", "cache", "--cache-dir", t], "is not a folder"),
        "hub-download-kind": (["hub", "download", "org/model", "--cache-dir", t], "is a file, not a folder"),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory, llama_model):
    tmp = tmp_path_factory.mktemp("bad-input")
    gguf = tmp / "real-header.gguf"
    gguf.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    text = tmp / "notes.txt"
    text.write_text("just some notes, not a model\n", encoding="utf-8")
    binary = tmp / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    cases = _cases(llama_model, gguf, text, binary, tmp)
    argv = {name: a for name, (a, _) in cases.items()}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cases, json.loads(proc.stdout.strip().splitlines()[-1])


CASE_NAMES = sorted(
    _cases(Path("m"), Path("g"), Path("t"), Path("b"), Path("/tmp")).keys(),
)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_path_fails_fast_before_any_model_is_loaded(results, name):
    cases, got = results
    want = cases[name][1]
    r = got[name]
    assert r["rc"] == 2, r
    assert want in r["stderr"], r["stderr"]
    assert r["stderr"].startswith("error: ") and r["stderr"].count("\n") == 1, r["stderr"]  # one sentence
    assert r["seconds"] < 3.0, r
    assert r["heavy"] == [], f"{name} imported {r['heavy']} before refusing its input"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


PATH_WORDS = ("FILE", "MODEL", "DIR", "OUT", "TRAIN", "EVAL")


def _names_a_path(meta: str) -> bool:
    """Whether an argument's metavar names a file, folder or model (``A``/``B`` are chat's models)."""
    return (
        meta in ("A", "B")
        or any(w in meta for w in PATH_WORDS)
        or meta.lower().endswith((".json", ".jsonl", ".gguf", ".txt"))
    )


def test_every_subcommand_has_its_paths_in_the_check_table():
    # a new path option that the table does not know would skip the check: every argument whose
    # metavar names a file, folder or model must be in SPECS under its subcommand
    subs = _subparsers(build_parser())
    assert {s.replace("-", "_") for s in subs} == set(COMMANDS)  # bench-model: module bench_model
    covered = 0
    for name, p in subs.items():
        nested = _subparsers(p)
        for key, parser in ({f"{name} {k}": v for k, v in nested.items()} if nested else {name: p}).items():
            assert key in SPECS, f"{key} is not in studio.commands._check.SPECS"
            checked = {s.dest for s in SPECS[key] if isinstance(s, PathArg)}
            for a in parser._actions:
                meta = a.metavar if isinstance(a.metavar, str) else ""
                if meta and a.type in (None, str) and _names_a_path(meta):
                    if meta in ("REPO", "USER/NAME"):
                        continue
                    assert a.dest in checked, f"{key}: {a.dest} ({meta}) is not checked"
                    covered += 1
    assert covered >= 20
    assert all(isinstance(s.kind, Kind) for specs in SPECS.values() for s in specs if isinstance(s, PathArg))
