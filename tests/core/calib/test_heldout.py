"""Held-out judgement: the split of a calibration text, the same-size preset, and the verdict a plan gets."""

from __future__ import annotations

import dataclasses

import pytest

from studio.core.calib.data import CalibrationText, mix
from studio.core.calib.heldout import (
    Judgement,
    PresetPoint,
    same_size_preset,
    split_text,
)
from studio.core.errors import CalibrationError


def test_split_cuts_at_a_paragraph_near_the_share_and_keeps_every_character():
    paras = [f"Paragraph {i} " + "word " * (5 + i % 7) for i in range(40)]
    text = "\n\n".join(paras)
    fit, held = split_text(CalibrationText("t", text, True), 0.25)
    assert fit.text + "\n\n" + held.text == text  # cut at a break: nothing lost, nothing doubled
    assert held.text.startswith("Paragraph ")
    assert 0.15 < len(held.text) / len(text) < 0.35
    assert fit.parse_special and held.parse_special  # chats stay chats
    assert "held-out last 25 %" in held.name and "first 75 %" in fit.name
    with pytest.raises(CalibrationError):
        split_text(CalibrationText("t", text), 1.5)


def test_a_mix_is_held_out_from_the_users_part_only():
    own = CalibrationText("mine.txt", "\n\n".join(f"Mine {i} " + "word " * 9 for i in range(40)))
    builtin = CalibrationText("built-in", "Built-in text. " * 200, parse_special=True)
    fit, held = split_text(mix([own, builtin]), 0.25)
    assert held.text.startswith("Mine ") and "Built-in" not in held.text and not held.parse_special
    first, rest = fit.parts
    assert rest is builtin and first.text + "\n\n" + held.text == own.text  # none of it is calibrated on


def test_same_size_preset_is_the_largest_that_fits():
    pres = [("Q3_K_M", 90, {}), ("Q4_K_M", 100, {}), ("Q5_K_M", 120, {})]
    assert same_size_preset(pres, 100)[0] == "Q4_K_M"
    assert same_size_preset(pres, 119)[0] == "Q4_K_M"
    assert same_size_preset(pres, 89) is None
    # the studio's file of a preset may carry a few kB more metadata than llama.cpp's at the budget
    assert same_size_preset([("Q4_K_M", 100_400, {})], 100_000)[0] == "Q4_K_M"
    assert same_size_preset([("Q4_K_M", 100_600, {})], 99_000) is None


def test_a_plan_that_loses_on_heldout_text_is_not_offered_as_better():
    p = PresetPoint("Q4_K_M", 105_454_336, 0.030, {})
    lose = Judgement(0.015, 0.016, 0.031, "code.txt", 2048, p)
    assert lose.beats_preset is False
    v = lose.verdict
    assert v.startswith("No budget plan beats llama.cpp's Q4_K_M") and v.count(". ") == 0 and v.endswith(".")
    assert "--preset Q4_K_M --method awq+gptq" in v and "0.0310 against 0.0300" in v
    assert lose.to_dict()["recommend"] == {"preset": "Q4_K_M", "method": "awq+gptq"}
    win = Judgement(0.015, 0.016, 0.015, "code.txt", 2048, p)
    assert win.beats_preset and "50 % below llama.cpp's Q4_K_M" in win.verdict
    assert win.to_dict()["recommend"] is None
    tie = Judgement(0.015, 0.016, 0.030, "code.txt", 2048, p)
    assert tie.beats_preset is False  # equal is not better


def test_the_guard_keeps_the_embedding_at_the_same_size_presets_type_and_nothing_else(llama_model):
    from studio.core.calib.heldout import guard_for, preset_plans
    from studio.core.model import open_model
    from studio.core.plan.allocate import allocate, parse_budget
    from tests.scan_data import synthetic_scan

    with open_model(llama_model) as ck:
        info = ck.info
    # a scan that calls the embedding free at Q4_0: unguarded, a tight budget takes it there
    scan = synthetic_scan(info, {"Q4_0": 1e-3, "Q8_0": 1e-4})
    emb = next(t for t in scan.tensors if t.gguf_name == "token_embd.weight")
    free = {q: dataclasses.replace(c, kl=0.0) for q, c in emb.by_type.items()}
    scan = dataclasses.replace(
        scan, tensors=tuple(dataclasses.replace(t, by_type=free) if t is emb else t for t in scan.tensors)
    )
    presets = preset_plans(info)
    q8 = next(b for n, b, _ in presets if n == "Q8_0")
    budget = parse_budget(str(q8))
    assert allocate(info, scan, budget).plan.types[emb.name] == "Q4_0"
    guarded, note = guard_for(scan, q8, presets)
    plan = allocate(info, guarded, budget).plan.types
    assert plan[emb.name] in ("Q8_0", "F16") and "token_embd.weight Q8_0" in note
    others = {
        t.name: t.by_type
        for t in guarded.tensors
        if t.gguf_name not in ("token_embd.weight", "output.weight")
    }
    assert others == {t.name: t.by_type for t in scan.tensors if t.name in others}  # nothing else changed
    assert guard_for(scan, 1000, presets) == (scan, "")  # no preset fits: no guard


def test_best_is_the_calibrated_rounding_the_verdict_recommends():
    from studio.core.calib.heldout import BEST_METHOD
    from studio.core.quant.methods import check_method

    assert check_method("best") == check_method("BEST") == BEST_METHOD == "awq+gptq"


def test_the_guard_orders_by_measured_error_and_applies_the_real_fallback():
    # issue 37: "at least as good as" the preset's type is by measured error where measured, else by bytes
    # with the type the rows really get; Q2_0 (2.5 bits, a collapse on a float model) never passes for Q4_K
    from studio.core.calib.heldout import at_least_as_good, guard_edges
    from studio.core.plan.scan import Sensitivity, TensorSensitivity, TypeCost
    from studio.core.quant.types import fallback_type, tensor_bytes

    shape = (1024, 576)  # rows of 576: the K-quants fall back (Q4_K → Q5_0 here), 32-weight types do not
    n = 1024 * 576

    def cost(q, err, unusable=""):
        eff = fallback_type(q, 576).qtype
        return TypeCost(q, 0.01, tensor_bytes(eff, shape), eff, True, err, unusable)

    assert fallback_type("Q4_K", 576).qtype != "Q4_K"
    eff_q4k = fallback_type("Q4_K", 576).qtype
    by = {
        "Q2_0": cost("Q2_0", 900.0),
        "Q4_0": cost("Q4_0", 40.0),
        "IQ4_NL": cost("IQ4_NL", 20.0),  # as many bits as Q4_0, less error
        "Q5_0": cost("Q5_0", 10.0),
        "Q8_0": cost("Q8_0", 1.0),
        "MXFP4": cost("MXFP4", float("nan"), "its quantized weights are not finite"),
    }
    t = TensorSensitivity("model.embed_tokens.weight", "token_embd.weight", "embed", None, n, by)
    scan = Sensitivity("m", "d", "exact", "imatrix", tuple(by), 64, (t,))
    # the floor Q4_K is not a candidate: its fallback (here Q5_0) is, with its measured error
    kept = guard_edges(scan, {t.name: "Q4_K"}, {t.name: 576}).tensors[0].by_type
    assert set(kept) == {q for q, c in by.items() if c.usable and c.error <= by[eff_q4k].error}
    assert "Q2_0" not in kept and "MXFP4" not in kept
    # a floor of IQ4_NL keeps Q5_0 and Q8_0, not Q4_0 (same bits, twice the error)
    kept = guard_edges(scan, {t.name: "IQ4_NL"}, {t.name: 576}).tensors[0].by_type
    assert set(kept) == {"IQ4_NL", "Q5_0", "Q8_0"}
    # without a measured error: bytes, with the fallback the row length gives
    floor = ("Q5_0", tensor_bytes("Q5_0", shape), None)
    assert not at_least_as_good(by["Q4_0"], floor) and at_least_as_good(by["Q8_0"], floor)
    assert not at_least_as_good(by["MXFP4"], ("Q2_0", 1, None))  # unusable never is


def test_the_judge_names_the_preset_whose_file_is_the_budget(llama_model):
    # issue 37: a budget of llama.cpp's IQ3_XXS (or IQ2_M ...) file is judged against that preset; "no
    # llama.cpp preset fits this budget" only below the smallest preset
    from studio.core.calib.heldout import SAME_SIZE, Judgement, preset_plans, same_size_preset
    from studio.core.model import open_model

    with open_model(llama_model) as ck:
        info = ck.info
    pres = preset_plans(info)
    names = [n for n, _, _ in pres]
    assert {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_M", "IQ3_XXS", "IQ3_M", "Q3_K_M", "Q4_K_M", "Q5_K_M"} <= set(
        names
    )
    assert not {"TQ1_0", "TQ2_0", "Q1_0", "Q2_0"} & set(names)
    sizes = [b for _, b, _ in pres]
    for name, nbytes, _ in pres:
        got = same_size_preset(pres, nbytes)
        # the largest file within SAME_SIZE of the budget (llama.cpp's own file lacks the studio's metadata)
        assert got is not None and nbytes <= got[1] <= nbytes * SAME_SIZE
        if not [b for b in sizes if nbytes < b <= nbytes * SAME_SIZE] and sizes.count(nbytes) == 1:
            assert got[0] == name
    assert same_size_preset(pres, min(sizes) // 2) is None
    none = Judgement(0.1, None, 0.2, "held.txt", 256, None)
    assert "no llama.cpp preset fits" in none.verdict
