"""A checkpoint truncated while calibration reads it: one sentence from the CLI, never SIGBUS (issue 25).

The run is a real child process (before the fix it died of SIGBUS, which would take pytest down too).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.hostile_children import ROOT, TRUNCATE, child_env

CLI = (
    TRUNCATE
    + r"""
import sys
from studio.cli import main
sys.exit(main(sys.argv[1:]))
"""
)


def test_truncated_checkpoint_during_calibration_is_one_sentence(llama_model, tmp_path):
    from studio.core.factory import sample_text

    model = tmp_path / "model"
    shutil.copytree(llama_model, model)
    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    out = tmp_path / "imatrix.gguf"
    argv = ["calibrate", str(model), "-o", str(out), "--text", str(text), "--ctx", "64", "--chunks", "2"]
    res = subprocess.run(
        [sys.executable, "-c", CLI, *argv, "--device", "cpu"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])  # SIGBUS was -7
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert "model.safetensors ended" in lines[0] and "truncated" in lines[0]
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
