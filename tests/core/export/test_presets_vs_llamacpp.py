"""Presets choose, tensor by tensor, the types llama.cpp's own quantizer chooses; a Q4_K_M export
has the same tensor bytes as llama_model_quantize(Q4_K_M) run on our F32 export."""

from __future__ import annotations

from pathlib import Path

import pytest

from studio.core.gguf.arch import layout
from studio.core.model import open_model
from studio.core.quant.presets import PRESETS, preset_choice, preset_types

MODELS = ["llama8", "odd_hidden", "qwen2", "phi3", "gpt2", "gemma", "bert"]
PRESET_NAMES = ["Q4_K_M", "Q3_K_M", "Q5_K_M", "Q4_K_S", "Q3_K_L", "Q2_K", "Q6_K", "Q8_0", "Q4_0", "F16"]
# the arch-dependent rules (tied output, fused qkv, 1-D tensors) show with fewer presets
SHORT_PRESETS = ["Q4_K_M", "Q3_K_M", "Q2_K", "Q8_0"]


def _model(request: pytest.FixtureRequest, which: str) -> Path:
    if which == "llama8":
        # 8 layers so use_more_bits picks a pattern; intermediate 704 = 2.75 × 256 forces fallbacks
        return request.getfixturevalue("tiny_model")("llama", layers=8, intermediate=704)
    return request.getfixturevalue(f"{which}_model")


def _reference(llama_worker, f32: Path, preset: str, out: Path) -> dict[str, tuple[str, bytes]]:
    import gguf

    llama_worker.request("quantize", src=str(f32), dst=str(out), ftype=PRESETS[preset].ftype, nthread=1)
    r = gguf.GGUFReader(out)
    return {t.name: (t.tensor_type.name, bytes(t.data)) for t in r.tensors}


@pytest.mark.parametrize("which", MODELS)
def test_preset_types_equal_llamacpp(which, request, exported, llama_worker, tmp_path):
    model = _model(request, which)
    f32 = exported(model, "F32", "F32")
    with open_model(model) as ck:
        info = ck.info
    to_gguf = {t.hf_name: t.gguf_name for t in layout(info).tensors}
    for preset in PRESET_NAMES if which == "llama8" else SHORT_PRESETS:
        ref = _reference(llama_worker, f32, preset, tmp_path / f"{preset}.gguf")
        ours = {to_gguf[k]: v for k, v in preset_types(info, preset).items()}
        want = {k: v[0] for k, v in ref.items() if k in ours}
        assert set(ref) - set(ours) <= {"rope_freqs.weight"}
        assert ours == want, f"{which} {preset}: " + ", ".join(
            f"{k}: ours {ours[k]} llama.cpp {want[k]}" for k in ours if ours[k] != want[k]
        )


def test_fallbacks_are_listed(request):
    model = _model(request, "llama8")
    with open_model(model) as ck:
        choice = preset_choice(ck.info, "Q4_K_M")
    downs = [f for f in choice.fallbacks if "down_proj" in f.tensor]
    assert len(downs) == 8  # rows of 704 cannot take a 256-block type
    assert {(f.wanted, f.got) for f in downs} == {("Q4_K", "Q5_0"), ("Q6_K", "Q8_0")}
    assert all("704" in f.reason for f in downs)
    assert choice.types[downs[0].tensor] == downs[0].got


@pytest.mark.parametrize("which", ["llama8", "qwen2", "phi3"])
def test_q4km_export_bytes_equal_llamacpp(which, request, exported, llama_worker, tmp_path):
    import gguf

    model = _model(request, which)
    f32 = exported(model, "F32", "F32")
    ours = exported(model, "Q4_K_M", "Q4_K_M")
    ref = _reference(llama_worker, f32, "Q4_K_M", tmp_path / "ref.gguf")
    got = {t.name: (t.tensor_type.name, bytes(t.data)) for t in gguf.GGUFReader(ours).tensors}
    assert set(got) == set(ref)
    for name, (t, data) in ref.items():
        assert got[name][0] == t, f"{name}: {got[name][0]} vs llama.cpp {t}"
        assert got[name][1] == data, f"{name} ({t}): bytes differ from llama_model_quantize"
