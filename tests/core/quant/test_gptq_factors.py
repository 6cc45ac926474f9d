"""GPTQ's inverse factor made once per Hessian (tensors that share an input, one tensor rounded to many
types): the same bytes as a factor made per call, and one factorisation instead of many."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.quant import gptq, gptq_lattice
from studio.core.quant.gptq import FactorCache, GptqOptions, gptq_quantize
from studio.core.quant.methods import SiteStats
from studio.core.quant.methods import gptq as gptq_method

ROWS, N = 32, 256


def _shared_input(seed: int = 0):
    """Three weights that read one input (so one Hessian), as q/k/v do."""
    import torch

    g = torch.Generator().manual_seed(seed)
    mix = torch.eye(N) + 0.6 * torch.randn(N, N, generator=g) / N**0.5
    x = (torch.randn(1024, N, generator=g) @ mix) * (0.2 + 2 * torch.rand(N, generator=g))
    h = 2 * x.T @ x / x.shape[0]
    ws = [0.05 * torch.randn(ROWS, N, generator=g) for _ in range(3)]
    return ws, h, (x * x).mean(0).numpy().astype(np.float32)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    real = gptq._inverse_factor

    def counted(*a, **k):
        made.append(1)
        return real(*a, **k)

    monkeypatch.setattr(gptq, "_inverse_factor", counted)
    return made


@pytest.mark.parametrize("opt", [GptqOptions(), GptqOptions(act_order=False, scales="float")])
def test_a_shared_factor_gives_the_bytes_of_one_made_per_tensor(
    monkeypatch: pytest.MonkeyPatch, opt: GptqOptions
) -> None:
    ws, h, imx = _shared_input(1)
    types = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")
    alone = [gptq_quantize(w, h, q, imatrix=imx, options=opt) for w in ws for q in types]
    made = _counting(monkeypatch)
    cache = FactorCache()
    shared = [gptq_quantize(w, h, q, imatrix=imx, options=opt, factors=cache) for w in ws for q in types]
    assert len(made) == 1  # twelve sweeps, one factorisation
    for a, b in zip(alone, shared, strict=True):
        assert np.array_equal(a.data, b.data) and a.error == b.error and a.damp == b.damp


def test_the_factor_is_not_shared_across_hessians_or_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    ws, h, imx = _shared_input(2)
    other = h.clone()  # equal values, another object: another input
    made = _counting(monkeypatch)
    cache = FactorCache()
    gptq_quantize(ws[0], h, "Q4_K", imatrix=imx, factors=cache)
    gptq_quantize(ws[1], other, "Q4_K", imatrix=imx, factors=cache)
    gptq_quantize(ws[2], h, "Q4_K", imatrix=imx, options=GptqOptions(act_order=False), factors=cache)
    gptq_quantize(ws[2], h, "Q4_K", imatrix=imx, options=GptqOptions(damp=0.1), factors=cache)
    assert len(made) == 4


def test_the_lattice_sweep_and_the_method_share_the_factor_too(monkeypatch: pytest.MonkeyPatch) -> None:
    ws, h, imx = _shared_input(3)
    alone = [gptq_lattice.gptq_lattice(w, h, "IQ3_S", imatrix=imx) for w in ws]
    made = _counting(monkeypatch)
    cache = FactorCache()
    shared = [gptq_method(w, SiteStats("t", 1024, imx, h, None, cache), "IQ3_S") for w in ws]
    grid = gptq_method(ws[0], SiteStats("t", 1024, imx, h, None, cache), "Q4_K")
    assert len(made) == 2  # one for the lattice's group order, one for the block grids' column order
    for a, b in zip(alone, shared, strict=True):
        assert np.array_equal(a.data, b.data)
    assert np.array_equal(grid.data, gptq_quantize(ws[0], h, "Q4_K", imatrix=imx).data)


def test_a_released_factor_is_made_again_and_the_others_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    ws, h, imx = _shared_input(4)
    other = h.clone()
    made = _counting(monkeypatch)
    cache = FactorCache()
    gptq_quantize(ws[0], h, "Q4_K", imatrix=imx, factors=cache)
    gptq_quantize(ws[1], other, "Q4_K", imatrix=imx, factors=cache)
    cache.release(h)
    gptq_quantize(ws[2], other, "Q4_K", imatrix=imx, factors=cache)
    assert len(made) == 2  # the other Hessian's factor is still held
    gptq_quantize(ws[2], h, "Q4_K", imatrix=imx, factors=cache)
    assert len(made) == 3
