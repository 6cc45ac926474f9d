"""The memory calculator equals its stated formulas: hand-computed cases, the Llama-3-70B sanity point, real tensors."""

from __future__ import annotations

import pytest

from studio.core.errors import StudioError
from studio.core.hardware import HardwareInfo
from studio.core.lab.memory import (
    FORMULAS,
    ModelShape,
    fits_card,
    kv_cache_bytes,
    memory_report,
    shape_from_config,
    shape_from_info,
)
from studio.core.model import open_model

GIB = 1024**3
MIB = 1024**2
# A machine without a GPU and 16 GiB of free RAM, so "this machine" does not depend on the test host.
HW = HardwareInfo("test CPU", 8, 32 * GIB, 16 * GIB)
LLAMA3_70B = ModelShape("Llama-3-70B", 70_553_706_496, 80, 8, 128, 128_256)


def test_llama3_70b_sanity_point():
    r = memory_report(LLAMA3_70B, 32768, "f16", HW)
    assert r.kv_cache_bytes == 10 * GIB  # 2 × 80 × 8 × 128 × 32768 × 2 bytes
    fp16 = r.row("FP16/BF16")
    assert fp16.weights_bytes == 141_107_412_992  # "about 140 GB"
    assert 139e9 < fp16.weights_bytes < 142e9
    overhead = int(0.05 * 141_107_412_992) + 64 * MIB + 128_256 * 512 * 4
    assert fp16.overhead_bytes == overhead
    assert fp16.total_bytes == 141_107_412_992 + 10 * GIB + overhead
    assert fp16.this_machine == "does not fit" and not any(fp16.fits.values())


def test_every_precision_equals_the_formula():
    r = memory_report(LLAMA3_70B, 32768, "f16", HW)
    bpw = {
        "FP32": 32,
        "FP16/BF16": 16,
        "FP8": 8,
        "INT8/Q8_0": 8.5,  # 34 bytes per 32
        "Q6_K": 6.5625,  # 210 per 256
        "Q5_K_M": 5.69,
        "Q4_K_M": 4.89,
        "INT4/Q4_0": 4.5,  # 18 per 32
        "Q3_K_M": 3.91,
        "Q2_K": 3.35,
        # llama-quantize --help's figures for its low-bit presets
        "IQ4_XS": 4.25,
        "IQ4_NL": 4.5,
        "IQ3_M": 3.66,
        "IQ3_S": 3.44,
        "IQ3_XS": 3.3,
        "IQ3_XXS": 3.06,
        "Q2_K_S": 3.35,
        "IQ2_M": 2.7,
        "IQ2_S": 2.5,
        "Q2_0": 2.25,
        "IQ2_XS": 2.31,
        "TQ2_0": 2.06,
        "IQ2_XXS": 2.06,
        "IQ1_M": 1.75,
        "TQ1_0": 1.69,
        "IQ1_S": 1.56,
        "Q1_0": 1.125,
        "MXFP4_MOE": 4.25,
    }
    assert [row.precision for row in r.rows] == list(bpw)
    for row in r.rows:
        w = int(70_553_706_496 * bpw[row.precision] / 8)
        assert row.weights_bytes == w, row.precision
        total = w + 10 * GIB + int(0.05 * w) + 64 * MIB + 128_256 * 512 * 4
        assert row.total_bytes == total, row.precision
        # a "G GB" card offers G GiB less 512 MiB
        assert row.fits == {f"{g}GB": total <= g * GIB - 512 * MIB for g in (8, 12, 16, 24, 48, 80)}
    fp8 = r.row("FP8")  # 65.7 GiB weights + 10 + 3.4 overhead = 79.1 GiB: only the 80 GB card
    assert [k for k, v in fp8.fits.items() if v] == ["80GB"]
    assert "537 MB" in FORMULAS and "34/32" in FORMULAS
    assert "GiB" not in FORMULAS and "MiB" not in FORMULAS  # one unit system: decimal


@pytest.mark.parametrize(
    ("kv", "ctx", "expected"),
    [
        ("f16", 4096, 2 * 32 * 8 * 128 * 4096 * 2),
        ("f32", 4096, 2 * 32 * 8 * 128 * 4096 * 4),
        ("q8_0", 4096, 2 * 32 * 8 * 128 * 4096 * 34 // 32),
        ("q4_0", 4096, 2 * 32 * 8 * 128 * 4096 * 18 // 32),
        ("f16", 1000, 2 * 32 * 8 * 128 * 1024 * 2),  # llama.cpp allocates 1024 for 1000
    ],
)
def test_kv_cache_by_hand(kv, ctx, expected):
    shape = ModelShape("Llama-3-8B", 8_030_261_248, 32, 8, 128, 128_256)
    assert kv_cache_bytes(shape, ctx, kv) == expected
    assert memory_report(shape, ctx, kv, HW).kv_cache_bytes == expected


def test_a_card_keeps_512_mib_for_the_driver():
    assert fits_card(8 * GIB - 512 * MIB, 8) and not fits_card(8 * GIB - 511 * MIB, 8)
    assert fits_card(80 * GIB - 512 * MIB, 80) and not fits_card(80 * GIB, 80)


def test_a_small_model_fits_this_machine():
    shape = ModelShape("small", 1_000_000_000, 16, 4, 64, 32_000)
    r = memory_report(shape, 2048, "q4_0", HW)
    q4 = r.row("INT4/Q4_0")
    assert q4.weights_bytes == 562_500_000 and q4.this_machine == "CPU only" and all(q4.fits.values())


def test_known_tensors_give_the_exporters_sizes(llama_model):
    with open_model(llama_model) as ck:
        info = ck.info
    shape = shape_from_info(info)
    cfg = info.config
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (
        cfg["num_hidden_layers"],
        cfg["num_key_value_heads"],
        cfg["hidden_size"] // cfg["num_attention_heads"],
    )
    r = memory_report(shape, 512, "f16", HW)
    # Q8_0 by hand: every matrix in Q8_0 (34 bytes per 32 values), vectors (norms) in F32
    q8 = sum(t.n_elements * 34 // 32 for t in info.tensors if len(t.shape) == 2)
    q8 += sum(t.n_elements * 4 for t in info.tensors if len(t.shape) == 1)
    row = r.row("INT8/Q8_0")
    assert row.bpw_source == "plan" and row.weights_bytes == q8
    assert row.bpw == pytest.approx(8 * q8 / info.parameters)
    assert r.row("FP32").weights_bytes == 4 * info.parameters
    assert r.kv_cache_bytes == 2 * shape.layers * shape.kv_heads * shape.head_dim * 512 * 2
    assert "× 512 tokens × 2/1 bytes (F16)" in r.worked("INT8/Q8_0")


def test_encoder_only_models_keep_no_cache(bert_model):
    with open_model(bert_model) as ck:
        shape = shape_from_info(ck.info)
    r = memory_report(shape, 4096, "f16", HW)
    assert not shape.has_kv_cache and r.kv_cache_bytes == 0
    fp32 = r.row("FP32")
    assert fp32.overhead_bytes == int(0.05 * fp32.weights_bytes) + 64 * MIB  # no logits buffer either


def test_bad_shapes_are_refused():
    with pytest.raises(StudioError, match="layers"):
        ModelShape("x", 10, 0, 1, 1)
    with pytest.raises(StudioError, match="KV heads"):
        ModelShape("x", 10, 2, 0, 64)
    with pytest.raises(StudioError, match="context"):
        kv_cache_bytes(LLAMA3_70B, 0)
    with pytest.raises(StudioError, match="KV-cache type"):
        memory_report(LLAMA3_70B, 512, "q5_1", HW)
    with pytest.raises(StudioError, match="does not give"):
        shape_from_config({"hidden_size": 64}, 1000)


def test_a_hub_model_is_sized_from_its_config(monkeypatch):
    from types import SimpleNamespace

    from studio.core.hub import api
    from studio.core.lab.memory import shape_from_hub

    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
    cfg |= {"num_key_value_heads": 8, "vocab_size": 128_256}
    seen = {}

    def details(repo_id, **kw):
        seen.update(kw, repo=repo_id)
        return SimpleNamespace(params=8_030_261_248, config=cfg)

    monkeypatch.setattr(api, "model_details", details)
    shape = shape_from_hub("meta-llama/Meta-Llama-3-8B")
    assert (shape.params, shape.layers, shape.kv_heads, shape.head_dim, shape.vocab) == (
        8_030_261_248,
        32,
        8,
        128,
        128_256,
    )
    assert seen["repo"] == "meta-llama/Meta-Llama-3-8B" and seen["with_card"] is False
    monkeypatch.setattr(api, "model_details", lambda repo_id, **kw: SimpleNamespace(params=None, config=cfg))
    with pytest.raises(StudioError, match="does not say how many parameters"):
        shape_from_hub("org/gguf-only")
