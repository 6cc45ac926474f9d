"""The budget's default type menu (issue 37): the ternary and 1-2-bit types only when named or when the
model was trained for them (named, the guarantees hold: ``tests/core/calib/test_scan_nonfinite.py``)."""

from __future__ import annotations

import pytest

from studio.core.calib.scan_settings import ALL_SCAN_TYPES, default_types
from studio.core.plan.menu import default_menu, trained_for_low_bit
from studio.core.plan.scan import TRAINED_ONLY_TYPES


@pytest.mark.parametrize(
    ("config", "trained"),
    [
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, False),
        ({}, False),
        (None, False),
        ({"architectures": ["BitNetForCausalLM"], "model_type": "bitnet"}, True),
        ({"architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "bitnet"}}, True),
        ({"quantization_config": {"quant_method": "gptq"}}, False),
        ({"quantization_config": "bitnet"}, False),  # not a mapping: no claim
    ],
    ids=["llama", "empty", "none", "bitnet-arch", "bitnet-quant-config", "gptq", "malformed"],
)
def test_the_menu_takes_trained_only_types_only_for_models_trained_for_them(config, trained):
    assert trained_for_low_bit(config) is trained
    menu = default_types(config)
    assert set(TRAINED_ONLY_TYPES) == {"TQ1_0", "TQ2_0", "Q1_0", "Q2_0"}
    assert (set(TRAINED_ONLY_TYPES) <= set(menu)) is trained
    assert set(menu) - set(TRAINED_ONLY_TYPES) == set(ALL_SCAN_TYPES) - set(TRAINED_ONLY_TYPES)
    assert default_menu(("Q4_0", "Q2_0"), config) == (("Q4_0", "Q2_0") if trained else ("Q4_0",))
