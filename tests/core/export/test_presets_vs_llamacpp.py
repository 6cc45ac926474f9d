"""Presets choose, tensor by tensor, the types llama.cpp's own quantizer chooses; a Q4_K_M export
has the same tensor bytes as llama_model_quantize(Q4_K_M) run on our F32 export."""

from __future__ import annotations

from pathlib import Path

import pytest

from studio.core.gguf.layout import layout
from studio.core.model import open_model
from studio.core.plan.presets import PRESETS, preset_choice, preset_types

MODELS = ["llama8", "odd_hidden", "qwen2", "phi3", "gpt2", "gemma", "bert"]
PRESET_NAMES = ["Q4_K_M", "Q3_K_M", "Q5_K_M", "Q4_K_S", "Q3_K_L", "Q2_K", "Q6_K", "Q8_0", "Q4_0", "F16"]
# the presets that were never compared with llama_model_quantize before (issue 10): types and bytes
UNCOMPARED = ["F32", "BF16", "Q5_K_S", "Q5_1", "Q5_0", "Q4_1", "Q3_K_S"]
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
    for preset in PRESET_NAMES + UNCOMPARED if which == "llama8" else SHORT_PRESETS:
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


@pytest.mark.parametrize("preset", UNCOMPARED)
def test_more_preset_exports_equal_llamacpp_byte_for_byte(preset, request, exported, llama_worker, tmp_path):
    import gguf

    model = _model(request, "llama8")
    f32 = exported(model, "F32", "F32")
    ours = exported(model, preset, preset)
    ref = _reference(llama_worker, f32, preset, tmp_path / "ref.gguf")
    r = gguf.GGUFReader(tmp_path / "ref.gguf")
    assert int(r.fields["general.file_type"].parts[-1][0]) == PRESETS[preset].ftype
    got = {t.name: (t.tensor_type.name, bytes(t.data)) for t in gguf.GGUFReader(ours).tensors}
    assert set(got) == set(ref)
    for name, (t, data) in ref.items():
        assert got[name][0] == t, f"{preset} {name}: {got[name][0]} vs llama.cpp {t}"
        assert got[name][1] == data, f"{preset} {name} ({t}): bytes differ from llama_model_quantize"


# llama.cpp's rules that depend on the model's shape: attn_v gets more bits when ≥ 4 query heads share
# a key/value head (Llama-3's 32:8), and Llama-2-70B (80 layers, GQA) bumps Q3_K/Q4_K attn_v to Q5_K
SHAPE_MODELS = {
    "gqa4": dict(hidden=1024, layers=1, heads=32, kv_heads=8, intermediate=256, outliers=False),
    "llama70b": dict(hidden=256, layers=80, heads=8, kv_heads=4, intermediate=256, outliers=False),
}
SHAPE_PRESETS = {"gqa4": ["Q2_K", "Q3_K_M"], "llama70b": ["Q2_K", "Q4_K_S"]}


@pytest.mark.parametrize(
    "which",
    ["gqa4", pytest.param("llama70b", marks=pytest.mark.slow)],  # 80 layers: the slow tier
)
def test_gqa_and_70b_rules_equal_llamacpp(which, tiny_model, exported, llama_worker, tmp_path):
    model = tiny_model("llama", **SHAPE_MODELS[which])
    f32 = exported(model, "F32", "F32")
    with open_model(model) as ck:
        info = ck.info
    to_gguf = {t.hf_name: t.gguf_name for t in layout(info).tensors}
    for preset in SHAPE_PRESETS[which]:
        ref = _reference(llama_worker, f32, preset, tmp_path / f"{preset}.gguf")
        ours = {to_gguf[k]: v for k, v in preset_types(info, preset).items()}
        want = {k: v[0] for k, v in ref.items() if k in ours}
        assert ours == want, f"{which} {preset}: " + ", ".join(
            f"{k}: ours {ours[k]} llama.cpp {want[k]}" for k in ours if ours[k] != want[k]
        )


def _attn_v_types(model: Path, preset: str) -> list[str]:
    with open_model(model) as ck:
        return sorted({t for n, t in preset_types(ck.info, preset).items() if "v_proj" in n})


def test_the_gqa_rule_really_fires_on_that_config(tiny_model):
    """Without GQA ≥ 4 the same preset chooses fewer bits for attn_v."""
    gqa4 = tiny_model("llama", **SHAPE_MODELS["gqa4"])
    mha = tiny_model("llama", **{**SHAPE_MODELS["gqa4"], "kv_heads": 32})
    assert _attn_v_types(gqa4, "Q2_K") == ["Q4_K"] and _attn_v_types(mha, "Q2_K") == ["Q3_K"]


@pytest.mark.slow
def test_the_70b_rule_really_fires_on_that_config(tiny_model):
    """One layer fewer than 80 and the same presets choose fewer bits for attn_v."""
    big = tiny_model("llama", **SHAPE_MODELS["llama70b"])
    assert _attn_v_types(big, "Q2_K") == ["Q5_K"] and _attn_v_types(big, "Q4_K_S") == ["Q5_K"]
    shorter = tiny_model("llama", **{**SHAPE_MODELS["llama70b"], "layers": 79})
    assert _attn_v_types(shorter, "Q2_K") == ["Q3_K"] and "Q4_K" in _attn_v_types(shorter, "Q4_K_S")
