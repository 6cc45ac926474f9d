"""llama.cpp has the last word on a budget file (issue 37): a file measured far above its prediction or
above the same-size preset is no success; the measurement runs on the partial file before its rename."""

from __future__ import annotations

import math

import pytest

from studio.core.evaluate.last_word import MAX_OVER_PREDICTION, LastWord, last_word


@pytest.mark.parametrize(
    ("file_kl", "predicted", "preset_kl", "ok", "why"),
    [
        (0.02, 0.018, 0.04, True, ""),
        (34.0, float("nan"), 0.3, False, "above llama.cpp's IQ3_XXS"),  # the file
        (0.20, 0.05, 0.50, False, "4× its prediction"),
        (0.06, 0.05, 0.05, False, "above llama.cpp's IQ3_XXS"),
        (float("nan"), 0.05, 0.5, False, "not a number"),
        (0.14, 0.05, None, True, ""),  # within 3× and no preset to compare
    ],
    ids=["better", "destroyed", "over-prediction", "above-preset", "nan", "no-preset"],
)
def test_the_verdict(file_kl, predicted, preset_kl, ok, why):
    w = LastWord(file_kl, predicted, 256, None if preset_kl is None else "IQ3_XXS", preset_kl, 1.0)
    assert w.ok is ok
    assert w.sentence.count(".") >= 1 and "\n" not in w.sentence
    if not ok:
        assert why in w.sentence and "--keep-if-worse" in w.sentence
        if preset_kl is not None:
            assert "--preset IQ3_XXS --method awq+gptq" in w.sentence
    assert MAX_OVER_PREDICTION == 3.0


def test_last_word_measures_the_file_and_the_same_size_preset_on_the_same_text(llama_model, tmp_path):
    from studio.core.export.run import export_gguf
    from studio.core.model import open_model

    with open_model(llama_model) as ck:
        info = ck.info
    f = tmp_path / "plan.gguf.partial"
    export_gguf(llama_model, tmp_path / "plan.gguf", "Q8_0")
    (tmp_path / "plan.gguf").rename(f)
    seen = []

    def measure(path, model, text, *, max_tokens, extra_buffers):
        seen.append((path.name if hasattr(path, "name") else str(path), text, max_tokens, path.is_file()))
        return (0.5 if "Q2_K" in str(path) else 0.01), 200

    w = last_word(f, info, predicted_kl=0.012, text="held out", preset="Q2_K", measure=measure)
    assert w.ok and w.file_kl == 0.01 and w.preset_kl == 0.5 and w.preset == "Q2_K" and w.tokens == 200
    assert [s[0] for s in seen] == ["plan.gguf.partial", "Q2_K.gguf"] and all(s[3] for s in seen)
    assert {s[1] for s in seen} == {"held out"}
    assert not list(tmp_path.glob("qs-lastword-*"))  # the preset's file is gone


def test_the_real_measurement_of_a_file_against_its_original(llama_model, tmp_path):
    # llama.cpp in its child process against transformers: a Q8_0 file is close, a Q2_K one further
    from studio.core.evaluate.last_word import llama_kl
    from studio.core.export.run import export_gguf
    from studio.core.factory import sample_text

    q8, q2 = tmp_path / "q8.gguf", tmp_path / "q2.gguf"
    export_gguf(llama_model, q8, "Q8_0")
    export_gguf(llama_model, q2, "Q2_K")
    k8, n = llama_kl(q8, llama_model, sample_text(), max_tokens=64)
    k2, _ = llama_kl(q2, llama_model, sample_text(), max_tokens=64)
    assert n == 64 and math.isfinite(k8) and 0 <= k8 < k2


def test_a_large_original_is_measured_layer_by_layer(llama_model, tmp_path, monkeypatch):
    """Where loading the original whole in transformers would take more than the limit or the free RAM (an
    8B in float32 is 33.6 GB; the 2-layer 8B fixture's budget export peaked at 9.6 GB in this step, issue
    40), llama.cpp's last word takes the original's logits layer by layer: the same KL as whole."""
    from studio.core.evaluate import last_word
    from studio.core.export.run import export_gguf
    from studio.core.factory import sample_text

    q4 = tmp_path / "q4.gguf"
    export_gguf(llama_model, q4, "Q4_K_M")
    whole, n = last_word.llama_kl(q4, llama_model, sample_text(), max_tokens=64)
    built: list[str] = []
    real = last_word.LayerwiseOriginal

    def spy(*a, **k):
        built.append("layers")
        return real(*a, **k)

    monkeypatch.setattr(last_word, "original_in_layers", lambda *a, **k: True)
    monkeypatch.setattr(last_word, "LayerwiseOriginal", spy)
    layers, n2 = last_word.llama_kl(q4, llama_model, sample_text(), max_tokens=64)
    assert built == ["layers"] and n2 == n == 64
    assert layers == pytest.approx(whole, rel=1e-3, abs=1e-6)
