"""``--cluster`` without Ray: one sentence saying how to install it; the studio never imports Ray
unless a cluster is asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.calib.conftest import calib_text  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
NO_RAY = "import sys; sys.modules['ray'] = None; from studio.cli import main; sys.exit(main(sys.argv[1:]))"


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["calibrate", "MODEL", "-o", "im.gguf", "--cluster", "local:2"],
        ["sensitivity", "MODEL", "--cluster", "local:2"],
        ["plan", "MODEL", "--budget", "4.5bpw", "-o", "p.json", "--cluster", "auto"],
        [
            "export",
            "MODEL",
            "-o",
            "x.gguf",
            "--preset",
            "Q4_K_M",
            "--method",
            "gptq",
            "--cluster",
            "ray://h:10001",
        ],
        ["eval", "--original", "MODEL", "--variant", "a.gguf", "--cluster", "local:2"],
    ],
)
def test_cluster_without_ray_says_how_to_install_it(llama_model, tmp_path, argv):
    argv = [
        str(llama_model) if a == "MODEL" else str(tmp_path / a) if a.endswith((".json", ".gguf")) else a
        for a in argv
    ]
    r = _run(NO_RAY, *argv)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: --cluster needs Ray, which is not installed: pip install 'quant-studio[cluster]' (or pip install ray)."
    )
    assert not list(tmp_path.iterdir())  # refused before any work


def test_a_malformed_cluster_is_one_sentence(llama_model):
    r = _run(NO_RAY, "sensitivity", str(llama_model), "--cluster", "local:zero")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: 'local:zero' is not a cluster: use auto, local:N")


def test_start_up_and_a_scan_do_not_import_ray(llama_model, calib_text):  # noqa: F811
    code = (
        "import sys\n"
        "import studio.app, studio.cli, studio.core.executor, studio.commands._scan\n"
        "from studio.cli import main\n"
        f"rc = main(['sensitivity', {str(llama_model)!r}, '--calib-text', {str(calib_text)!r}, '--calib-ctx', '64',"
        " '--calib-chunks', '2', '--types', 'Q8_0', '--scan-ctx', '16', '--scan-chunks', '1', '--no-cache', '--json'])\n"
        "assert rc == 0, rc\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
        "print('no ray')\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("no ray")
