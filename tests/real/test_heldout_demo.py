"""Budget plans on the demo judged on text of another kind than their calibration text, by llama.cpp.

Calibrated on English prose the studio does not ship (the GNU GPL-3, GFDL-1.3 and Apache-2.0 licence
texts of ``/usr/share/common-licenses``, 69 KB, one after another), judged by ``llama-perplexity
--kl-divergence`` (ctx 512) on Python source (``resources/eval/code_python.txt``, never calibrated on),
against llama.cpp's own Q4_K_M and Q3_K_M with an imatrix of the same prose, at their file sizes:
``export --budget`` must reach at most 0.50× their KLD with method imatrix and 0.30× with the best
method (awq+gptq). Q4_1 and Q5_1 are excluded: the demo's weights were dequantized from a Q4_1 file.
The same runs as ``bench/heldout_quality.py``; the README's table comes from it.

Slow (calibrations, scans and exports of SmolLM2-135M; over an hour on 2 busy cores, the awq+gptq
exports most): ``-m slow``; skipped without llama.cpp's tools (``QS_LLAMA_BIN``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from studio.cli import main
from studio.paths import resource_path

pytestmark = [pytest.mark.real, pytest.mark.slow]

LLAMA_BIN = Path(os.environ.get("QS_LLAMA_BIN", "/work/llama.cpp/build/bin"))
LICENCES = Path("/usr/share/common-licenses")
CALIB_PARTS = ("GPL-3", "GFDL-1.3", "Apache-2.0")
EVAL = resource_path("eval", "code_python.txt")
LIMITS = {"imatrix": 0.50, "best": 0.30}


def _run(*cmd: str) -> str:
    res = subprocess.run(list(cmd), capture_output=True, text=True, check=True)
    return res.stdout + res.stderr


def _kld(gguf: Path, base: Path) -> float:
    out = _run(
        str(LLAMA_BIN / "llama-perplexity"), "-m", str(gguf), "-c", "512", "--kl-divergence-base", str(base),
        "--kl-divergence", "--no-repack",
    )  # fmt: skip
    return float(re.search(r"Mean\s+KLD:\s+([0-9.eE+-]+)", out).group(1))


@pytest.fixture(scope="module")
def reference(demo_dir, tmp_path_factory):
    """(folder, base logits, {preset: (file bytes, KLD)}) of llama.cpp's presets with the prose imatrix."""
    for tool in ("llama-perplexity", "llama-imatrix", "llama-quantize"):
        if not (LLAMA_BIN / tool).is_file():
            pytest.skip(
                f"{tool} is not built at {LLAMA_BIN} (set QS_LLAMA_BIN to a llama.cpp build/bin folder)"
            )
    if not all((LICENCES / p).is_file() for p in CALIB_PARTS):
        pytest.skip(f"the calibration prose ({', '.join(CALIB_PARTS)}) is not in {LICENCES}")
    from studio.core.export.run import export_gguf

    root = tmp_path_factory.mktemp("heldout")
    calib = root / "calib_licences.txt"
    calib.write_bytes(b"".join((LICENCES / p).read_bytes() for p in CALIB_PARTS))
    f32 = root / "f32.gguf"
    export_gguf(demo_dir, f32, "F32")
    base = root / "base.kld"
    _run(str(LLAMA_BIN / "llama-perplexity"), "-m", str(f32), "-f", str(EVAL), "-c", "512",
         "--kl-divergence-base", str(base), "--no-repack")  # fmt: skip
    imx = root / "imatrix.gguf"
    _run(str(LLAMA_BIN / "llama-imatrix"), "-m", str(f32), "-f", str(calib), "-c", "512", "-o", str(imx),
         "--no-repack")  # fmt: skip
    refs = {}
    for preset in ("Q4_K_M", "Q3_K_M"):
        f = root / f"llama-{preset}.gguf"
        _run(str(LLAMA_BIN / "llama-quantize"), "--imatrix", str(imx), str(f32), str(f), preset)
        refs[preset] = (f.stat().st_size, _kld(f, base))
    return root, base, refs, calib


@pytest.mark.parametrize("method", ["imatrix", "best"])
@pytest.mark.parametrize("preset", ["Q4_K_M", "Q3_K_M"])
def test_budget_plans_hold_on_text_of_another_kind(demo_dir, reference, preset, method, monkeypatch):
    root, base, refs, calib = reference
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(root / "cache"))  # one scan serves every case
    size, ref_kld = refs[preset]
    out = root / f"budget-{preset}-{method}.gguf"
    argv = ["export", str(demo_dir), "-o", str(out), "--budget", str(size), "--calib-text", str(calib)]
    assert main([*argv, "--exclude", "Q4_1,Q5_1", "--method", method]) == 0
    assert out.stat().st_size <= size
    kld = _kld(out, base)
    assert kld <= LIMITS[method] * ref_kld, (preset, method, kld, ref_kld)
