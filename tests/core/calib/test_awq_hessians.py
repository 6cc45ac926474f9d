"""AWQ's rescaled Hessians (issue 40): each divided once per shared input, a block of rows at a time, and the
raw one let go before the layer is rounded (at 8B widths the raw Hessians held beside the rescaled ones,
1 GB, put awq+gptq's peak at 6.45 GB on the 2-layer fixture)."""

from __future__ import annotations

import gc
import weakref

import torch

from studio.core.calib import quantize


def test_the_rescaled_hessian_is_the_whole_division_bit_for_bit(monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 70, generator=g)
    h = x.T @ x
    s = torch.rand(70, generator=g, dtype=torch.float64) + 0.5
    want = h / (s.float()[:, None] * s.float()[None, :])
    monkeypatch.setattr(quantize, "_RESCALE_BLOCK", 9 * 70)  # blocks of 9 rows
    got = quantize.rescaled_hessian(h, s)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_each_shared_input_is_divided_once_and_its_raw_hessian_let_go():
    g = torch.Generator().manual_seed(5)
    qkv, down, plain = (torch.rand(n, n, generator=g) for n in (8, 16, 4))
    s_qkv, s_down = torch.rand(8, generator=g) + 0.5, torch.rand(16, generator=g) + 0.5
    hess = {"q": (qkv, 10), "k": (qkv, 10), "v": (qkv, 10), "down": (down, 10), "o": (plain, 10)}
    scales = {"q": s_qkv, "k": s_qkv, "v": s_qkv, "down": s_down}
    refs = [weakref.ref(qkv), weakref.ref(down)]
    want_qkv = qkv / (s_qkv[:, None] * s_qkv[None, :])
    want_down = down / (s_down[:, None] * s_down[None, :])
    del qkv, down
    quantize._divide_by_scales(hess, scales)
    gc.collect()
    assert all(r() is None for r in refs)  # no raw Hessian of a scaled site is left
    assert hess["q"][0] is hess["k"][0] is hess["v"][0]  # one rescaled matrix for the shared input
    assert torch.equal(hess["q"][0], want_qkv) and torch.equal(hess["down"][0], want_down)
    assert hess["o"][0] is plain and hess["q"][1] == 10  # a site without scales keeps its own


def test_a_summed_hessian_is_scaled_to_float32_a_block_at_a_time_with_the_same_bits(monkeypatch):
    """``2XᵀX/n`` in float32 from the float64 sum, a block of rows at a time: the scaled float64 copy of a
    14336-wide input's sum was another 1.6 GB at the moment GPTQ took it."""
    from studio.core.calib import accumulators

    g = torch.Generator().manual_seed(11)
    acc = accumulators.HessianAccumulator(70, "cpu")
    acc.add(torch.randn(3, 50, 70, generator=g))
    want = (acc.xtx * (2.0 / acc.rows)).float()
    monkeypatch.setattr(accumulators, "_HESSIAN_BLOCK", 9 * 70)
    got = acc.tensor()
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(accumulators.HessianAccumulator(5, "cpu").tensor(), torch.zeros(5, 5))


def test_a_float32_sum_taken_is_scaled_in_place():
    """A float32 sum (the probe's judging Hessians, MPS) that is taken is scaled in place: no second n × n
    copy; the values are those of the copy."""
    from studio.core.calib import accumulators

    g = torch.Generator().manual_seed(13)
    acc = accumulators.HessianAccumulator(40, "cpu", torch.float32)
    acc.add(torch.randn(2, 30, 40, generator=g))
    want = acc.tensor()
    buf = acc.xtx
    got = acc.tensor(consume=True)
    assert got is buf and torch.equal(got, want) and acc.xtx is None
