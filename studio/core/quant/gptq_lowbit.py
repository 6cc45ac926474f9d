"""Block grids of the scalar low-bit types (Q1_0, Q2_0, TQ1_0, TQ2_0, MXFP4), so GPTQ can round onto them.

The same interface as ``grid`` (``grid_spec``, ``search``, ``unpack``, ``encode``, ``values``,
``BlockGrid``) for the types ``grid`` does not take apart: each weight decodes as
``scale[block] · level[code]`` with one scale per block (fp16 for Q1_0/Q2_0/TQ*, the E8M0 exponent of
MXFP4). ``search`` is llama.cpp's own quantizer (``lowbit.quantize_rows``, byte-identical), so the
scales GPTQ keeps are ggml's; ``encode`` writes new codes under those scale fields, and
``encode(*search(x)) == quantize(x)`` byte for byte (tests/core/quant/test_gptq_lowgrids.py).

Codes index the increasing ``levels``: Q1_0's bit (−1, +1), Q2_0's and TQ2_0's 2-bit field q (value
q − 1: levels −1, 0, 1, 2; ggml's rounding never writes 2, GPTQ may, the decoder reads it), TQ1_0's
trit (−1, 0, 1; five or four per byte in base 3), MXFP4's value among the 15 distinct E2M1 values
(the stored nibble through a table: +0 is nibble 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.quant import grid as G
from studio.core.quant import lowbit

__all__ = ["LOWBIT_GRID_TYPES", "BlockGrid", "encode", "grid_spec", "search", "unpack", "values"]

LOWBIT_GRID_TYPES: tuple[str, ...] = lowbit.LOWBIT_TYPES

_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
_MX_LEVELS = np.unique(_MXFP4)  # 15 increasing values
_MX_NIB_OF_CODE = np.array([int(np.nonzero(_MXFP4 == v)[0][0]) for v in _MX_LEVELS], np.uint8)
_MX_CODE_OF_NIB = np.searchsorted(_MX_LEVELS, _MXFP4).astype(np.uint8)


@dataclass(frozen=True, eq=False)
class LowbitSpec:
    """One scalar low-bit type's block geometry and levels (the fields GPTQ's sweep reads)."""

    qtype: str
    block: int
    nbytes: int
    group: int
    levels: np.ndarray
    base: int | None  # levels[k] == base + k, or None for a table (Q1_0, MXFP4)
    scale_at: int  # byte offset of the block's scale field

    @property
    def n_levels(self) -> int:
        """Number of codes."""
        return int(self.levels.shape[0])

    def code_mask(self) -> np.ndarray:
        """(nbytes,) uint8: the bits of a block that hold codes (every byte but the scale's)."""
        m = np.full(self.nbytes, 0xFF, np.uint8)
        width = 1 if self.qtype == "MXFP4" else 2
        m[self.scale_at : self.scale_at + width] = 0
        return m


@cache
def grid_spec(qtype: str) -> LowbitSpec:
    """The layout of ``qtype`` (one of ``LOWBIT_GRID_TYPES``)."""
    if qtype not in LOWBIT_GRID_TYPES:
        raise QuantizationError(f"{qtype} is not one of {', '.join(LOWBIT_GRID_TYPES)}.")
    block, nbytes = lowbit.GEOMETRY[qtype]
    if qtype == "Q1_0":
        lev, base, at = np.array([-1, 1], np.float32), None, 0
    elif qtype == "MXFP4":
        lev, base, at = _MX_LEVELS.astype(np.float32), None, 0
    elif qtype == "TQ1_0":
        lev, base, at = np.array([-1, 0, 1], np.float32), -1, 52
    else:
        lev, base, at = np.array([-1, 0, 1, 2], np.float32), -1, 64 if qtype == "TQ2_0" else 0
    return LowbitSpec(qtype, block, nbytes, block, lev, base, at)


@dataclass(frozen=True, eq=False)
class BlockGrid(G.BlockGrid):
    """``grid.BlockGrid`` for one tensor of a low-bit type (``offset`` is None): its layout is this
    module's ``grid_spec``; the properties GPTQ's sweep reads (levels, group, shape) are the base's."""

    @property
    def spec(self) -> LowbitSpec:  # type: ignore[override]
        """The type's layout."""
        return grid_spec(self.qtype)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    e = e.astype(np.int64)
    bits = np.where(e < 2, np.left_shift(0x00200000, np.minimum(e, 1)), (e - 1) << 23)
    return bits.astype(np.uint32).view(np.float32)


def _scales(b: np.ndarray, sp: LowbitSpec) -> np.ndarray:
    if sp.qtype == "MXFP4":
        return _e8m0_half(b[:, 0])
    return np.ascontiguousarray(b[:, sp.scale_at : sp.scale_at + 2]).view("<f2").astype(np.float32)[:, 0]


def _tq1_layout() -> tuple[np.ndarray, np.ndarray]:
    """Per TQ1_0 block position: (byte, base-3 digit) holding its trit; digit 0 is the most significant."""
    byte = np.empty(256, np.int64)
    digit = np.empty(256, np.int64)
    p = np.arange(160)
    byte[:160], digit[:160] = p % 32, p // 32
    p = np.arange(80)
    byte[160:240], digit[160:240] = 32 + p % 16, p // 16
    p = np.arange(16)
    byte[240:], digit[240:] = 48 + p % 4, p // 4
    return byte, digit


_TQ1_BYTE, _TQ1_DIGIT = _tq1_layout()


def _codes_of(b: np.ndarray, sp: LowbitSpec) -> np.ndarray:
    """(blocks, block) codes from (blocks, nbytes) bytes."""
    j = np.arange(sp.block)
    q = sp.qtype
    if q == "Q1_0":
        return (b[:, 2 + j // 8] >> (j % 8).astype(np.uint8)) & 1
    if q == "Q2_0":
        return (b[:, 2 + j // 4] >> (2 * (j % 4)).astype(np.uint8)) & 3
    if q == "TQ2_0":
        h, k, m = j // 128, (j // 32) % 4, j % 32
        return (b[:, 32 * h + m] >> (2 * k).astype(np.uint8)) & 3
    if q == "MXFP4":
        nib = np.where(j < 16, b[:, 1 + j % 16] & 15, b[:, 1 + j % 16] >> 4)
        return _MX_CODE_OF_NIB[nib]
    # TQ1_0: the dequantizer's digit extraction, ((byte · 3^k mod 256) · 3) >> 8
    pw = np.array([1, 3, 9, 27, 81], np.int64)[_TQ1_DIGIT]
    v = (b[:, _TQ1_BYTE].astype(np.int64) * pw) & 0xFF
    return ((v * 3) >> 8).astype(np.uint8)


def unpack(data: np.ndarray, qtype: str, n: int) -> tuple[BlockGrid, np.ndarray]:
    """The grid and codes (uint8, rows × n) of ``qtype`` bytes (rows × row bytes) of rows of ``n``."""
    sp = grid_spec(qtype)
    d = np.ascontiguousarray(np.asarray(data, dtype=np.uint8))
    if n % sp.block or d.ndim != 2 or d.shape[1] != lowbit.row_bytes(qtype, n):
        raise QuantizationError(f"{qtype} data of shape {d.shape} does not hold rows of {n} weights.")
    rows = d.shape[0]
    b = d.reshape(-1, sp.nbytes)
    scale = _scales(b, sp).reshape(rows, n // sp.block)
    codes = _codes_of(b, sp).astype(np.uint8).reshape(rows, n)
    return BlockGrid(qtype, np.ascontiguousarray(scale), None, d), np.ascontiguousarray(codes)


def search(x: Any, qtype: str, imatrix: Any = None) -> tuple[BlockGrid, np.ndarray]:
    """llama.cpp's quantizer on ``x`` (rows × n; numpy or torch): its grid and codes (imatrix unused, as in ggml)."""
    a = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    data = lowbit.quantize_rows(np.asarray(a, np.float32), qtype, imatrix)
    return unpack(data, qtype, int(a.shape[-1]))


def encode(grid: BlockGrid, codes: np.ndarray) -> np.ndarray:
    """The bytes holding ``grid``'s scale fields and ``codes`` (rows × n, each < the type's level count)."""
    sp = grid.spec
    rows, n = grid.shape
    c = np.asarray(codes)
    if c.shape != (rows, n):
        raise QuantizationError(f"{grid.qtype} codes of shape {c.shape} do not fit a grid of {rows} × {n}.")
    c = c.astype(np.int64).reshape(-1, sp.block)
    if int(c.max(initial=0)) >= sp.n_levels:
        raise QuantizationError(f"A {grid.qtype} code is {int(c.max())}; the type has {sp.n_levels} levels.")
    out = grid.template.reshape(-1, sp.nbytes) & ~sp.code_mask()
    nblk = c.shape[0]
    q = sp.qtype
    if q in ("Q1_0", "Q2_0", "TQ2_0"):
        j = np.arange(sp.block)
        if q == "Q1_0":
            byte, shift = 2 + j // 8, j % 8
        elif q == "Q2_0":
            byte, shift = 2 + j // 4, 2 * (j % 4)
        else:
            byte, shift = 32 * (j // 128) + j % 32, 2 * ((j // 32) % 4)
        acc = np.zeros((nblk, sp.nbytes), np.int64)
        for s in np.unique(shift):
            pos = np.nonzero(shift == s)[0]
            acc[:, byte[pos]] |= c[:, pos] << s
        out |= acc.astype(np.uint8)
    elif q == "MXFP4":
        nib = _MX_NIB_OF_CODE[c].astype(np.uint8)
        out[:, 1:17] |= nib[:, :16] | (nib[:, 16:] << 4)
    else:  # TQ1_0: base-3 digits, most significant first, then ggml's ⌈q · 256 / 243⌉
        acc = np.zeros((nblk, 52), np.int64)
        pw = np.array([81, 27, 9, 3, 1], np.int64)[_TQ1_DIGIT]
        # (the last 4 bytes hold four trits times 3: the same weights 81, 27, 9, 3)
        np.add.at(acc, (slice(None), _TQ1_BYTE), c * pw)
        out[:, :52] = ((acc * 256 + 242) // 243).astype(np.uint8)
    return out.reshape(rows, -1)


def values(grid: BlockGrid, codes: np.ndarray) -> np.ndarray:
    """The float32 weights ``codes`` decode to under ``grid`` (what ``dequantize(encode(...))`` gives)."""
    rows, n = grid.shape
    g = grid.group
    lev = grid.levels[np.asarray(codes, dtype=np.intp)].reshape(rows, n // g, g)
    return np.ascontiguousarray((grid.scale[:, :, None] * lev).reshape(rows, n), dtype=np.float32)
