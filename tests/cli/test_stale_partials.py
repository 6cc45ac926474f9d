"""kill -9 in export, GPTQ export and calibration, then a rerun in the same folder: no partial or spool left
(issue 25). Real child processes, killed with SIGKILL while their partial output exists."""

from __future__ import annotations

import signal

import pytest

from tests.hostile_children import kill_cli_when_held, leftovers, run_cli


@pytest.fixture
def calib_text(tmp_path):
    from studio.core.factory import sample_text

    p = tmp_path / "calib.txt"
    p.write_text(sample_text() * 2, encoding="utf-8")
    return p


def test_export_killed_then_rerun_leaves_no_partial(llama_model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rc = kill_cli_when_held(
        "writer", tmp_path / "held", "export", str(llama_model), "-o", str(out / "a.gguf"), "--preset", "Q8_0"
    )
    assert rc == -signal.SIGKILL
    assert leftovers(out) == ["a.gguf.partial"]  # what kill -9 leaves
    res = run_cli("export", str(llama_model), "-o", str(out / "b.gguf"), "--preset", "Q8_0")
    assert res.returncode == 0, res.stderr
    assert leftovers(out) == [] and sorted(p.name for p in out.iterdir()) == ["b.gguf"]


def test_gptq_export_killed_then_rerun_leaves_no_spool(llama_model, tmp_path, calib_text):
    out = tmp_path / "out"
    out.mkdir()
    args = [
        "--preset",
        "Q4_K_M",
        "--method",
        "gptq",
        "--calib-text",
        str(calib_text),
        "--calib-ctx",
        "64",
        "--calib-chunks",
        "2",
    ]
    rc = kill_cli_when_held(
        "spool", tmp_path / "held", "export", str(llama_model), "-o", str(out / "a.gguf"), *args
    )
    assert rc == -signal.SIGKILL
    left = leftovers(out)
    assert len(left) == 1 and left[0].startswith(".a.spool-") and left[0].endswith(".partial")
    res = run_cli("export", str(llama_model), "-o", str(out / "a.gguf"), *args)
    assert res.returncode == 0, res.stderr
    assert leftovers(out) == [] and sorted(p.name for p in out.iterdir()) == ["a.gguf"]


def test_calibration_killed_then_rerun_leaves_no_partial(llama_model, tmp_path, calib_text):
    out = tmp_path / "out"
    out.mkdir()
    args = ["--text", str(calib_text), "--ctx", "64", "--chunks", "2", "--device", "cpu"]
    rc = kill_cli_when_held(
        "writer", tmp_path / "held", "calibrate", str(llama_model), "-o", str(out / "a.gguf"), *args
    )
    assert rc == -signal.SIGKILL
    assert leftovers(out) == ["a.gguf.partial"]
    res = run_cli("calibrate", str(llama_model), "-o", str(out / "b.gguf"), *args)
    assert res.returncode == 0, res.stderr
    assert leftovers(out) == [] and sorted(p.name for p in out.iterdir()) == ["b.gguf"]
