"""Rounding a tall matrix in slabs of rows (the output head's bounded memory) writes the same bytes."""

from __future__ import annotations

from studio.core.calib import quantize
from studio.core.calib.quantize import export_calibrated
from studio.core.factory import sample_text
from studio.core.model import open_model
from studio.core.plan.plan import plan_from_preset, with_method
from studio.core.quant.gptq import FactorCache


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


def test_a_layers_inverse_factors_are_released_before_the_next_layer_is_collected(
    llama_model, tmp_path, monkeypatch
):
    """GPTQ's inverse factors of a layer (at 8B widths 1 GB) are dropped when the layer is rounded, not when the next one is: held through the next layer's collection they sat beside its
    float64 Hessians, and layer 2 of the 8B fixture's GPTQ export peaked 2.8 GB above layer 1."""
    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    info = open_model(llama_model).info
    plan = with_method(plan_from_preset(info, "Q4_K_M", imatrix=True), info, "awq+gptq")
    made: list[int] = []
    after: list[tuple[int, int]] = []
    real = quantize.MethodConsumer.layer_collected
    real_factor = FactorCache.factor

    def factor(self, h, how, make):
        made.append(1)
        return real_factor(self, h, how, make)

    def spy(self, view):
        real(self, view)
        after.append(len(self._factors._made))

    monkeypatch.setattr(FactorCache, "factor", factor)
    monkeypatch.setattr(quantize.MethodConsumer, "layer_collected", spy)
    export_calibrated(llama_model, tmp_path / "o.gguf", plan, text=text, n_ctx=64, n_chunks=3, device="cpu")
    assert made and after and all(a == 0 for a in after), after


def test_a_tall_matrix_moves_the_bar_slab_by_slab(llama_model, tmp_path, monkeypatch):
    """The output head rounded in slabs reports each slab (its rows so far, the bar moving), instead of one
    step at its end: at 8B widths GPTQ of the head took 4 min with the line stuck at "ETA 1 min 39 s"."""
    from studio.core.jobs import JobContext

    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    info = open_model(llama_model).info
    plan = with_method(plan_from_preset(info, "Q4_K_M", imatrix=True), info, "gptq")
    seen: list[tuple[int, str]] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append((d, m)), min_interval=0.0)
    monkeypatch.setattr(quantize, "_SLAB_ROWS", 40)
    export_calibrated(
        llama_model, tmp_path / "o.gguf", plan, text=text, n_ctx=64, n_chunks=3, device="cpu", ctx=ctx
    )
    head = [(d, m) for d, m in seen if m.startswith("output head: gptq lm_head.weight: rows")]
    rows = int(info.config["vocab_size"])
    assert len(head) == -(-rows // 40), head  # one line per slab
    assert "rows 40 of" in head[0][1] and f"rows {rows:,} of {rows:,}" in head[-1][1]
    done = [d for d, _ in head]
    assert done == sorted(done) and done[-1] > done[0], done  # the bar moves through the head


def test_awqs_search_moves_the_bar_point_by_point(llama_model, tmp_path):
    """AWQ's grid search runs ahead of the layer's rounding: each grid point of each group is reported and
    the bar moves through it (at 8B widths a layer's search took 10 min with the bar at 0.4 % and "ETA 32
    h" after it); the search's share is then not counted again when the sites are rounded."""
    from studio.core.jobs import JobContext

    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    info = open_model(llama_model).info
    plan = with_method(plan_from_preset(info, "Q4_K_M", imatrix=True), info, "awq+gptq")
    seen: list[tuple[int, int, str]] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append((d, t, m)), min_interval=0.0)
    export_calibrated(
        llama_model, tmp_path / "o.gguf", plan, text=text, n_ctx=64, n_chunks=3, device="cpu", ctx=ctx
    )
    search = [(d, m) for d, _t, m in seen if ": awq " in m and "(α " in m]
    layer0 = [m for _d, m in search if m.startswith("layer 1/")]
    assert len(layer0) >= 3 * 21 and any("(α 21/21)" in m for m in layer0), layer0[
        :3
    ]  # 3+ groups × 21 points
    done = [d for d, _m in search]
    assert done == sorted(done) and done[-1] > done[0]
