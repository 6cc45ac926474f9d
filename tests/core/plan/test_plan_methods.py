"""Methods are part of the plan: a plan-wide default, per-tensor choices, kept by every verb and in plan JSON."""

from __future__ import annotations

import pytest

from studio.core.errors import QuantizationError
from studio.core.quant.methods import METHODS, method_info


@pytest.fixture(scope="module")
def info(llama_model):
    from studio.core.model import open_model

    with open_model(llama_model) as ck:
        return ck.info


def test_registry_names_the_five_methods() -> None:
    assert list(METHODS) == ["rtn", "imatrix", "gptq", "awq", "awq+gptq"]
    assert not method_info("rtn").calibrated and method_info("imatrix").calibrated
    assert method_info("AWQ+GPTQ").awq and method_info("awq+gptq").hessian
    with pytest.raises(QuantizationError, match="Unknown method 'spqr'"):
        method_info("spqr")


def test_default_and_per_tensor_methods_survive_verbs_and_json(info) -> None:
    from studio.core.plan.plan import (
        Override,
        Plan,
        keep_first_last,
        plan_from_preset,
        plan_from_recipe,
        with_method,
        with_overrides,
        with_types,
    )

    plan = plan_from_preset(info, "Q4_K_M")
    assert plan.method == "rtn" and not plan.calibrated
    q = "model.layers.0.self_attn.q_proj.weight"
    plan = with_method(with_method(plan, info, "gptq"), info, "awq", [q])
    assert plan.calibrated and plan.method_of(q) == "awq"
    assert plan.method_of("model.layers.1.mlp.down_proj.weight") == "gptq"
    assert plan.method_of("model.norm.weight") == "rtn"  # a float tensor has no codes to choose
    for changed in (
        with_types(plan, info, {"model.layers.1.mlp.up_proj.weight": "Q8_0"}),
        keep_first_last(plan, info, 1, "Q8_0"),
        with_overrides(plan, info, [Override("down_proj", "Q5_K")]),
    ):
        assert changed.method == "gptq" and changed.methods == {q: "awq"}
    back = Plan.from_json(plan.to_json(), info)
    assert back.method == "gptq" and dict(back.methods) == {q: "awq"}
    # the recipe remakes the plan-wide method (per-tensor choices mark it edited)
    assert plan.recipe is not None and plan.recipe.method == "gptq" and plan.recipe.edited
    remade = plan_from_recipe(info, plan.recipe.to_dict())
    assert remade.method == "gptq" and dict(remade.types) == dict(plan.types)


def test_methods_are_checked(info) -> None:
    from studio.core.plan.plan import Plan, plan_from_preset, with_method

    plan = plan_from_preset(info, "Q4_K_M")
    with pytest.raises(QuantizationError, match="stays F32"):
        with_method(plan, info, "gptq", ["model.norm.weight"])
    with pytest.raises(QuantizationError, match="Unknown method"):
        with_method(plan, info, "gptq2")
    d = plan.to_dict()
    d["methods"] = {"model.layers.0.mlp.up_proj.weight": "nope"}
    with pytest.raises(QuantizationError, match="Unknown method 'nope'"):
        Plan.from_dict(d, info)
    d["methods"] = {"no.such.tensor": "gptq"}
    with pytest.raises(QuantizationError, match="does not type"):
        Plan.from_dict(d, info)
    d["methods"] = ["gptq"]
    with pytest.raises(QuantizationError, match="'methods' table"):
        Plan.from_dict(d, info)
