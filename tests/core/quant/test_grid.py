"""Block grids: scales and codes taken apart and put back give llama.cpp's bytes, for every type."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.quant import blocks, grid

N = 512


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((6, N)) * rng.uniform(0.01, 2.0, (6, 1))).astype(np.float32)
    x[0, :40] = 0.0  # an all-zero group and super-block edge
    x[1, 7] = 9.0  # an outlier
    x[2] = np.abs(x[2])  # one-signed rows
    qw = rng.uniform(0.1, 5.0, N).astype(np.float32)
    return x, qw


@pytest.mark.parametrize("imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("qtype", grid.GRID_TYPES)
def test_encode_of_search_is_quantize_byte_for_byte(qtype: str, imatrix: bool) -> None:
    x, qw = _data(1)
    want = blocks.quantize(x, qtype, qw if imatrix else None)
    g, codes = grid.search(x, qtype, qw if imatrix else None)
    assert np.array_equal(grid.encode(g, codes), want)
    # the grid's scales and codes decode to exactly what the dequantizer gives (bit for bit)
    deq = blocks.dequantize(want, qtype, x.shape)
    assert np.array_equal(grid.values(g, codes).view(np.uint32), deq.view(np.uint32))
    assert codes.dtype == np.uint8 and int(codes.max()) < g.spec.n_levels


@pytest.mark.parametrize("qtype", grid.GRID_TYPES)
def test_new_codes_land_in_the_codes_and_nowhere_else(qtype: str) -> None:
    x, _ = _data(2)
    g, codes = grid.search(x, qtype)
    rng = np.random.default_rng(3)
    other = rng.integers(0, g.spec.n_levels, codes.shape).astype(np.uint8)
    data = grid.encode(g, other)
    g2, back = grid.unpack(data, qtype, N)
    assert np.array_equal(back, other)
    # every scale field is the search's: the bytes differ only where codes live
    mask = np.tile(g.spec.code_mask(), data.shape[1] // g.spec.nbytes)
    assert np.array_equal(data & ~mask, g.template & ~mask)
    assert np.array_equal(g2.scale, g.scale)
    assert np.array_equal(grid.values(g2, back), blocks.dequantize(data, qtype, x.shape))


@pytest.mark.parametrize("qtype", grid.GRID_TYPES)
def test_nearest_is_the_closest_value_under_fixed_scales(qtype: str) -> None:
    x, qw = _data(4)
    g, codes = grid.search(x, qtype, qw)
    near = grid.nearest(g, x)
    err_near = np.abs(grid.values(g, near) - x)
    err_all = np.abs(grid.values(g, codes) - x)
    assert (err_near <= err_all + 1e-6 * np.abs(x).max()).all()
    # and no other level is closer
    sc = np.repeat(g.scale, g.group, axis=1)[..., None]
    off = 0.0 if g.offset is None else np.repeat(g.offset, g.group, axis=1)[..., None]
    every = np.abs(sc * g.levels + off - x[..., None])
    assert (err_near <= every.min(-1) + 1e-6 * np.abs(x).max()).all()


def test_columns_split_a_grid_at_block_edges() -> None:
    x, _ = _data(5)
    g, codes = grid.search(x, "Q4_K")
    part = g.columns(256, 512)
    assert np.array_equal(grid.encode(part, codes[:, 256:]), blocks.quantize(x[:, 256:], "Q4_K"))
    with pytest.raises(QuantizationError, match="multiples of 256"):
        g.columns(32, 256)


def test_bad_codes_and_types_are_refused() -> None:
    x, _ = _data(6)
    g, codes = grid.search(x, "Q4_0")
    with pytest.raises(QuantizationError, match="16 levels"):
        grid.encode(g, np.full_like(codes, 16))
    with pytest.raises(QuantizationError, match="do not fit"):
        grid.encode(g, codes[:, :32])
    with pytest.raises(QuantizationError, match="no block grid"):
        grid.grid_spec("F16")
