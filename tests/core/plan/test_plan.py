"""Plans: made from presets and recipes, the plan verbs, overrides (first match wins), fallbacks, JSON, sizes."""

from __future__ import annotations

import json

import pytest

from studio.core.errors import QuantizationError
from studio.core.gguf.layout import layout
from studio.core.model import open_model
from studio.core.plan.plan import (
    PLAN_VERSION,
    Override,
    Plan,
    Recipe,
    RecipeKind,
    first_last_tensors,
    keep_first_last,
    plan_first_last,
    plan_from_preset,
    plan_from_recipe,
    plan_uniform,
    tensors_matching,
    with_overrides,
    with_types,
)
from studio.core.plan.presets import PRESETS, preset_types
from studio.core.quant.types import tensor_bytes


@pytest.fixture(scope="module")
def info(llama_model):
    with open_model(llama_model) as ck:
        return ck.info


@pytest.fixture(scope="module")
def odd_info(odd_hidden_model):
    with open_model(odd_hidden_model) as ck:
        return ck.info


def test_required_presets_exist():
    for name in ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"):
        assert name in PRESETS


def test_norms_and_1d_stay_f32_in_every_preset(info):
    lay = layout(info)
    for preset in PRESETS:
        types = preset_types(info, preset)
        assert set(types) == {t.hf_name for t in lay.tensors}
        for tm in lay.tensors:
            if len(tm.shape) == 1:
                assert types[tm.hf_name] == "F32", (preset, tm.hf_name)


def test_json_round_trip_and_version(info):
    plan = plan_from_preset(info, "Q4_K_M", [Override(r"ffn_up", "Q5_K")])
    text = plan.to_json()
    d = json.loads(text)
    assert d["version"] == PLAN_VERSION and d["recipe"]["preset"] == "Q4_K_M"
    again = Plan.from_json(text, info)
    assert dict(again.types) == dict(plan.types) and again.ftype == plan.ftype == 15
    d["version"] = 99
    with pytest.raises(QuantizationError, match="version 99"):
        Plan.from_json(json.dumps(d))
    with pytest.raises(QuantizationError, match="no 'version'"):
        Plan.from_json(json.dumps({"types": {}}))
    with pytest.raises(QuantizationError, match="not valid JSON"):
        Plan.from_json("{nope")
    # a recipe-only plan file is remade for the model it is applied to
    remade = Plan.from_json(json.dumps({"version": 1, "recipe": d["recipe"]}), info)
    assert dict(remade.types) == dict(plan.types)


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"version": 1, "types": {"x": "Q8_0"}, "fallbacks": [1]}, "p.json is malformed"),
        ({"version": 1, "types": {"x": "Q8_0"}, "ftype": "fifteen"}, "p.json is malformed"),
        ({"version": 1, "types": {"x": "Q8_0"}, "fallbacks": [{"tensor": "x"}]}, "p.json is malformed"),
        ({"version": 1, "recipe": {"kind": "uniform"}}, "recipe 'uniform' is malformed"),
        (
            {"version": 1, "recipe": {"kind": "first_last", "n": "one", "high": "Q8_0", "low": "Q4_0"}},
            "malformed",
        ),
        ({"version": 1, "recipe": "Q4_K_M"}, "p.json has no 'types' table"),
    ],
)
def test_hand_edited_plan_files_give_one_clear_error(info, doc, match):
    # regression: these raised KeyError/TypeError/ValueError (a traceback in the CLI) instead of a StudioError
    with pytest.raises(QuantizationError, match=match):
        Plan.from_json(json.dumps(doc), info, source="p.json")


def test_plan_errors_name_the_file():
    with pytest.raises(QuantizationError, match=r"The plan file my\.json is not valid JSON"):
        Plan.from_json("{nope", source="my.json")


def test_plan_for_another_model_is_refused(info, odd_info):
    plan = plan_from_preset(info, "Q4_K_M")
    with pytest.raises(QuantizationError, match="made for another model|cannot be"):
        Plan.from_json(plan.to_json(), odd_info)


def test_overrides_first_match_wins(info):
    plan = plan_uniform(info, "Q4_0", [Override(r"layers\.1\.", "Q8_0"), Override(r"q_proj", "Q6_K")])
    assert plan.types["model.layers.1.self_attn.q_proj.weight"] == "Q8_0"
    assert plan.types["model.layers.0.self_attn.q_proj.weight"] == "Q6_K"
    assert plan.types["model.layers.0.mlp.up_proj.weight"] == "Q4_0"
    # a GGUF name works as well as a HF name
    plan2 = plan_uniform(info, "Q4_0", [Override(r"blk\.0\.ffn_up", "Q5_0")])
    assert plan2.types["model.layers.0.mlp.up_proj.weight"] == "Q5_0"
    # norms are never quantized, whatever an override says
    plan3 = plan_uniform(info, "Q4_0", [Override(r".*", "Q8_0")])
    assert plan3.types["model.norm.weight"] == "F32"
    with pytest.raises(QuantizationError, match="not a valid regex"):
        plan_uniform(info, "Q4_0", [Override("(", "Q8_0")])
    with pytest.raises(QuantizationError, match="unknown type"):
        plan_uniform(info, "Q4_0", [Override("x", "Q9_9")])


def test_first_last(tiny_model):
    with open_model(tiny_model("llama", layers=4)) as ck:
        info4 = ck.info
    plan = plan_first_last(info4, 1, "q8_0", "q4_k")
    assert plan.types["model.layers.0.mlp.up_proj.weight"] == "Q8_0"
    assert plan.types["model.layers.3.mlp.up_proj.weight"] == "Q8_0"
    assert plan.types["model.layers.1.mlp.up_proj.weight"] == "Q4_K"
    assert plan.types["model.layers.2.self_attn.q_proj.weight"] == "Q4_K"
    assert plan.types["model.embed_tokens.weight"] == "Q8_0"
    assert plan.types["model.norm.weight"] == "F32"
    assert plan_from_recipe(info4, plan.recipe).types == plan.types


def test_fallbacks_applied_and_listed(odd_info):
    plan = plan_uniform(odd_info, "Q4_K")
    assert plan.fallbacks
    for f in plan.fallbacks:
        assert plan.types[f.tensor] == f.got == "Q5_0"
        assert "not a multiple of 256" in f.reason
    # an override onto a type that fits removes the fallback
    fixed = with_overrides(plan, odd_info, [Override(".*", "Q8_0")])
    assert not fixed.fallbacks


def test_summary_size_and_bpw(info):
    lay = layout(info)
    for qtype, bpw_range in (("Q8_0", (8.4, 8.6)), ("Q4_0", (4.4, 4.7))):
        plan = plan_uniform(info, qtype)
        s = plan.summary(info)
        assert s.total_bytes == sum(tensor_bytes(plan.types[t.hf_name], t.shape) for t in lay.tensors)
        assert bpw_range[0] <= s.bpw <= bpw_range[1]
        assert s.tensors_by_type[qtype] == sum(1 for t in lay.tensors if len(t.shape) == 2)
    assert plan_from_preset(info, "F16").summary(info).bpw == pytest.approx(16.0, abs=0.1)


# ------------------------------------------------------------------------- plan verbs and recipes


@pytest.fixture(scope="module")
def info4(tiny_model):
    with open_model(tiny_model("llama", layers=4)) as ck:
        return ck.info


def test_with_types_asks_new_types_with_fallbacks(odd_info):
    plan = plan_uniform(odd_info, "Q8_0")
    q = "model.layers.0.self_attn.q_proj.weight"
    edited = with_types(plan, odd_info, {q: "Q4_K"})
    assert edited.types[q] == "Q5_0"  # rows of 320: llama.cpp's fallback, listed
    assert [(f.tensor, f.wanted, f.got) for f in edited.fallbacks] == [(q, "Q4_K", "Q5_0")]
    assert {n: t for n, t in edited.types.items() if n != q} == {
        n: t for n, t in plan.types.items() if n != q
    }
    assert edited.name == "uniform Q8_0 (edited)" and edited.recipe.edited
    assert with_types(edited, odd_info, {q: "Q8_0"}).fallbacks == ()  # asked again: the fallback is gone
    with pytest.raises(QuantizationError, match="must stay F32"):
        with_types(plan, odd_info, {"model.norm.weight": "Q8_0"})
    with pytest.raises(QuantizationError, match="does not export"):
        with_types(plan, odd_info, {"nope.weight": "Q8_0"})
    with pytest.raises(QuantizationError, match="unknown type"):
        with_types(plan, odd_info, {q: "Q9_9"})


def test_keep_first_last_raises_the_outer_layers_embeddings_and_output(info4):
    base = plan_from_preset(info4, "Q4_K_M")
    plan = keep_first_last(base, info4, 1, "Q8_0")
    lay = layout(info4)
    for tm in lay.tensors:
        t = plan.types[tm.hf_name]
        if len(tm.shape) == 1:
            assert t == "F32", tm.hf_name
        elif tm.layer in (0, 3) or tm.layer is None:
            assert t == "Q8_0", tm.hf_name  # first/last layers, token embeddings, output
        else:
            assert t == base.types[tm.hf_name], tm.hf_name  # the preset's mixture stays (Q6_K attn_v...)
    assert {plan.types[t.hf_name] for t in lay.tensors if t.layer in (1, 2)} > {"Q4_K"}
    assert set(first_last_tensors(info4, 1)) == {n for n, t in plan.types.items() if t == "Q8_0"}
    assert plan.ftype == base.ftype == 15 and plan.recipe.keep_first_last == (1, "Q8_0")
    assert plan_from_recipe(info4, plan.recipe).types == plan.types
    again = Plan.from_json(plan.to_json(), info4)
    assert again.recipe == plan.recipe and plan_from_recipe(info4, again.recipe).types == plan.types
    # a second pass cannot be replayed from one recipe: it is recorded as an edit
    assert keep_first_last(plan, info4, 2, "Q6_K").recipe.edited


def test_with_overrides_stack_newest_first_in_the_recipe(info4):
    plan = with_overrides(plan_uniform(info4, "Q4_0"), info4, [Override(r"q_proj", "Q5_0")])
    plan = with_overrides(plan, info4, [Override(r"layers\.0\.", "Q8_0")])
    assert plan.types["model.layers.0.self_attn.q_proj.weight"] == "Q8_0"  # the later override wins
    assert plan.types["model.layers.1.self_attn.q_proj.weight"] == "Q5_0"  # the earlier one stays
    assert [o.pattern for o in plan.recipe.overrides] == [r"layers\.0\.", r"q_proj"]
    assert plan_from_recipe(info4, plan.recipe).types == plan.types
    assert plan.name == "uniform Q4_0 + overrides"
    assert tensors_matching(info4, r"q_proj") == tuple(
        f"model.layers.{i}.self_attn.q_proj.weight" for i in range(4)
    )


def test_recipes_are_typed_and_read_the_json_of_older_plans():
    legacy = {"kind": "first_last", "n": 1, "high": "Q8_0", "low": "Q4_K", "overrides": [["x", "Q5_0"]]}
    r = Recipe.from_dict(legacy)
    assert r == Recipe(
        RecipeKind.UNIFORM, "Q4_K", keep_first_last=(1, "Q8_0"), overrides=(Override("x", "Q5_0"),)
    )
    assert r.to_dict() == legacy  # written back in the form older plans use
    preset = Recipe(RecipeKind.PRESET, "Q4_K_M", imatrix=True, keep_first_last=(2, "Q6_K"), edited=True)
    assert Recipe.from_dict(json.loads(json.dumps(preset.to_dict()))) == preset
    assert Recipe.from_dict({"kind": "uniform", "type": "Q8_0"}) == Recipe(RecipeKind.UNIFORM, "Q8_0")
    with pytest.raises(QuantizationError, match="kind 'magic' is unknown"):
        Recipe.from_dict({"kind": "magic"})


def test_an_unreadable_recipe_next_to_a_types_table_is_dropped(info):
    d = plan_uniform(info, "Q8_0").to_dict()
    d["recipe"] = {"kind": "preset"}  # hand-edited: no preset named
    plan = Plan.from_dict(d, info)
    assert plan.recipe is None and dict(plan.types) == d["types"]
    assert plan.to_dict()["recipe"] == {}


def test_a_model_is_laid_out_once_and_a_changed_info_again(llama_model, monkeypatch):
    """The window's estimates asked for the GGUF layout 57 times while a 32-layer model opened (170 ms of a
    worker holding the GIL, issue 40); the layout is kept with the info object, and an info made from it
    by ``dataclasses.replace`` (other tensors) derives its own."""
    import dataclasses

    from studio.core.gguf import layout as layout_mod

    calls: list[int] = []
    real = layout_mod.studio_layout

    def counted(info):
        calls.append(1)
        return real(info)

    monkeypatch.setattr(layout_mod, "studio_layout", counted)
    with open_model(llama_model) as ck:
        info = ck.info
    first = layout(info)
    assert layout(info) is first and len(calls) == 1
    fewer = dataclasses.replace(info, tensors=tuple(t for t in info.tensors if "lm_head" not in t.name))
    other = layout(fewer)
    assert len(calls) == 2 and other is not first and layout(fewer) is other
