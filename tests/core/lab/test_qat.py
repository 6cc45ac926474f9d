"""QAT mechanics on the factory's tiny Llama: the grid equals the sweep's, the STE passes gradients, the weights land on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.core.errors import QuantizationError, StudioError
from studio.core.evaluate.texts import EvalText, load_text
from studio.core.factory import TEXT_PATH
from studio.core.jobs import JobCancelled, JobContext
from studio.core.lab.qat import QAT_INFO_NAME, _ste_module, fake_quantize, quantized_linears, run_qat
from studio.core.quant import generic


@pytest.mark.parametrize(("group", "symmetric"), [(32, False), (64, True), (None, False)])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_fake_quantize_is_the_generic_int_grid(bits, group, symmetric):
    w = np.random.default_rng(bits).standard_normal((8, 128)).astype(np.float32)
    w[2] *= 12
    w[5] = np.abs(w[5]) + 1  # all positive: the asymmetric range still reaches down to zero
    ref = generic.quantize_int(
        w, bits, symmetric=symmetric, granularity="group" if group else "channel", group_size=group
    )
    got = fake_quantize(torch.from_numpy(w), bits, group, symmetric).numpy()
    np.testing.assert_allclose(got, ref.dequantized, rtol=0, atol=1e-6)


def test_straight_through_gradient_is_the_identity():
    w = torch.randn(4, 64, requires_grad=True)
    ste = _ste_module(3, 32, False)
    y = ste(w)
    assert torch.equal(y.detach(), fake_quantize(w.detach(), 3, 32))
    g = torch.randn(4, 64)
    (y * g).sum().backward()
    assert torch.equal(w.grad, g)  # plain rounding would give zero gradient almost everywhere


def test_the_head_stays_float_and_groups_must_divide(llama_model):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(llama_model)
    names = [n for n, _ in quantized_linears(m, 32)]
    assert "lm_head" not in names and len(names) == 7 * m.config.num_hidden_layers
    with pytest.raises(QuantizationError, match="multiple of the group of 96"):
        quantized_linears(m, 96)


@pytest.fixture(scope="module")
def texts():
    """Train on the factory's multilingual text, measure on the English evaluation sample."""
    return EvalText("multilingual", TEXT_PATH.read_text(encoding="utf-8")), load_text("sample")


@pytest.mark.usefixtures("one_torch_thread")
def test_qat_beats_ptq_and_exports_the_rounded_weights(llama_model, texts, tmp_path):
    train, held_out = texts
    out = tmp_path / "qat"
    steps: list[tuple[int, float]] = []
    r = run_qat(
        llama_model,
        train,
        eval_text=held_out,
        bits=3,
        group=32,
        steps=6,
        lr=3e-3,
        seq_len=32,
        max_eval_chunks=2,
        output=out,
        on_step=lambda i, loss: steps.append((i, loss)),
    )
    assert r.quantized_tensors == 14 and len(r.train_losses) == 6
    assert steps == list(enumerate(r.train_losses, start=1))
    assert r.ptq_loss != r.float_loss  # the rounding reached the forward pass
    assert r.qat_loss < r.ptq_loss - 0.1  # training through the STE moved the weights
    assert r.train_seconds > 0 and r.eval_tokens == 2 * 31
    # the folder holds the rounded weights: at most 2^3 values per group of 32, and the same loss
    from safetensors.numpy import load_file

    w = load_file(str(out / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    levels = [len(np.unique(g)) for g in w.reshape(-1, 32)]
    assert max(levels) <= 8
    assert (out / QAT_INFO_NAME).is_file() and (out / "tokenizer.json").is_file()
    again = run_qat(
        out, train, eval_text=held_out, bits=3, group=32, steps=1, lr=1e-9, seq_len=32, max_eval_chunks=2
    )
    assert again.float_loss == pytest.approx(r.qat_loss, abs=1e-4)
    assert again.ptq_loss == pytest.approx(r.qat_loss, abs=1e-4)  # already on the grid: rounding is a no-op
    # and the normal exporter takes the folder
    from studio.core.export.run import export_gguf
    from studio.core.gguf.read import read_gguf

    res = export_gguf(out, tmp_path / "qat.gguf", "Q8_0")
    assert len(read_gguf(res.path).tensors) == len(load_file(str(out / "model.safetensors")))


def test_bad_settings_and_cancel(llama_model, texts, tmp_path):
    with pytest.raises(QuantizationError, match="2 to 8 bits"):
        run_qat(llama_model, texts[0], bits=1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(StudioError, match="not empty"):
        run_qat(llama_model, texts[0], output=tmp_path / "full")
    with pytest.raises(StudioError, match="fewer than one chunk"):
        run_qat(llama_model, EvalText("short", "a b c"), seq_len=64)
    ctx = JobContext()
    ctx.cancel()
    with pytest.raises(JobCancelled):
        run_qat(llama_model, texts[0], eval_text=texts[1], steps=2, seq_len=32, max_eval_chunks=1, ctx=ctx)
