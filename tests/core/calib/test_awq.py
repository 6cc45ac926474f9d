"""AWQ: folding the scales leaves the float model's function unchanged; the search finds scales that help."""

from __future__ import annotations

import numpy as np
import pytest


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_folded_scales_compute_the_same_function(arch: str, request: pytest.FixtureRequest) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from studio.core.calib import awq
    from studio.core.calib.runner import LayerView

    path = request.getfixturevalue(f"{arch}_model")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False).eval()
    ids = list(range(3, 40))
    before = _logits(model, ids)
    g = torch.Generator().manual_seed(0)
    config = model.config.to_dict()
    folded = set()
    for i, layer in enumerate(model.model.layers):
        view = LayerView(i, layer, (), model, f"model.layers.{i}.")
        groups, why = awq.layer_groups(layer, arch, config)
        assert why is None and len(groups) == 4  # q/k/v, gate/up, down, o (GQA: tied across heads)
        for grp in groups:
            n = layer.get_submodule(grp.linears[0]).weight.shape[1]
            m = torch.exp(torch.randn(n, generator=g))  # stand-in activation magnitudes, a wide spread
            s = awq.group_scales(m, 0.7, grp.tie, grp.head_dim)
            assert float(s.max() / s.min()) > 5
            awq.fold(view, awq.AwqChoice(grp, 0.7, s, 0.0, 0.0))
            folded.add(grp.prev)
        assert view.changed
    after = _logits(model, ids)
    assert folded == {"input_layernorm", "post_attention_layernorm", "mlp.up_proj", "self_attn.v_proj"}
    scale = float(np.abs(before).max())
    assert float(np.abs(after - before).max()) <= 2e-5 * scale
    # and the weights really moved: the same model without the norm fold computes something else
    layer = model.model.layers[0]
    with torch.no_grad():
        layer.input_layernorm.weight.mul_(2.0)
    assert float(np.abs(_logits(model, ids) - before).max()) > 1e-3 * scale


def test_layers_of_other_architectures_are_left_alone(phi3_model) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from studio.core.calib import awq

    model = AutoModelForCausalLM.from_pretrained(phi3_model, dtype=torch.float32, trust_remote_code=False)
    groups, why = awq.layer_groups(model.model.layers[0], "phi3", model.config.to_dict())
    assert groups == [] and "not available for phi3" in why


def test_search_scales_the_salient_channels_under_the_target_grid() -> None:
    import torch

    from studio.core.calib import awq

    g = torch.Generator().manual_seed(1)
    n = 256
    gain = torch.ones(n)
    gain[torch.randperm(n, generator=g)[:8]] = 30.0  # a few salient input channels, as in LLMs
    x = torch.randn(4096, n, generator=g) * gain
    h = 2 * x.T @ x / x.shape[0]
    w = 0.05 * torch.randn(64, n, generator=g)
    grp = awq.AwqGroup("input_layernorm", ("self_attn.q_proj",))
    imx = (x * x).mean(0).numpy().astype(np.float32)
    choice = awq.search_group(grp, [w], ["Q4_0"], h, x.abs().mean(0), imx, grid=10)
    assert choice.alpha > 0 and choice.gain < 0.9
    assert choice.loss_unscaled == pytest.approx(awq._quant_error(w, torch.ones(n), h, "Q4_0", imx), rel=1e-6)


_ERROR_SETUP = """
from studio.core.calib import awq
w, h = weight_and_hessian(16384, 2048, 256)
s = awq.group_scales(torch.rand(2048, generator=g) + 0.1, 0.5)
imx = torch.diagonal(h).numpy().astype(np.float32)
"""


def test_a_grid_point_rounds_and_measures_a_block_of_rows_at_a_time() -> None:
    """Each point of AWQ's grid rounds the scaled weight and measures its output error. Whole, that held
    8.6 float32 copies of this 16384 × 2048 matrix at once (2 GB for an 8B's ``down_proj``, the peak of
    AWQ on the 8B fixture); a block of rows at a time, 4.0."""
    from tests.memprobe import added_by

    copies = added_by(_ERROR_SETUP, 'awq._quant_error(w, s, h, "Q4_K", imx)', threads=2) / (16384 * 2048 * 4)
    assert copies < 5.5, f"one point of AWQ's grid held {copies:.1f} copies of the weight at its peak"
