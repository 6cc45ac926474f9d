"""Estimates: bytes per preset against an independent block-size computation, KV cache, verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.hardware import Backend, GpuInfo, HardwareInfo
from studio.core.model import open_model
from studio.core.plan.estimate import (
    LOW_BIT_PRESETS,
    PRESETS,
    Verdict,
    estimate_from_config,
    estimate_presets,
    kv_cache_bytes,
    verdict_for,
)
from studio.core.plan.memory import OVERHEAD_FIXED_BYTES
from tests.core.model.test_model_helpers import llama_tensors, write_folder

GIB = 1024**3
CPU_BIG = HardwareInfo("cpu", 8, 64 * GIB, 48 * GIB)

# ggml block sizes (weights per block, bytes per block), written out here so the test does not
# share a table with the code under test.
BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_type(name: str, shape: tuple[int, ...], preset: str, n_layers: int, has_output: bool) -> str:
    """llama.cpp's choice for one Llama-layout tensor (llama-quant.cpp, llama-cpp-python 0.3.36)."""
    if len(shape) < 2 or name.endswith("norm.weight"):
        return "F32"
    row = shape[-1]
    base = {"Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}[preset]
    typ = base
    layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
    if name == "lm_head.weight" or (not has_output and name == "model.embed_tokens.weight"):
        if row % BLOCKS[base][0]:
            typ = "Q8_0"
        elif base != "Q8_0":
            typ = "Q6_K"
    elif preset == "Q4_K_M" and name.endswith(("v_proj.weight", "down_proj.weight")):
        if _use_more_bits(layer, n_layers):
            typ = "Q6_K"
    if row % BLOCKS[typ][0]:
        typ = {"Q4_K": "Q5_0", "Q6_K": "Q8_0", "Q5_K": "Q5_1"}.get(typ, "F16")
        if row % BLOCKS[typ][0]:
            typ = "F16"
    return typ


def expected_bytes(tensors: dict[str, np.ndarray], preset: str, n_layers: int) -> int:
    has_output = "lm_head.weight" in tensors
    total = 0
    for name, a in tensors.items():
        typ = expected_type(name, a.shape, preset, n_layers, has_output)
        block, size = BLOCKS[typ]
        total += a.size // block * size
    return total


def _cfg(hidden, inter, layers, vocab, heads=4, kv=2, tie=False):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "tie_word_embeddings": tie,
    }


@pytest.mark.parametrize(
    "hidden,inter,layers,tie",
    [(256, 512, 2, False), (256, 768, 8, True), (320, 640, 3, False), (256, 200, 2, False)],
    ids=["h256-2L", "h256-8L-tied", "h320-not-256", "ffn-200-not-32"],
)
@pytest.mark.parametrize("preset", ["Q8_0", "Q4_K_M"])
def test_file_bytes_match_independent_block_count(tmp_path, hidden, inter, layers, tie, preset):
    cfg = _cfg(hidden, inter, layers, vocab=300)
    tensors = llama_tensors(cfg)
    if tie:
        del tensors["lm_head.weight"]
        cfg["tie_word_embeddings"] = True
    folder = write_folder(tmp_path / "m", tensors, cfg)
    with open_model(folder) as ck:
        est = {e.preset: e for e in estimate_presets(ck.info, CPU_BIG)}
    e = est[preset]
    want = expected_bytes(tensors, preset, layers)
    assert e.exact
    assert e.tensor_bytes == want
    assert 0 < e.file_bytes - want <= 64 * 1024
    assert e.memory_bytes == e.tensor_bytes + e.kv_bytes + e.overhead_bytes


def test_fallback_counted_for_rows_not_multiple_of_256(tmp_path):
    cfg = _cfg(320, 640, 2, vocab=300)
    with open_model(write_folder(tmp_path / "m", llama_tensors(cfg), cfg)) as ck:
        e = {e.preset: e for e in estimate_presets(ck.info, CPU_BIG)}
    assert e["Q4_K_M"].n_fallbacks > 0 and e["Q8_0"].n_fallbacks == 0
    assert e["Q4_K_M"].types["model.layers.0.self_attn.q_proj.weight"] == "Q5_0"


def test_presets_order_and_monotone_sizes(tmp_path):
    cfg = _cfg(256, 512, 2, vocab=300)
    with open_model(write_folder(tmp_path / "m", llama_tensors(cfg), cfg)) as ck:
        ests = estimate_presets(ck.info, CPU_BIG, ctx_len=512)
    assert tuple(e.preset for e in ests) == PRESETS + LOW_BIT_PRESETS
    sizes = {e.preset: e.tensor_bytes for e in ests}
    assert (
        sizes["F16"]
        > sizes["Q8_0"]
        > sizes["Q6_K"]
        > sizes["Q5_K_M"]
        > sizes["Q4_K_M"]
        > sizes["Q3_K_M"]
        > sizes["Q2_K"]
    )
    # the i-quants between and below: IQ4_XS under Q4_K_M, IQ3_S under Q3_K_M, IQ2_XXS under Q2_K, IQ1_S least
    assert sizes["Q4_K_M"] > sizes["IQ4_XS"] > sizes["IQ3_M"] > sizes["IQ3_S"] > sizes["IQ3_XXS"]
    assert (
        sizes["Q2_K"] > sizes["IQ2_M"] > sizes["IQ2_S"] > sizes["IQ2_XS"] > sizes["IQ2_XXS"] > sizes["IQ1_M"]
    )
    assert sizes["IQ1_M"] > sizes["IQ1_S"]
    assert all(e.ctx_len == 512 for e in ests)


def test_kv_cache_formula():
    cfg = {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "model_type": "llama"}
    assert kv_cache_bytes(cfg, 32, 8192) == 32 * 2 * 8 * 128 * 8192 * 2  # Llama-3-8B: 1 GiB at 8k
    assert kv_cache_bytes(dict(cfg, head_dim=256), 2, 10) == 2 * 2 * 8 * 256 * 10 * 2
    assert (
        kv_cache_bytes({"n_head": 12, "n_embd": 768, "model_type": "gpt2"}, 12, 1024)
        == 12 * 2 * 12 * 64 * 1024 * 2
    )
    assert kv_cache_bytes({"num_attention_heads": 12, "hidden_size": 384, "model_type": "bert"}, 6, 512) == 0


def test_kv_scales_with_ctx(tmp_path):
    cfg = _cfg(256, 512, 2, vocab=300)
    with open_model(write_folder(tmp_path / "m", llama_tensors(cfg), cfg)) as ck:
        a = estimate_presets(ck.info, CPU_BIG, ctx_len=1024)[1]
        b = estimate_presets(ck.info, CPU_BIG, ctx_len=2048)[1]
    assert b.kv_bytes == 2 * a.kv_bytes == 2 * (2 * 2 * 2 * 64 * 1024 * 2)
    assert b.memory_bytes - a.memory_bytes == a.kv_bytes
    assert a.overhead_bytes >= OVERHEAD_FIXED_BYTES


def _gpu(free, total=None, unified=False):
    return GpuInfo(0, "gpu", Backend.MPS if unified else Backend.CUDA, total or free, free, unified)


@pytest.mark.parametrize(
    "hw,memory,verdict",
    [
        (HardwareInfo("c", 4, 16 * GIB, 8 * GIB), 4 * GIB, Verdict.CPU_ONLY),
        (HardwareInfo("c", 4, 16 * GIB, 8 * GIB), 9 * GIB, Verdict.DOES_NOT_FIT),
        (HardwareInfo("c", 4, 16 * GIB, 8 * GIB, (_gpu(6 * GIB),)), 5 * GIB, Verdict.FITS_GPU),
        (HardwareInfo("c", 4, 16 * GIB, 8 * GIB, (_gpu(6 * GIB),)), 10 * GIB, Verdict.PARTIAL_OFFLOAD),
        (HardwareInfo("c", 4, 16 * GIB, 8 * GIB, (_gpu(6 * GIB),)), 15 * GIB, Verdict.DOES_NOT_FIT),
        (HardwareInfo("c", 4, 16 * GIB, 8 * GIB, (_gpu(3 * GIB), _gpu(3 * GIB))), 5 * GIB, Verdict.FITS_GPU),
        (
            HardwareInfo("m", 8, 32 * GIB, 20 * GIB, (_gpu(20 * GIB, 32 * GIB, True),)),
            19 * GIB,
            Verdict.FITS_GPU,
        ),
        (
            HardwareInfo("m", 8, 16 * GIB, 15 * GIB, (_gpu(15 * GIB, 16 * GIB, True),)),
            13 * GIB,
            Verdict.PARTIAL_OFFLOAD,
        ),
        (
            HardwareInfo("m", 8, 16 * GIB, 15 * GIB, (_gpu(15 * GIB, 16 * GIB, True),)),
            16 * GIB,
            Verdict.DOES_NOT_FIT,
        ),
    ],
    ids=["cpu", "cpu-too-big", "gpu", "offload", "too-big", "two-gpus", "mps", "mps-over-75%", "mps-too-big"],
)
def test_verdicts(hw, memory, verdict):
    assert verdict_for(memory, hw) is verdict
    assert verdict.value in ("fits on the GPU", "fits with partial offload", "CPU only", "does not fit")


def test_partial_offload_suggests_gpu_layers(tmp_path):
    cfg = _cfg(256, 512, 8, vocab=300)
    with open_model(write_folder(tmp_path / "m", llama_tensors(cfg), cfg)) as ck:
        f16 = estimate_presets(ck.info, CPU_BIG, ctx_len=256)[0]
        small_gpu = HardwareInfo("c", 4, 16 * GIB, 8 * GIB, (_gpu(f16.memory_bytes - 3 * 1024**2),))
        e = estimate_presets(ck.info, small_gpu, ctx_len=256)[0]
    assert e.verdict is Verdict.PARTIAL_OFFLOAD
    assert 0 < e.gpu_layers < 8
    assert f16.gpu_layers == 0  # CPU only


LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    "preset,published",
    [("Q8_0", 8_540_775_840), ("Q4_K_M", 4_920_739_232), ("Q6_K", 6_596_006_112), ("F16", 16_068_890_624)],
)
def test_from_config_matches_published_llama3_8b_files(preset, published):
    """Sizes of the Meta-Llama-3-8B GGUF files llama.cpp publishes, within 1 %."""
    ests = {e.preset: e for e in estimate_from_config(LLAMA3_8B, 8_030_261_248, CPU_BIG, ctx_len=8192)}
    e = ests[preset]
    assert abs(e.file_bytes - published) / published < 0.01, (e.file_bytes, published)
    assert e.kv_bytes == 32 * 2 * 8 * 128 * 8192 * 2


def test_from_config_without_shapes_uses_typical_bpw():
    ests = {e.preset: e for e in estimate_from_config({"model_type": "mystery"}, 1_000_000_000, CPU_BIG)}
    assert 0.55e9 < ests["Q4_K_M"].tensor_bytes < 0.65e9
    assert ests["Q4_K_M"].kv_bytes == 0
    assert ests["F16"].tensor_bytes == 2_000_000_000


def test_unknown_architecture_gets_approximate_estimate(tmp_path):
    tensors = {
        "enc.blocks.0.mix.weight": np.zeros((256, 256), np.float32),
        "enc.blocks.0.norm.weight": np.zeros(256, np.float32),
        "head.weight": np.zeros((100, 256), np.float32),
    }
    cfg = {"model_type": "mystery", "architectures": ["MysteryModel"]}
    with open_model(write_folder(tmp_path / "m", tensors, cfg)) as ck:
        e = {e.preset: e for e in estimate_presets(ck.info, CPU_BIG)}
    assert not e["Q8_0"].exact
    assert e["Q8_0"].tensor_bytes == (256 * 256 + 100 * 256) // 32 * 34 + 256 * 4


def test_estimate_plan_matches_preset_and_tracks_a_changed_tensor(llama_model) -> None:
    """A plan made from a preset costs what the preset costs; retyping one tensor moves the size by its bytes."""
    import gguf

    from studio.core.hardware import detect
    from studio.core.model import open_model
    from studio.core.plan.estimate import estimate_plan, estimate_preset, gguf_row
    from studio.core.plan.plan import Plan, plan_from_preset

    hw = detect(probe_torch=False)
    with open_model(llama_model) as ck:
        info = ck.info
    plan = plan_from_preset(info, "Q4_K_M")
    by_preset = estimate_preset(info, "Q4_K_M", hw, 512)
    by_plan = estimate_plan(info, plan, hw, 512)
    assert by_plan.tensor_bytes == by_preset.tensor_bytes
    assert by_plan.memory_bytes == by_preset.memory_bytes

    t = next(t for t in info.tensors if t.name.endswith("layers.0.mlp.up_proj.weight"))
    assert plan.types[t.name] == "Q4_K"
    changed = Plan(types={**plan.types, t.name: "Q8_0"}, name="custom")
    after = estimate_plan(info, changed, hw, 512)
    rows = t.n_elements // gguf_row(t)

    def size(typ: str) -> int:
        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[typ]]
        return rows * gguf_row(t) // block * nbytes

    assert after.tensor_bytes - by_plan.tensor_bytes == size("Q8_0") - size("Q4_K")
