"""A calibrated job whose estimated peak memory is above the free RAM is refused in one sentence, before it starts."""

from __future__ import annotations

from studio.cli import main
from studio.core.plan.job_estimate import estimate_calibrated


def test_gptq_export_refused_when_the_estimate_exceeds_free_ram(llama_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(10 * 1024**2))  # 10 MiB free: nothing fits
    out = tmp_path / "m.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--method", "gptq"]
    assert main([*argv, "--calib-ctx", "64", "--calib-chunks", "2"]) != 0
    text = capsys.readouterr().err
    err = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[")]
    assert (
        "more than the 10.5 MB free" in err[0] and "--device cuda" in err[0] and "--calib-chunks 1" in err[0]
    )
    assert "layer 1/" not in text and "embeddings" not in text  # refused before the run began
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_estimate_at_llama_8b_widths_is_bounded_and_names_the_layer():
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    gptq = estimate_calibrated(cfg, 128, 2, hessian=True, head=True)
    stats = estimate_calibrated(cfg, 128, 2, hessian=False, head=False)
    assert gptq.phase == "a decoder layer" and 5e9 < gptq.peak_bytes < 7e9
    assert stats.phase == "embeddings" and stats.peak_bytes < 3.5e9 and stats.seconds < gptq.seconds
    more = estimate_calibrated(cfg, 512, 128, hessian=True, head=True)
    assert more.peak_bytes - gptq.peak_bytes == 2 * (512 * 128 - 256) * 4096 * 4  # the hidden states, twice
    assert estimate_calibrated(cfg, 128, 2, hessian=True, head=True, device="cuda").peak_bytes < 1e9
