"""Verification compares the GGUF with the original on the same tokens."""

from __future__ import annotations

import pytest

from studio.core.export.verify import compare_logits, verify_gguf


def test_f32_export_verifies_as_identical(llama_model, exported):
    r = verify_gguf(exported(llama_model, "F32", "F32"), llama_model)
    assert r.n_tokens > 20
    assert r.top1_agreement == 1.0
    assert r.mean_kl < 1e-6
    assert r.relative_max_diff < 1e-3


def test_quantized_export_is_close_but_not_identical(llama_model, exported):
    q8 = verify_gguf(exported(llama_model, "Q8_0", "Q8_0"), llama_model)
    q2 = verify_gguf(exported(llama_model, "Q2_K", "Q2_K"), llama_model)
    assert 0 < q8.mean_kl < q2.mean_kl
    assert q8.top1_agreement >= q2.top1_agreement


def test_encoder_verification_reports_cosine(bert_model, exported):
    r = verify_gguf(exported(bert_model, "F32", "F32"), bert_model)
    assert r.top1_agreement is None and r.mean_kl is None
    assert r.mean_cosine == pytest.approx(1.0, abs=1e-5)


def test_compare_logits_known_values():
    import numpy as np

    a = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]], dtype=np.float32)
    top1, kl, mx, rng = compare_logits(a, a)
    assert (top1, kl, mx, rng) == (1.0, 0.0, 0.0, 3.0)
    b = a.copy()
    b[1] = [0.0, 3.0, 0.0]
    top1, kl, _, _ = compare_logits(a, b)
    assert top1 == 0.5 and kl > 0
