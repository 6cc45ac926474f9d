"""Block grids: the scales a GGUF type's search chose, and the codes under them, taken apart and put back.

Every quantized GGUF type decodes a weight as ``scale[g] · level[code] + offset[g]``: ``g`` is the
weight's scale group (16 or 32 consecutive weights of a row), ``code`` an integer field of a few bits
and ``level`` the type's table (``code − 8`` for Q4_0, the non-linear values of IQ4_NL, ...). The
group scales and offsets come from the block's stored fields (fp16 super-scales times 4-, 6- or 8-bit
sub-scales); ``unpack`` reads them as the dequantizer computes them, in float32, and ``encode`` writes
new codes into the bytes of a search while leaving every scale field as the search wrote it. So a
calibrated method (GPTQ) can fix the scales with llama.cpp's own search (``search``: the kernels of
``blocks.quantize``, bit-exact) and then choose each code itself; ``encode(*search(x))`` is
``quantize(x)`` byte for byte (tests/core/quant/test_grid.py), so the two cannot drift apart.

Codes here are indices into ``BlockGrid.levels`` (increasing): Q8_0's stored int8 ``q`` is code
``q + 128``; every other type stores the code itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.quant.types import IQ4NL_LEVELS, QTYPES, k4_scales, row_bytes

__all__ = [
    "GRID_TYPES",
    "BlockGrid",
    "encode",
    "grid_spec",
    "k4_scales",
    "nearest",
    "search",
    "unpack",
    "values",
]

GRID_TYPES: tuple[str, ...] = (
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "IQ4_NL",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_XS",
)
"""The qtypes whose scales and codes can be taken apart (every quantized type the studio writes)."""


@dataclass(frozen=True, eq=False)
class GridSpec:
    """Where one qtype keeps its codes inside a block, and how they decode."""

    qtype: str
    block: int  # weights per block
    nbytes: int  # bytes per block
    group: int  # weights per scale group
    levels: np.ndarray  # float32 value of each code, increasing
    base: int | None  # levels[k] == base + k (a uniform grid); None for a table
    lo_byte: np.ndarray  # per position in the block: byte of the code's low bits
    lo_shift: np.ndarray
    lo_bits: int
    hi_byte: np.ndarray | None  # the code's high bits (Q5_0/Q5_1/Q5_K/Q6_K/Q3_K), if any
    hi_shift: np.ndarray | None
    hi_bits: int
    flip: int  # XOR between code and stored field (Q8_0 stores int8: 0x80)
    affine: bool  # groups have an offset (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K)

    @property
    def n_levels(self) -> int:
        """Number of codes."""
        return int(self.levels.shape[0])

    def code_mask(self) -> np.ndarray:
        """(nbytes,) uint8: the bits of a block that hold codes."""
        m = np.zeros(self.nbytes, np.int64)
        np.bitwise_or.at(m, self.lo_byte, ((1 << self.lo_bits) - 1) << self.lo_shift)
        if self.hi_byte is not None:
            np.bitwise_or.at(m, self.hi_byte, ((1 << self.hi_bits) - 1) << self.hi_shift)
        return m.astype(np.uint8)


def _uniform(lo: int, hi: int) -> np.ndarray:
    return np.arange(lo, hi + 1, dtype=np.float32)


def _nib32(first: int) -> tuple[np.ndarray, np.ndarray]:
    # 32 weights in 16 bytes: element j in the low nibble of byte j, j + 16 in the high one
    p = np.arange(32)
    return first + p % 16, 4 * (p // 16)


def _qh32(first: int) -> tuple[np.ndarray, np.ndarray]:
    # the fifth bit of element j is bit j of a little-endian u32
    p = np.arange(32)
    return first + p // 8, p % 8


@cache
def grid_spec(qtype: str) -> GridSpec:
    """The code layout of ``qtype`` (one of ``GRID_TYPES``)."""
    if qtype not in GRID_TYPES:
        raise QuantizationError(
            f"{qtype} has no block grid; calibrated methods quantize to {', '.join(GRID_TYPES)}."
        )
    info = QTYPES[qtype]
    nb = info.type_size
    none = (None, None)
    if qtype == "Q8_0":
        p = np.arange(32)
        lo, hi, lb, hb, lev, base, flip = (2 + p, 0 * p), none, 8, 0, _uniform(-128, 127), -128, 0x80
    elif qtype in ("Q4_0", "IQ4_NL"):
        lo, hi, lb, hb = _nib32(2), none, 4, 0
        lev, base = (_uniform(-8, 7), -8) if qtype == "Q4_0" else (IQ4NL_LEVELS.astype(np.float32), None)
        flip = 0
    elif qtype == "Q4_1":
        lo, hi, lb, hb, lev, base, flip = _nib32(4), none, 4, 0, _uniform(0, 15), 0, 0
    elif qtype == "Q5_0":
        lo, hi, lb, hb, lev, base, flip = _nib32(6), _qh32(2), 4, 1, _uniform(-16, 15), -16, 0
    elif qtype == "Q5_1":
        lo, hi, lb, hb, lev, base, flip = _nib32(8), _qh32(4), 4, 1, _uniform(0, 31), 0, 0
    elif qtype == "IQ4_XS":
        p = np.arange(256)
        ib, j = p // 32, p % 32
        lo, hi, lb, hb = (8 + 16 * ib + j % 16, 4 * (j // 16)), none, 4, 0
        lev, base, flip = IQ4NL_LEVELS.astype(np.float32), None, 0
    elif qtype in ("Q4_K", "Q5_K"):
        p = np.arange(256)
        c, h, ln = p // 64, (p // 32) % 2, p % 32
        if qtype == "Q4_K":
            lo, hi, lb, hb, lev = (16 + 32 * c + ln, 4 * h), none, 4, 0, _uniform(0, 15)
        else:
            lo, hi, lb, hb, lev = (48 + 32 * c + ln, 4 * h), (16 + ln, 2 * c + h), 4, 1, _uniform(0, 31)
        base, flip = 0, 0
    elif qtype == "Q6_K":
        p = np.arange(256)
        H, k, ln = p // 128, (p // 32) % 4, p % 32
        lo, hi, lb, hb = (64 * H + 32 * (k % 2) + ln, 4 * (k // 2)), (128 + 32 * H + ln, 2 * k), 4, 2
        lev, base, flip = _uniform(-32, 31), -32, 0
    elif qtype == "Q3_K":
        p = np.arange(256)
        H, k, ln = p // 128, (p // 32) % 4, p % 32
        lo, hi, lb, hb = (32 + 32 * H + ln, 2 * k), (ln, 4 * H + k), 2, 1
        lev, base, flip = _uniform(-4, 3), -4, 0
    else:  # Q2_K
        p = np.arange(256)
        H, k, ln = p // 128, (p // 32) % 4, p % 32
        lo, hi, lb, hb, lev, base, flip = (16 + 32 * H + ln, 2 * k), none, 2, 0, _uniform(0, 3), 0, 0
    group = 16 if qtype in ("Q2_K", "Q3_K", "Q6_K") else 32
    return GridSpec(
        qtype=qtype,
        block=info.block_size,
        nbytes=nb,
        group=group,
        levels=lev,
        base=base,
        lo_byte=np.asarray(lo[0], np.int64),
        lo_shift=np.asarray(lo[1], np.int64),
        lo_bits=lb,
        hi_byte=None if hi[0] is None else np.asarray(hi[0], np.int64),
        hi_shift=None if hi[1] is None else np.asarray(hi[1], np.int64),
        hi_bits=hb,
        flip=flip,
        affine=qtype in ("Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K"),
    )


@dataclass(frozen=True, eq=False)
class BlockGrid:
    """The scale groups of one quantized tensor (rows × n weights) and the bytes that hold them.

    A weight of group ``g`` in row ``r`` decodes as ``scale[r, g] · levels[code] + offset[r, g]``
    (``offset`` is None for symmetric types). ``template`` is the search's encoding: ``encode``
    keeps its scale fields and replaces its codes.
    """

    qtype: str
    scale: np.ndarray  # float32 (rows, n // group)
    offset: np.ndarray | None  # float32 (rows, n // group)
    template: np.ndarray  # uint8 (rows, row bytes)

    @property
    def spec(self) -> GridSpec:
        """The qtype's code layout."""
        return grid_spec(self.qtype)

    @property
    def levels(self) -> np.ndarray:
        """Value of each code (float32, increasing)."""
        return self.spec.levels

    @property
    def group(self) -> int:
        """Weights per scale group."""
        return self.spec.group

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, weights per row)."""
        return int(self.scale.shape[0]), int(self.scale.shape[1]) * self.group

    def columns(self, c0: int, c1: int) -> BlockGrid:
        """The grid of columns [c0, c1) (whole blocks)."""
        sp = self.spec
        if c0 % sp.block or c1 % sp.block:
            raise QuantizationError(f"{self.qtype} grids split only at multiples of {sp.block} columns.")
        g0, g1 = c0 // sp.group, c1 // sp.group
        b0, b1 = c0 // sp.block * sp.nbytes, c1 // sp.block * sp.nbytes
        off = None if self.offset is None else self.offset[:, g0:g1]
        return type(self)(self.qtype, self.scale[:, g0:g1], off, self.template[:, b0:b1])


# ------------------------------------------------------------------------------------------ scales


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, at : at + 2]).view("<f2").astype(np.float32)[:, 0]


def _q3_scales(s: np.ndarray) -> np.ndarray:
    # the 12-byte 6-bit (offset 32) scale packing of Q3_K -> (B, 16) signed
    s = s.astype(np.int32)
    low = np.concatenate([s[:, :8] & 15, s[:, :8] >> 4], axis=1)
    j = np.arange(16)
    high = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


def _group_scales(b: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Per block (B, bytes): the (B, groups per block) scales and offsets, as the dequantizer computes them."""
    f = np.float32
    if qtype in ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL"):
        return _f16(b, 0)[:, None], None
    if qtype in ("Q4_1", "Q5_1"):
        return _f16(b, 0)[:, None], _f16(b, 2)[:, None]
    if qtype == "IQ4_XS":
        d = _f16(b, 0)[:, None]
        sh = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.int32)
        sl = b[:, 4:8].astype(np.int32)
        ib = np.arange(8)
        ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
        return d * (ls - 32).astype(f), None
    if qtype in ("Q4_K", "Q5_K"):
        sc, mn = k4_scales(b[:, 4:16].astype(np.int32))
        d, dmin = _f16(b, 0)[:, None], _f16(b, 2)[:, None]
        return d * sc.astype(f), -(dmin * mn.astype(f))
    if qtype == "Q6_K":
        return _f16(b, 208)[:, None] * b[:, 192:208].view(np.int8).astype(f), None
    if qtype == "Q3_K":
        return _f16(b, 108)[:, None] * _q3_scales(b[:, 96:108]).astype(f), None
    # Q2_K
    sc = b[:, :16].astype(np.int32)
    d, dmin = _f16(b, 80)[:, None], _f16(b, 82)[:, None]
    return d * (sc & 15).astype(f), -(dmin * (sc >> 4).astype(f))


# ------------------------------------------------------------------------------------------ API


def _blocks(data: np.ndarray, sp: GridSpec, n: int) -> np.ndarray:
    rb = row_bytes(sp.qtype, n)
    d = np.ascontiguousarray(np.asarray(data, dtype=np.uint8))
    if d.ndim != 2 or d.shape[1] != rb:
        raise QuantizationError(f"{sp.qtype} data of shape {d.shape} does not hold rows of {n} weights.")
    return d.reshape(-1, sp.nbytes)


def unpack(data: np.ndarray, qtype: str, n: int) -> tuple[BlockGrid, np.ndarray]:
    """The grid and the codes (uint8, rows × n) of ``qtype`` bytes (rows × row bytes) of rows of ``n``."""
    sp = grid_spec(qtype)
    if n % sp.block:
        raise QuantizationError(f"{qtype} rows must be a multiple of {sp.block} weights, not {n}.")
    b = _blocks(data, sp, n)
    rows = b.shape[0] * sp.block // n if n else 0
    codes = (b[:, sp.lo_byte] >> sp.lo_shift.astype(np.uint8)) & np.uint8((1 << sp.lo_bits) - 1)
    if sp.hi_byte is not None:
        hi = (b[:, sp.hi_byte] >> sp.hi_shift.astype(np.uint8)) & np.uint8((1 << sp.hi_bits) - 1)
        codes = codes | (hi << np.uint8(sp.lo_bits))
    if sp.flip:
        codes = codes ^ np.uint8(sp.flip)
    scale, offset = _group_scales(b, qtype)
    g = n // sp.group
    grid = BlockGrid(
        qtype,
        np.ascontiguousarray(scale.reshape(rows, g), dtype=np.float32),
        None if offset is None else np.ascontiguousarray(offset.reshape(rows, g), dtype=np.float32),
        np.ascontiguousarray(b.reshape(rows, -1)),
    )
    return grid, np.ascontiguousarray(codes.reshape(rows, n))


def search(x: Any, qtype: str, imatrix: Any = None) -> tuple[BlockGrid, np.ndarray]:
    """llama.cpp's search on ``x`` (rows × n; numpy or torch): its grid and its codes."""
    from studio.core.quant.blocks import quantize

    data = quantize(x, qtype, imatrix)
    return unpack(data, qtype, int(x.shape[-1]))


def encode(grid: BlockGrid, codes: np.ndarray) -> np.ndarray:
    """The bytes (rows × row bytes) holding ``grid``'s scale fields and ``codes`` (rows × n, < n_levels)."""
    sp = grid.spec
    rows, n = grid.shape
    c = np.asarray(codes)
    if c.shape != (rows, n):
        raise QuantizationError(f"{grid.qtype} codes of shape {c.shape} do not fit a grid of {rows} × {n}.")
    c = c.astype(np.uint8).reshape(-1, sp.block)
    if int(c.max(initial=0)) >= sp.n_levels:
        raise QuantizationError(f"A {grid.qtype} code is {int(c.max())}; the type has {sp.n_levels} levels.")
    if sp.flip:
        c = c ^ np.uint8(sp.flip)
    out = grid.template.reshape(-1, sp.nbytes) & ~_mask(grid.qtype)
    lo = c & np.uint8((1 << sp.lo_bits) - 1)
    _scatter(out, lo, sp.lo_byte, sp.lo_shift)
    if sp.hi_byte is not None and sp.hi_shift is not None:
        _scatter(out, c >> np.uint8(sp.lo_bits), sp.hi_byte, sp.hi_shift)
    return out.reshape(rows, -1)


@cache
def _mask(qtype: str) -> np.ndarray:
    return grid_spec(qtype).code_mask()


def _scatter(out: np.ndarray, fields: np.ndarray, byte: np.ndarray, shift: np.ndarray) -> None:
    # positions sharing a shift sit in distinct bytes (one slot holds one field), so plain
    # fancy-indexed ORs per shift value cover every position without collisions
    for s in np.unique(shift):
        pos = np.nonzero(shift == s)[0]
        out[:, byte[pos]] |= fields[:, pos] << np.uint8(s)


def values(grid: BlockGrid, codes: np.ndarray) -> np.ndarray:
    """The float32 weights ``codes`` decode to under ``grid`` (what ``dequantize(encode(...))`` gives)."""
    rows, n = grid.shape
    g = grid.group
    lev = grid.levels[np.asarray(codes, dtype=np.intp)].reshape(rows, n // g, g)
    y = grid.scale[:, :, None] * lev
    if grid.offset is not None:
        y = y + grid.offset[:, :, None]
    return np.ascontiguousarray(y.reshape(rows, n), dtype=np.float32)


def nearest(grid: BlockGrid, x: np.ndarray) -> np.ndarray:
    """Per weight of ``x`` (rows × n), the code whose value under ``grid``'s fixed scales is nearest."""
    rows, n = grid.shape
    g = grid.group
    xs = np.asarray(x, dtype=np.float32).reshape(rows, n // g, g)
    sc = grid.scale[:, :, None]
    off = 0.0 if grid.offset is None else grid.offset[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(sc != 0, (xs - off) / np.where(sc != 0, sc, 1), 0.0)
    return nearest_level(grid.spec, t).reshape(rows, n)


def nearest_level(sp: GridSpec, t: np.ndarray) -> np.ndarray:
    """The code whose level is nearest to ``t`` (already divided by the scale), as uint8."""
    if sp.base is not None:
        return np.clip(np.rint(t) - sp.base, 0, sp.n_levels - 1).astype(np.uint8)
    mids = (sp.levels[1:] + sp.levels[:-1]) / 2
    return np.searchsorted(mids, t).astype(np.uint8)
