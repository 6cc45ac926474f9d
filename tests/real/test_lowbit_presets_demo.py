"""Every low-bit preset of the pinned llama-quantize on the demo (SmolLM2-135M-Instruct) with llama-imatrix's
file: the studio's export equals ``llama-quantize --imatrix``'s tensor for tensor, byte for byte.

The demo's widths are 576 (hidden) and 1536 (FFN): only ffn_down's rows (1536 = 6 × 256) take the 256-weight
lattice and ternary types; rows of 576 fall back as llama.cpp's tensor_type_fallback says (IQ4_NL for the
i-quants, Q4_0 for TQ1_0/TQ2_0/Q2_K), and Q1_0 (blocks of 128) has no fallback there: llama-quantize stops,
and the studio refuses the preset in one sentence. Q2_0's blocks of 64 divide 576: its tensors are written as
Q2_0 (ggml type 42, which gguf-py 0.19 cannot name, so both files are read with the studio's reader).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from studio.core.errors import QuantizationError
from studio.core.plan.estimate import LOW_BIT_PRESETS
from tests.core.export.test_lowbit_presets import _read, llama_tool

pytestmark = [pytest.mark.real, pytest.mark.slow]  # minutes per preset on a loaded machine


@pytest.fixture(scope="module")
def demo_imatrix(demo_export, tmp_path_factory) -> Path:
    """llama-imatrix's file for the demo's F32 export, on the built-in prose (4 chunks of 128 tokens)."""
    from studio.core.calib.data import builtin_dir

    f32 = demo_export("F32")
    out = tmp_path_factory.mktemp("demo-imatrix") / "demo.imatrix.gguf"
    cmd = [str(llama_tool("llama-imatrix")), "-m", str(f32), "-f", str(builtin_dir() / "prose.txt")]
    cmd += ["-o", str(out), "-c", "128", "--chunks", "4", "-t", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and out.is_file(), (r.stdout + r.stderr)[-2000:]
    return out


@pytest.mark.parametrize("preset", LOW_BIT_PRESETS)
def test_demo_low_bit_preset_equals_llama_quantize_imatrix(
    preset, demo_dir, demo_export, demo_imatrix, tmp_path
):
    from studio.core.calib.imatrix import read_imatrix
    from studio.core.export.run import export_gguf

    ref = tmp_path / "ref.gguf"
    cmd = [
        str(llama_tool("llama-quantize")),
        "--imatrix",
        str(demo_imatrix),
        str(demo_export("F32")),
        str(ref),
    ]
    r = subprocess.run([*cmd, preset, "1"], capture_output=True, text=True, timeout=1200)
    if preset == "Q1_0":  # rows of 576 are not a multiple of 128, and Q1_0 has no fallback type
        assert r.returncode != 0 and "no tensor type fallback is defined for type q1_0" in r.stdout + r.stderr
        with pytest.raises(QuantizationError, match="has no fallback type for Q1_0"):
            export_gguf(demo_dir, tmp_path / "ours.gguf", preset, imatrix=read_imatrix(demo_imatrix))
        assert not (tmp_path / "ours.gguf").exists()
        return
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    ours = export_gguf(demo_dir, tmp_path / "ours.gguf", preset, imatrix=read_imatrix(demo_imatrix))
    a, b = _read(ours.path), _read(ref)
    assert set(a) == set(b)
    for name, (t, data) in b.items():
        assert a[name][0] == t, f"{preset} {name}: {a[name][0]} vs llama.cpp {t}"
        assert a[name][1] == data, f"{preset} {name} ({t}): bytes differ from llama-quantize"
