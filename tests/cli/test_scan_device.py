"""``--device`` reaches the calibration and the scan of ``sensitivity``, ``plan`` and ``export --budget``
(before, the scan always ran on the CPU whatever the export's ``--device`` said)."""

from __future__ import annotations

import pytest

from studio.cli import main

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.mark.parametrize(
    "argv",
    [
        ["sensitivity", "{m}"],
        ["plan", "{m}", "--budget", "4.5bpw", "-o", "{t}/p.json"],
        ["export", "{m}", "-o", "{t}/m.gguf", "--budget", "4.5bpw"],
    ],
    ids=["sensitivity", "plan", "export-budget"],
)
def test_the_scan_runs_where_device_says(argv, llama_model, tmp_path, capsys):
    args = [a.format(m=llama_model, t=tmp_path) for a in argv]
    assert main([*args, "--device", "cuda", "--no-cache", "--calib-ctx", "64", "--calib-chunks", "2"]) != 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and not ln.startswith("[")]
    assert err[-1] == "error: CUDA was chosen but no CUDA device is available. Choose cpu."
    assert not list(tmp_path.iterdir())
