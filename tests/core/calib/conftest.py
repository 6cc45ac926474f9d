"""Fixtures for the calibration tests: a calibration text, a tiny model's activation statistics, llama.cpp's tools."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CTX = 64
CHUNKS = 6

LLAMA_BIN = Path(
    os.environ.get("QS_LLAMA_BIN", "/work/tools/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
)


def llama_tool(name: str) -> Path:
    """A llama.cpp command-line tool, or skip the test (CI has no such build unless it makes one)."""
    p = LLAMA_BIN / name
    if not p.is_file():
        pytest.skip(f"{name} is not built at {LLAMA_BIN} (set QS_LLAMA_BIN to a llama.cpp build/bin folder)")
    return p


@pytest.fixture(scope="session")
def calib_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A UTF-8 text long enough for a few chunks of 64 tokens (the factory's multilingual sample, twice)."""
    from studio.core.factory import sample_text

    p = tmp_path_factory.mktemp("calib-text") / "calib.txt"
    p.write_text(sample_text() * 2, encoding="utf-8")
    return p


@pytest.fixture(scope="session")
def llama_stats(llama_model: Path, calib_text: Path):
    """Activation statistics of the tiny llama over CHUNKS chunks of CTX tokens (CPU, float32)."""
    from studio.core.calib import calibrate

    return calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu")


@pytest.fixture(scope="session")
def llama_imatrix_file(llama_model: Path, llama_stats, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama's imatrix written as GGUF."""
    from studio.core.calib.imatrix import imatrix_from_stats, write_imatrix
    from studio.core.model import open_model

    with open_model(llama_model) as ck:
        im = imatrix_from_stats(llama_stats, ck.info)
    out = tmp_path_factory.mktemp("imatrix") / "llama.imatrix.gguf"
    write_imatrix(im, out)
    return out
