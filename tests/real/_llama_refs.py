"""llama.cpp's reference files for the demo's held-out tests: the licence prose to calibrate on, the F32 base
logits of Python source, and llama.cpp's presets with the prose's imatrix, each as (file bytes, KLD)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from studio.paths import resource_path

LLAMA_BIN = Path(os.environ.get("QS_LLAMA_BIN", "/work/llama.cpp/build/bin"))
LICENCES = Path("/usr/share/common-licenses")
CALIB_PARTS = ("GPL-3", "GFDL-1.3", "Apache-2.0")
EVAL = resource_path("eval", "code_python.txt")


def run(*cmd: str) -> str:
    """stdout + stderr of a tool that must succeed."""
    res = subprocess.run(list(cmd), capture_output=True, text=True, check=True)
    return res.stdout + res.stderr


def kld(gguf: Path, base: Path) -> float:
    """llama-perplexity's mean KLD of ``gguf`` against the base logits ``base``."""
    out = run(
        str(LLAMA_BIN / "llama-perplexity"), "-m", str(gguf), "-c", "512", "--kl-divergence-base", str(base),
        "--kl-divergence", "--no-repack",
    )  # fmt: skip
    return float(re.search(r"Mean\s+KLD:\s+([0-9.eE+-]+)", out).group(1))


def references(
    demo_dir: Path, root: Path, presets: Sequence[str], *, keep: bool = True
) -> tuple[Path, dict[str, tuple[int, float]], Path]:
    """(base logits, {preset: (file bytes, KLD)}, calibration text) in ``root``; skips without the tools."""
    for tool in ("llama-perplexity", "llama-imatrix", "llama-quantize"):
        if not (LLAMA_BIN / tool).is_file():
            pytest.skip(
                f"{tool} is not built at {LLAMA_BIN} (set QS_LLAMA_BIN to a llama.cpp build/bin folder)"
            )
    if not all((LICENCES / p).is_file() for p in CALIB_PARTS):
        pytest.skip(f"the calibration prose ({', '.join(CALIB_PARTS)}) is not in {LICENCES}")
    from studio.core.export.run import export_gguf

    calib = root / "calib_licences.txt"
    calib.write_bytes(b"".join((LICENCES / p).read_bytes() for p in CALIB_PARTS))
    f32 = root / "f32.gguf"
    export_gguf(demo_dir, f32, "F32")
    base = root / "base.kld"
    run(str(LLAMA_BIN / "llama-perplexity"), "-m", str(f32), "-f", str(EVAL), "-c", "512",
        "--kl-divergence-base", str(base), "--no-repack")  # fmt: skip
    imx = root / "imatrix.gguf"
    run(str(LLAMA_BIN / "llama-imatrix"), "-m", str(f32), "-f", str(calib), "-c", "512", "-o", str(imx),
        "--no-repack")  # fmt: skip
    refs = {}
    for preset in presets:
        f = root / f"llama-{preset}.gguf"
        run(str(LLAMA_BIN / "llama-quantize"), "--imatrix", str(imx), str(f32), str(f), preset)
        refs[preset] = (f.stat().st_size, kld(f, base))
        if not keep:
            f.unlink()
    return base, refs, calib
