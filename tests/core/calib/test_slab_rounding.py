"""Rounding a tall matrix in slabs of rows (the output head's bounded memory) writes the same bytes."""

from __future__ import annotations

from studio.core.calib import quantize
from studio.core.calib.quantize import export_calibrated
from studio.core.factory import sample_text
from studio.core.model import open_model
from studio.core.plan.plan import plan_from_preset, with_method


def test_gptq_in_slabs_of_rows_writes_the_same_tensors(llama_model, tmp_path, monkeypatch):
    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")

    info = open_model(llama_model).info
    plan = with_method(plan_from_preset(info, "Q4_K_M", imatrix=True), info, "gptq")

    def run(name):
        out = tmp_path / name
        res = export_calibrated(llama_model, out, plan, text=text, n_ctx=64, n_chunks=3, device="cpu")
        assert {lr.layer for lr in res.layers} >= {0, None}  # the layers and the untied head were calibrated
        return out.read_bytes()

    whole = run("whole.gguf")
    monkeypatch.setattr(quantize, "_SLAB_ROWS", 40)  # every matrix of the tiny model in several slabs
    slabs = run("slabs.gguf")
    assert whole == slabs
