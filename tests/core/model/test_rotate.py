"""Rotations folded into the weights (issue 41): orthogonal matrices, the view, refusals, the check."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.model import open_model
from studio.core.model.rotate import (
    ROTATION_CONFIG_KEY,
    RotatedCheckpoint,
    Rotation,
    RotationError,
    check_rotatable,
    rotation_matrix,
    rotor,
)
from studio.core.model.rotate_check import check_rotation
from studio.core.modelinfo import Role

ROTATABLE = ["llama", "qwen2", "qwen3", "phi3", "gpt2"]
R2_ONLY = ["gemma", "gemma2", "bert"]


@pytest.mark.parametrize("n", [1, 8, 64, 192, 576, 1536, 7])
def test_rotation_matrix_is_orthogonal_and_seeded(n: int) -> None:
    q = rotation_matrix(n, seed=5)
    assert np.allclose(q @ q.T, np.eye(n), atol=1e-12)
    assert np.array_equal(q, rotation_matrix(n, seed=5))
    if n > 1:
        assert not np.allclose(q, rotation_matrix(n, seed=6))


@pytest.mark.parametrize("n", [1, 7, 192, 576])
def test_the_factored_product_is_the_dense_one(n: int) -> None:
    rot = rotor(n, seed=3)
    x = np.random.default_rng(0).standard_normal((5, n)).astype(np.float32)
    np.testing.assert_allclose(rot.right(x), x @ rot.matrix(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [7, 192, 768])
def test_the_mean_keeping_rotation_maps_ones_to_ones_and_still_spreads(n: int) -> None:
    """LayerNorm's rotation: orthogonal, ``Q·1 = 1`` and ``1ᵀ·Q = 1ᵀ``, the factored product is the dense one,
    and one outlier channel is still spread (the Householder step changes one direction only)."""
    rot = rotor(n, seed=3, keep_mean=True)
    q = rot.matrix()
    assert np.allclose(q @ q.T, np.eye(n), atol=1e-10)
    assert np.allclose(q @ np.ones(n), 1.0, atol=1e-10) and np.allclose(np.ones(n) @ q, 1.0, atol=1e-10)
    assert np.array_equal(q, rotation_matrix(n, seed=3, keep_mean=True))
    x = np.random.default_rng(1).standard_normal((5, n)).astype(np.float32)
    np.testing.assert_allclose(rot.right(x), x @ q, rtol=1e-4, atol=1e-4)
    assert np.array_equal(rotor(n, seed=3).signs, rot.signs)  # the same draw as the plain rotation
    if n >= 192:
        spike = np.zeros(n)
        spike[n // 3] = 100.0
        assert np.abs(spike @ q).max() < 100.0 / 4


def test_the_factored_product_of_many_rows_is_made_a_block_at_a_time() -> None:
    """``right`` of more rows than one block gives the whole product's bytes."""
    from studio.core.model import rotate as R

    rot = rotor(1536, seed=5)
    x = np.random.default_rng(0).standard_normal((3000, 1536)).astype(np.float32)
    whole = rot.right(x)
    old, R._RIGHT_VALUES = R._RIGHT_VALUES, 1536 * 7  # 7 rows a block, the last one short
    try:
        assert np.array_equal(rot.right(x), whole)
        assert np.array_equal(rot.right(x[5]), whole[5])  # one row, 1-D
    finally:
        R._RIGHT_VALUES = old
    np.testing.assert_allclose(whole, x @ rot.matrix(), atol=1e-4)


_RIGHT = """
import json, resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from studio.core.model.rotate import rotor
rot = rotor(1536, seed=0)
x = np.random.default_rng(0).standard_normal((43690, 1536), dtype=np.float32)  # 268 MB
rot.right(x[:8])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
y = rot.right(x)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"added": after - before}))
"""


def test_rotating_a_tall_matrix_adds_one_copy_of_it() -> None:
    """The rotation of a tall matrix held two temporaries of its size at once; with the norm's scaled copy
    and the check's own copy of each tensor, the rotation check of the 1.5B (its 151,936-row head) peaked at
    5.08 GB RSS (3.34 GB now). Measured here on 268 MB: 2.0 copies added before, 1.2 now."""
    from tests.memprobe import added_peak

    copies = added_peak(_RIGHT) / (43690 * 1536 * 4)
    assert copies < 1.6, f"rotating a tall matrix added {copies:.2f} copies of it"


def test_hadamard_factor_spreads_one_channel() -> None:
    # an outlier on one channel is spread over the power-of-two factor: |x·Q| max drops by ~sqrt(64)
    x = np.zeros(576)
    x[260] = 100.0
    y = x @ rotation_matrix(576, seed=0)
    assert np.isclose(np.linalg.norm(y), 100.0)
    assert np.abs(y).max() < 100.0 / 4


@pytest.mark.parametrize("arch", ROTATABLE)
def test_rotated_model_computes_the_same_logits(tiny_model, arch: str) -> None:
    with open_model(tiny_model(arch)) as ck:
        view = RotatedCheckpoint(ck, Rotation(seed=1))
        res = check_rotation(view)
        assert res.layers_checked == res.layers == ck.info.n_layers
        assert res.relative < 1e-4
        # the weights did change, and the norms folded into them are ones
        name = next(t.name for t in ck.info.tensors if t.role is Role.FFN_DOWN)
        assert not np.allclose(view.read(name), ck.read(name), atol=1e-3)
        final = "transformer.ln_f.weight" if arch == "gpt2" else "model.norm.weight"
        assert np.all(view.read(final) == 1.0)
        tied = not any(t.role is Role.OUTPUT for t in ck.info.tensors)
        assert view.untied == tied
        assert view.info.tensor("lm_head.weight").role is Role.OUTPUT
        assert view.info.config["tie_word_embeddings"] is False
        assert not view.notes


def test_gpt2_layernorm_folds_its_mean_and_bias(tiny_model) -> None:
    """GPT-2's LayerNorm: Q keeps the all-ones direction, the block norms' biases move into the readers'
    biases (zeros left), and the final norm keeps (b/s)·Q, since llama.cpp's GPT-2 head has no bias."""
    with open_model(tiny_model("gpt2")) as ck:
        view = RotatedCheckpoint(ck, Rotation(seed=3))
        q = view.q()
        assert q is not None and q.house is not None
        ones = np.ones((1, view.hidden), dtype=np.float32)
        np.testing.assert_allclose(q.right(ones), ones, atol=1e-5)
        for name in ("transformer.h.0.ln_1.bias", "transformer.h.1.ln_2.bias"):
            assert np.abs(ck.read(name)).max() > 0  # the factory's norms have biases to fold
            assert np.all(view.read(name) == 0.0)
        s, b = ck.read("transformer.ln_f.weight"), ck.read("transformer.ln_f.bias")
        np.testing.assert_allclose(view.read("transformer.ln_f.bias"), q.right(b / s), rtol=1e-5, atol=1e-6)
        assert view.info.config[ROTATION_CONFIG_KEY]["quantize.rotation.r1_keeps_mean"] is True
        emb = "transformer.wpe.weight"  # the position embedding writes into the stream too
        np.testing.assert_allclose(view.read(emb), q.right(ck.read(emb)), atol=1e-6)


@pytest.mark.parametrize("arch", R2_ONLY)
def test_families_r1_cannot_fold_get_r2_alone(tiny_model, arch: str) -> None:
    """Gemma (its head is the embedding in llama.cpp), Gemma 2 (post-norms) and BERT (post-LayerNorm):
    R2 turns each head's values and o_proj's columns; the stream, norms and head stay; the view says why."""
    with open_model(tiny_model(arch)) as ck:
        view = RotatedCheckpoint(ck, Rotation(seed=5))
        assert view.rotation.r1 is False and view.rotation.r2 is True
        assert len(view.notes) == 1 and "Only R2" in view.notes[0] and view.notes[0].count(". ") == 0
        meta = view.info.config[ROTATION_CONFIG_KEY]
        assert meta["quantize.rotation.r1"] is False and meta["quantize.rotation.r2"] is True
        assert not view.untied and len(view.info.tensors) == len(ck.info.tensors)
        res = check_rotation(view)
        assert res.layers_checked == res.layers and res.relative < 1e-4
        for role, changed in (
            (Role.TOKEN_EMBD, False),
            (Role.NORM, False),
            (Role.ATTN_V, True),
            (Role.ATTN_OUT, True),
            (Role.ATTN_Q, False),
        ):
            name = next(t.name for t in ck.info.tensors if t.role is role and t.name.endswith(".weight"))
            assert np.allclose(view.read(name), ck.read(name)) != changed, name


def test_r2_alone_keeps_the_stream_and_changes_v(tiny_model) -> None:
    with open_model(tiny_model("qwen2")) as ck:
        view = RotatedCheckpoint(ck, Rotation(seed=2, r1=False))
        check_rotation(view)
        emb = "model.embed_tokens.weight"
        assert np.allclose(view.read(emb), ck.read(emb))
        v = "model.layers.0.self_attn.v_proj.bias"
        assert not np.allclose(view.read(v), ck.read(v))  # Qwen2's v bias turns with R2


def test_the_check_catches_a_wrong_rotation(tiny_model) -> None:
    class Broken(RotatedCheckpoint):
        def r2(self, layer: int) -> np.ndarray:  # o_proj and v_proj disagree
            return super().r2(layer) if self._breaking else np.eye(self.head_dim, dtype=np.float32)

        def _read_f32(self, t):
            self._breaking = t.role is Role.ATTN_OUT
            return super()._read_f32(t)

    with open_model(tiny_model("llama")) as ck:
        with pytest.raises(RotationError, match="nothing was written"):
            check_rotation(Broken(ck, Rotation(seed=1)))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_check_of_a_large_model_uses_its_first_blocks(tiny_model, arch: str) -> None:
    """Qwen2's config lists a type per layer (``layer_types``): cut to the blocks checked, or transformers
    refuses the config (the 1.5B bench model's rotated export ended in that traceback)."""
    import json

    model = tiny_model(arch, layers=3)
    cfg = json.loads((model / "config.json").read_text())
    assert arch != "qwen2" or len(cfg["layer_types"]) == 3  # the case this test is for
    with open_model(model) as ck:
        res = check_rotation(RotatedCheckpoint(ck, Rotation()), max_bytes=1)
        assert (res.layers_checked, res.layers) == (1, 3)


@pytest.mark.parametrize(
    ("model_type", "why"),
    [("starcoder2", "does not cover model type 'starcoder2'"), ("gguf", "GGUF original")],
)
def test_what_it_cannot_fold_is_refused_in_one_sentence(tiny_model, model_type: str, why: str) -> None:
    import dataclasses

    from studio.core.modelinfo import CheckpointFormat

    with open_model(tiny_model("llama")) as ck:
        info = ck.info
        if model_type == "gguf":
            info = dataclasses.replace(info, format=CheckpointFormat.GGUF)
        else:
            info = dataclasses.replace(info, model_type=model_type)
        with pytest.raises(RotationError, match=why) as err:
            check_rotatable(info)
        assert err.value.message.count(". ") == 0


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "granite", "smollm3", "gemma3_text", "olmo2"])
def test_the_converter_families_rotate_too(tiny_model, arch: str) -> None:
    """Families llama.cpp's converter writes: MoE routers and experts (read per expert), Granite's multipliers,
    SmolLM3's NoPE layers take R1 and R2; Gemma 3 and OLMo 2 (post-norms) R2 alone. The check loads the
    MoE models through transformers' own checkpoint conversion (its experts are fused)."""
    with open_model(tiny_model(arch)) as ck:
        view = RotatedCheckpoint(ck, Rotation(seed=2))
        assert view.rotation.r1 is (arch not in ("gemma3_text", "olmo2"))
        res = check_rotation(view)
        assert res.layers_checked == res.layers and res.relative < 1e-4
        if arch in ("mixtral", "qwen3_moe"):
            router = next(t.name for t in ck.info.tensors if t.role is Role.FFN_ROUTER)
            assert not np.allclose(view.read(router), ck.read(router))
