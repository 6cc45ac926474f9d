"""GPTQ on the new grids: the scalar low-bit types (gptq_lowbit), the lattice i-quants (gptq_lattice, vector
GPTQ), and the torch path of the scalar quantizers (lowbit_torch)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.quant import blocks, gptq_lattice, gptq_lowbit, lowbit
from studio.core.quant.gptq import GptqOptions, gptq_quantize, output_error
from studio.core.quant.methods import SiteStats
from studio.core.quant.methods import gptq as gptq_method

ROWS, N = 32, 512
SCALAR = lowbit.LOWBIT_TYPES
LATTICE = gptq_lattice.LATTICE_TYPES


def _outlier_problem(seed: int = 0):
    """A layer with correlated inputs, one loud input channel, and planted weight outliers."""
    import torch

    g = torch.Generator().manual_seed(seed)
    mix = torch.eye(N) + 0.6 * torch.randn(N, N, generator=g) / N**0.5
    x = (torch.randn(2048, N, generator=g) @ mix) * (0.2 + 2 * torch.rand(N, generator=g))
    x[:, 17] *= 12  # an activation outlier channel
    h = 2 * x.T @ x / x.shape[0]
    w = 0.05 * torch.randn(ROWS, N, generator=g)
    r = torch.randint(0, ROWS, (24,), generator=g)
    c = torch.randint(0, N, (24,), generator=g)
    w[r, c] = 0.6 * torch.sign(torch.randn(24, generator=g))  # planted weight outliers
    imx = (x * x).mean(0).numpy().astype(np.float32)
    return w, h, imx


def _gguf_decode(data: np.ndarray, qtype: str) -> np.ndarray:
    """gguf-py's dequantizer (Q1_0 and Q2_0, which gguf-py 0.19 cannot decode, by the studio's decoder)."""
    if qtype in ("Q1_0", "Q2_0"):
        return lowbit.dequantize_rows(data, qtype, N)
    y = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype])
    return np.asarray(y, np.float32).reshape(data.shape[0], -1)


def _llama_bytes(x: np.ndarray, qtype: str, imx: np.ndarray | None) -> np.ndarray:
    if qtype in SCALAR:
        return lowbit.quantize_rows(x, qtype)
    return blocks.quantize(x, qtype, imx)


# ------------------------------------------------------------------------------------------ layouts


@pytest.mark.parametrize("qtype", SCALAR)
def test_scalar_grids_take_llamacpps_bytes_apart_and_back(qtype: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((9, N)) * rng.uniform(0.01, 3, (9, 1))).astype(np.float32)
    x[0] = 0.0
    x[1, ::3] = -0.0
    data = lowbit.quantize_rows(x, qtype)
    g, codes = gptq_lowbit.unpack(data, qtype, N)
    assert np.array_equal(gptq_lowbit.encode(g, codes), data)
    assert np.array_equal(gptq_lowbit.values(g, codes), lowbit.dequantize_rows(data, qtype, N))
    # every code the type has (Q2_0's and TQ2_0's 2, which ggml's rounding never writes, too) decodes
    sp = gptq_lowbit.grid_spec(qtype)
    all_codes = np.resize(np.arange(sp.n_levels, dtype=np.uint8), codes.shape)
    y = gptq_lowbit.values(g, all_codes)
    assert np.array_equal(_gguf_decode(gptq_lowbit.encode(g, all_codes), qtype), y)


@pytest.mark.parametrize("qtype", LATTICE)
def test_lattice_codes_take_llamacpps_bytes_apart_and_back(qtype: str) -> None:
    w, _, imx = _outlier_problem(2)
    data = blocks.quantize(w.numpy(), qtype, imx)
    c = gptq_lattice.unpack(data, qtype, N)
    assert np.array_equal(gptq_lattice.encode(data, c), data)
    assert np.array_equal(gptq_lattice.decode(c).reshape(ROWS, N), _gguf_decode(data, qtype))


def test_parity_types_refuse_an_odd_sign_pattern() -> None:
    w, _, imx = _outlier_problem(3)
    data = blocks.quantize(w.numpy(), "IQ2_XS", imx)
    c = gptq_lattice.unpack(data, "IQ2_XS", N)
    c.neg[0, 0, 0] = ~c.neg[0, 0, 0]
    with pytest.raises(QuantizationError, match="even number of negatives"):
        gptq_lattice.encode(data, c)


# ------------------------------------------------------------------------------------------ GPTQ


@pytest.mark.parametrize("qtype", SCALAR + LATTICE)
def test_gptq_lowers_the_output_error_on_the_new_grids(qtype: str) -> None:
    import torch

    w, h, imx = _outlier_problem()
    # fitted to this H alone (the default "diag" damping blends H with its diagonal, trading this in-sample
    # error for error on other text; at λ = 1 IQ1_M measured 1.005× llama.cpp's error here)
    fit = GptqOptions(damp=0.01, damp_mode="mean")
    if qtype in LATTICE:
        r = gptq_lattice.gptq_lattice(w, h, qtype, imatrix=imx, options=fit)
    else:
        r = gptq_quantize(w, h, qtype, imatrix=imx, options=fit)
    want = _llama_bytes(w.numpy(), qtype, imx)
    assert r.data.shape == want.shape and r.data.dtype == np.uint8  # the same type and size
    back = torch.from_numpy(_gguf_decode(r.data, qtype))  # the bytes decode with gguf-py
    rtn = torch.from_numpy(_gguf_decode(want, qtype))
    assert output_error(w, back, h) == pytest.approx(r.error, rel=1e-4)
    assert output_error(w, rtn, h) == pytest.approx(r.rtn_error, rel=1e-4)
    bound = 0.95 if qtype == "IQ1_M" else 0.85
    assert r.error < bound * r.rtn_error, f"{qtype}: gptq/llama.cpp output error {r.gain:.3f}"


@pytest.mark.parametrize("qtype", ["Q1_0", "TQ2_0", "MXFP4", "IQ2_XXS", "IQ3_S", "IQ1_S"])
def test_gptq_keeps_llamacpps_scale_fields(qtype: str) -> None:
    w, h, imx = _outlier_problem(4)
    want = _llama_bytes(w.numpy(), qtype, imx)
    if qtype in LATTICE:  # the scales of the float weights' search (the default searches them on arrival)
        r = gptq_lattice.gptq_lattice(w, h, qtype, imatrix=imx, options=GptqOptions(scales="float"))
        a, b = gptq_lattice.unpack(r.data, qtype, N), gptq_lattice.unpack(want, qtype, N)
        assert np.array_equal(a.scale, b.scale)
        assert (a.dneg is None) or np.array_equal(a.dneg, b.dneg)  # IQ1_S: per-32 delta kept
        assert not np.array_equal(a.idx, b.idx)
    else:
        r = gptq_quantize(w, h, qtype, imatrix=imx, options=GptqOptions(scales="float"))
        mask = np.tile(
            gptq_lowbit.grid_spec(qtype).code_mask(), want.shape[1] // gptq_lowbit.grid_spec(qtype).nbytes
        )
        assert np.array_equal(r.data & ~mask, want & ~mask)
        assert not np.array_equal(r.data, want)


@pytest.mark.parametrize("qtype", ["IQ2_XXS", "IQ2_S", "IQ3_XXS", "IQ3_S"])
def test_the_sign_group_search_finds_the_nearest_allowed_point(qtype: str) -> None:
    """Against brute force over every grid point (pair) and, for the parity types, every single sign flip:
    the search's choice is as near as the nearest allowed vector, and its negatives are even in number."""
    import itertools

    import torch

    rng = np.random.default_rng(11)
    T = gptq_lattice.table(qtype).astype(np.float64)
    dim, parity = T.shape[1], qtype in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS")
    R = 40  # more rows than one piece of the flip search holds at 256 points of 4 (IQ3_XXS: 2,048 / 1,024)
    wg = (rng.standard_normal((R, 8)) * rng.uniform(0.2, 3.0, (R, 1))).astype(np.float32)
    c = rng.uniform(0.1, 2.0, 8).astype(np.float32)
    s = rng.uniform(0.05, 0.6, R).astype(np.float32)
    search = gptq_lattice._Searcher(qtype, "cpu")
    runs = []
    for piece in (7, None):  # the CPU's pieces (several, the last one short), an accelerator's one pass
        search.piece = piece
        runs.append(search.choose(torch.from_numpy(wg), torch.from_numpy(c), torch.from_numpy(s), None))
    _, neg, _, vals = runs[0]
    assert torch.equal(vals, runs[1][3]) and (neg is None or torch.equal(neg, runs[1][1]))
    wg, c, s = wg.astype(np.float64), c.astype(np.float64), s.astype(np.float64)
    got = ((wg - vals.numpy()) ** 2 * c).sum(1)
    pts = np.array([np.concatenate(q) for q in itertools.product(T, repeat=8 // dim)])  # (P^(8/dim), 8)
    for r in range(R):
        signs = np.where(wg[r] < 0, -1.0, 1.0)
        flips = [np.ones(8)]
        if parity and (wg[r] < 0).sum() % 2:
            flips = [np.where(np.arange(8) == j, -1.0, 1.0) for j in range(8)]
        best = min((((wg[r] - s[r] * pts * signs * f) ** 2) * c).sum(1).min() for f in flips)
        # float32 search: equal to the nearest within its rounding of the expanded distance
        assert got[r] == pytest.approx(best, abs=1e-5 * float((wg[r] ** 2 * c).sum())), (qtype, r)
        if parity:
            assert int(neg[r].sum()) % 2 == 0


def test_the_gptq_method_routes_lattice_types_to_vector_gptq() -> None:
    w, h, imx = _outlier_problem(5)
    enc = gptq_method(w, SiteStats("t", 2048, imx, h, GptqOptions(act_order=False)), "IQ3_XXS")
    assert enc.qtype == "IQ3_XXS" and enc.error < enc.rtn_error
    assert enc.data.shape == blocks.quantize(w.numpy(), "IQ3_XXS", imx).shape


def test_lattice_gptq_on_a_cuda_like_torch_run_matches_cpu_bytes() -> None:
    """The sweep is torch throughout: the same call with act-order on and off gives standard bytes."""
    w, h, imx = _outlier_problem(6)
    for act in (True, False):
        r = gptq_lattice.gptq_lattice(w, h, "IQ2_S", imatrix=imx, options=GptqOptions(act_order=act))
        assert np.isfinite(_gguf_decode(r.data, "IQ2_S")).all()


# ------------------------------------------------------------------------------------------ torch path


def _edge_rows() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    xs = [
        rng.standard_normal((16, N)).astype(np.float32),
        (rng.standard_normal((8, N)) * 1e-40).astype(np.float32),  # subnormals
        (np.round(rng.standard_normal((8, N)) * 2) / 4).astype(np.float32),  # ties
        np.zeros((2, N), np.float32),
        (rng.standard_normal((8, N)) * 6e4).astype(np.float32),  # beyond fp16
    ]
    x = (rng.standard_normal((8, N)) * 1e-6).astype(np.float32)
    x[:, 3] = 3e38  # one-hot outlier
    xs.append(x)
    x = rng.standard_normal((8, N)).astype(np.float32)
    x[:, ::7] = -0.0
    x[:, 1] = 1e-45  # a block whose reciprocal scale overflows
    x[:, 256:] = 0.0
    x[:, 300] = 1e-45
    xs.append(x)
    return xs


@pytest.mark.parametrize("qtype", SCALAR)
def test_torch_path_gives_the_numba_bytes(qtype: str) -> None:
    import torch

    from studio.core.quant.lowbit_torch import quantize_rows_torch

    for x in _edge_rows():
        want = lowbit.quantize_rows(x, qtype)
        assert np.array_equal(quantize_rows_torch(torch.from_numpy(x), qtype).numpy(), want)
        assert np.array_equal(blocks.quantize(torch.from_numpy(x), qtype, backend="torch"), want)


@pytest.mark.parametrize("qtype", ["Q2_0", "MXFP4", "TQ1_0"])
def test_scalar_gptq_sweeps_give_the_same_bytes_in_numba_and_torch(qtype: str) -> None:
    """The GPU sweep (torch) and the CPU one (numba) round the low-bit grids alike."""
    w, h, imx = _outlier_problem(8)
    opt = GptqOptions(scales="arrival", act_order=False)
    fast = gptq_quantize(w, h, qtype, imatrix=imx, options=opt)
    ref = gptq_quantize(w, h, qtype, imatrix=imx, options=opt, backend="torch")
    assert np.array_equal(fast.data, ref.data)
