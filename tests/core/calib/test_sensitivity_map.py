"""The scan as the window draws it: every tensor in its (layer, role) cell with its KL, ranked by KL."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.core.calib.sensitivity_map import kl_at, ranked_tensors, sensitivity_grid
from studio.core.model import open_model
from tests.scan_data import synthetic_scan

KL = {"Q2_K": 0.08, "Q4_K": 0.012, "Q8_0": 0.0005}


@pytest.fixture(scope="module")
def scan(llama_model):
    with open_model(llama_model) as ck:
        return synthetic_scan(ck.info, KL)


def test_the_grid_puts_every_tensor_in_its_layer_and_role_cell(scan):
    g = sensitivity_grid(scan, "Q4_K")
    blocks = sorted({t.layer for t in scan.tensors if t.layer is not None})
    assert g.layers == (None, *blocks) and g.kl.shape == (len(g.layers), len(g.roles))
    # the network's order: embedding first, output last, attention before the feed-forward
    assert g.roles[0] == "token_embd" and g.roles[-1] == "output"
    assert g.roles.index("attn_q") < g.roles.index("ffn_down")
    for t in scan.tensors:
        r, c = g.cell_of(t.name)
        assert g.layers[r] == t.layer and g.roles[c] == t.role and g.name_at(r, c) == t.name
        assert g.kl[r, c] == t.by_type["Q4_K"].kl
    filled = sum(1 for row in g.names for n in row if n is not None)
    assert filled == len(scan.tensors) == int((~np.isnan(g.kl)).sum())
    assert g.name_at(-1, 0) is None and g.name_at(0, len(g.roles)) is None


def test_a_plan_reads_each_tensor_at_its_own_type(scan):
    names = [t.name for t in scan.tensors]
    plan = {n: ("Q2_K" if i % 2 else "Q8_0") for i, n in enumerate(names)}
    plan[names[0]] = "F16"  # a float type costs nothing
    g = sensitivity_grid(scan, plan)
    for t in scan.tensors:
        want = 0.0 if plan[t.name] == "F16" else t.by_type[plan[t.name]].kl
        assert g.kl[g.cell_of(t.name)] == want
    assert kl_at(scan.tensors[1], "Q5_K") is None
    g = sensitivity_grid(scan, {names[1]: "Q4_K"})  # tensors without a type are left empty
    assert int((~np.isnan(g.kl)).sum()) == 1


def test_the_ranking_is_by_kl_at_the_chosen_type(scan):
    top = ranked_tensors(scan, "Q2_K", 5)
    assert len(top) == 5 and [q for _, q, _ in top] == ["Q2_K"] * 5
    kls = [v for _, _, v in top]
    assert kls == sorted(kls, reverse=True)
    everything = sorted((t.by_type["Q2_K"].kl for t in scan.tensors), reverse=True)
    assert all(math.isclose(a, b) for a, b in zip(kls, everything[:5], strict=True))
    assert len(ranked_tensors(scan, "Q2_K")) == len(scan.tensors)
