"""The lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), byte-identical to llama.cpp.

Each 256-weight super-block is cut into groups of 4 or 8 weights, each group quantized to a point of
a fixed grid (``iquants_grids``) under a shared sub-block scale. The kernels follow ggml-quants.c's
``quantize_row_iq*_impl`` operation by operation in float32 (same sums in the same order, C's
``nearest_int``, ggml's fp16 rounding, the same strict comparisons): the sign trick (signs stored apart,
an odd count made even by flipping the cheapest weight for the 7-bit sign types), the scale search over
a fan of trial scales, the neighbour search for a rounded point that is not on the grid, and the
fudge factors on the super-block scale. The neighbour lists and the point-to-index map are the ones
``iq2xs_init_impl``/``iq3xs_init_impl`` build (same order), computed once per process.

Where ggml aborts the whole process (a scale that is NaN, a point with no finite-distance neighbour:
values whose squares overflow float32), the studio refuses the tensor instead.
"""

from __future__ import annotations

import functools

import gguf
import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jit import njit
from studio.core.quant import iquants_grids
from studio.core.quant.kquants import _positive_search
from studio.core.quant.numba_ops import JIT, fp16_bits, nearest_int, put_half
from studio.core.quant.types import QK_K, row_bytes

IQ_TYPES: tuple[str, ...] = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
NEEDS_IMATRIX: frozenset[str] = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S"})
"""The types ggml refuses to quantize without an importance matrix (ggml_quantize_requires_imatrix)."""

_KIND = {t: i for i, t in enumerate(IQ_TYPES)}
_FLT_MAX = np.float32(3.4028234663852886e38)

# grid table, coordinates per point, bits per coordinate, kmap size, neighbours wanted (ggml's nwant)
_GRIDS = {
    "IQ2_XXS": ("KGRID_2BIT_256", 8, 2, 43692, 2),
    "IQ2_XS": ("KGRID_2BIT_512", 8, 2, 43692, 2),
    "IQ2_S": ("KGRID_2BIT_1024", 8, 2, 43692, 1),
    "IQ1_S": ("KGRID_1BIT_2048", 8, 2, 43692, 3),
    "IQ1_M": ("KGRID_1BIT_2048", 8, 2, 43692, 3),
    "IQ3_XXS": ("KGRID_256", 4, 3, 4096, 2),
    "IQ3_S": ("KGRID_512", 4, 3, 4096, 3),
}


# ------------------------------------------------------------------------------ grid tables


@njit(**JIT)
def _count_neighbours(grid, kmap, dim, bits, nwant, counts):
    """Pass 1 of ggml's neighbour build: how many grid points each off-grid index keeps."""
    g_n = grid.shape[0]
    d2 = np.empty(g_n, np.int64)
    mask = (1 << bits) - 1
    for i in range(kmap.shape[0]):
        counts[i] = 0
        if kmap[i] >= 0:
            continue
        for j in range(g_n):
            s = 0
            for k in range(dim):
                diff = np.int64(grid[j, k]) - (2 * ((i >> (bits * k)) & mask) + 1)
                s += diff * diff
            d2[j] = s
        # the nwant smallest distinct distances; every point at one of them is kept (ties included)
        prev = -1
        n = 0
        for _ in range(nwant):
            m = np.int64(1) << 40
            for j in range(g_n):
                if prev < d2[j] < m:
                    m = d2[j]
            if m == np.int64(1) << 40:
                break
            for j in range(g_n):
                if d2[j] == m:
                    n += 1
            prev = m
        counts[i] = n


@njit(**JIT)
def _fill_neighbours(grid, kmap, dim, bits, nwant, offsets, neigh):
    """Pass 2: each off-grid index's list, sorted by (distance, grid index) as ggml's qsort leaves it."""
    g_n = grid.shape[0]
    d2 = np.empty(g_n, np.int64)
    mask = (1 << bits) - 1
    for i in range(kmap.shape[0]):
        if kmap[i] >= 0:
            continue
        for j in range(g_n):
            s = 0
            for k in range(dim):
                diff = np.int64(grid[j, k]) - (2 * ((i >> (bits * k)) & mask) + 1)
                s += diff * diff
            d2[j] = s
        at = offsets[i]
        kmap[i] = -(at + 1)
        c = at + 1
        prev = -1
        for _ in range(nwant):
            m = np.int64(1) << 40
            for j in range(g_n):
                if prev < d2[j] < m:
                    m = d2[j]
            if m == np.int64(1) << 40:
                break
            for j in range(g_n):
                if d2[j] == m:
                    neigh[c] = j
                    c += 1
            prev = m
        neigh[at] = c - at - 1


@functools.lru_cache(maxsize=8)
def grid_tables(qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(grid, kmap, neighbours)`` of a lattice type, as ggml's init builds them.

    ``grid`` is int8 (points, coordinates) of odd levels; ``kmap`` maps a packed point to its grid
    index, or to ``-(offset + 1)`` of its neighbour list in ``neighbours`` (count first, then indices).
    """
    name, dim, bits, kmap_size, nwant = _GRIDS[qtype]
    packed = np.frombuffer(bytes.fromhex("".join(getattr(iquants_grids, name))), dtype="<u2").astype(np.int64)
    fields = (packed[:, None] >> (bits * np.arange(dim))) & ((1 << bits) - 1)
    grid = np.ascontiguousarray(2 * fields + 1, dtype=np.int8)
    kmap = np.full(kmap_size, -1, np.int32)
    kmap[packed] = np.arange(len(packed), dtype=np.int32)
    counts = np.zeros(kmap_size, np.int64)
    _count_neighbours(grid, kmap, dim, bits, nwant, counts)
    off_grid = kmap < 0
    sizes = np.where(off_grid, counts + 1, 0)
    offsets = np.where(off_grid, np.cumsum(sizes) - sizes, -1).astype(np.int64)
    neigh = np.zeros(int(sizes.sum()), np.uint16)
    _fill_neighbours(grid, kmap, dim, bits, nwant, offsets, neigh)
    for a in (grid, kmap, neigh):
        a.setflags(write=False)
    return grid, kmap, neigh


# ------------------------------------------------------------------------------ shared pieces


@njit(inline="always", **JIT)
def _best_neighbour(neigh, start, grid, gridf, dim, xval, waux, off, scale, L):
    """iq2/iq3_find_best_neighbour: the listed point nearest under the weights; -1 when none is finite."""
    nn = np.int64(neigh[start])
    best = _FLT_MAX
    gi = -1
    for j in range(1, nn + 1):
        g = np.int64(neigh[start + j])
        d2 = np.float32(0.0)
        for i in range(dim):
            diff = scale * gridf[g, i] - xval[off + i]
            d2 += waux[off + i] * diff * diff
        if d2 < best:
            best = d2
            gi = g
    if gi >= 0:
        for i in range(dim):
            L[off + i] = (grid[gi, i] - 1) // 2
    return gi


@njit(inline="always", **JIT)
def _put_u32(row, pos, v):
    row[pos] = v & 0xFF
    row[pos + 1] = (v >> 8) & 0xFF
    row[pos + 2] = (v >> 16) & 0xFF
    row[pos + 3] = (v >> 24) & 0xFF


@njit(inline="always", **JIT)
def _or_u32(row, pos, v):
    row[pos] |= v & 0xFF
    row[pos + 1] |= (v >> 8) & 0xFF
    row[pos + 2] |= (v >> 16) & 0xFF
    row[pos + 3] |= (v >> 24) & 0xFF


# ------------------------------------------------------------------------------ IQ2 / IQ3 kernel


@njit(**JIT)
def _lattice_rows(x, qw, has_qw, kind, grid, kmap, neigh, out):
    """quantize_row_iq2_xxs/iq2_xs/iq2_s/iq3_xxs/iq3_s_impl over all rows; returns 1 where ggml aborts."""
    rows, n = x.shape
    nbl = n // QK_K
    if kind == 0:  # IQ2_XXS
        dim, bits, bsz, kmaxq, parity, is_lo, is_step, sig2x, eps, fudge, bbytes = (
            8,
            2,
            32,
            3,
            True,
            -6,
            np.float32(0.1),
            False,
            np.float32(1e-15),
            np.float32(1.0),
            66,
        )
    elif kind == 1:  # IQ2_XS
        dim, bits, bsz, kmaxq, parity, is_lo, is_step, sig2x, eps, fudge, bbytes = (
            8,
            2,
            16,
            3,
            True,
            -9,
            np.float32(0.1),
            False,
            np.float32(1e-15),
            np.float32(1.0),
            74,
        )
    elif kind == 2:  # IQ2_S
        dim, bits, bsz, kmaxq, parity, is_lo, is_step, sig2x, eps, fudge, bbytes = (
            8,
            2,
            16,
            3,
            False,
            -9,
            np.float32(0.1),
            True,
            np.float32(1e-8),
            np.float32(0.9875),
            82,
        )
    elif kind == 3:  # IQ3_XXS
        dim, bits, bsz, kmaxq, parity, is_lo, is_step, sig2x, eps, fudge, bbytes = (
            4,
            3,
            32,
            8,
            True,
            -15,
            np.float32(0.2),
            True,
            np.float32(1e-8),
            np.float32(1.0125),
            98,
        )
    else:  # IQ3_S
        dim, bits, bsz, kmaxq, parity, is_lo, is_step, sig2x, eps, fudge, bbytes = (
            4,
            3,
            32,
            8,
            False,
            -9,
            np.float32(0.2),
            True,
            np.float32(0.0),
            np.float32(1.033),
            110,
        )
    ng = bsz // dim  # grid points per sub-block
    gridf = grid.astype(np.float32)  # the odd levels as floats, for the neighbour distances
    nsub = QK_K // bsz
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    Lqp = np.zeros(32, np.int64)
    on_grid = np.zeros(8, np.bool_)
    on_grid_aux = np.zeros(8, np.bool_)
    signs = np.zeros(8, np.int64)
    gidx = np.zeros(8, np.int64)
    scales = np.zeros(16, np.float32)
    fq = np.float32(2 * kmaxq - 1)
    for r in range(rows):
        row = out[r]
        for ibl in range(nbl):
            xo = ibl * QK_K
            ob = ibl * bbytes
            for k in range(bbytes):
                row[ob + k] = 0
            max_scale = np.float32(0.0)
            done = 0
            sumx2 = np.float32(0.0)
            for i in range(QK_K):
                sumx2 += x[r, xo + i] * x[r, xo + i]
            if sig2x:
                sigma2 = np.float32(2.0) * sumx2 / np.float32(QK_K)
            else:
                sigma2 = sumx2 / np.float32(QK_K)
            for ib in range(nsub):
                xb = xo + bsz * ib
                if has_qw:
                    for i in range(bsz):
                        v = x[r, xb + i]
                        weight[i] = qw[xb + i] * np.sqrt(sigma2 + v * v)
                elif kind == 2:
                    for i in range(bsz):
                        v = x[r, xb + i]
                        weight[i] = np.float32(0.25) * sigma2 + v * v
                else:
                    for i in range(bsz):
                        v = x[r, xb + i]
                        weight[i] = v * v
                for i in range(bsz):
                    waux[i] = np.sqrt(weight[i])
                for k in range(bsz // 8):
                    nflip = 0
                    s = 0
                    for i in range(8):
                        v = x[r, xb + 8 * k + i]
                        if v >= 0:
                            xval[8 * k + i] = v
                        else:
                            xval[8 * k + i] = -v
                            nflip += 1
                            s |= 1 << i
                    if parity and nflip % 2:
                        imin = 0
                        v = x[r, xb + 8 * k]
                        mn = weight[8 * k] * v * v
                        for i in range(1, 8):
                            v = x[r, xb + 8 * k + i]
                            ax = weight[8 * k + i] * v * v
                            if ax < mn:
                                mn = ax
                                imin = i
                        xval[8 * k + imin] = -xval[8 * k + imin]
                        s ^= 1 << imin
                    signs[k] = (s & 127) if parity else s
                mx = xval[0]
                for i in range(1, bsz):
                    mx = mx if mx > xval[i] else xval[i]
                for i in range(bsz):
                    L[i] = 0
                if (kind == 4 and mx == 0) or (kind != 4 and mx < eps):
                    scales[ib] = np.float32(0.0)
                    continue
                best = np.float32(0.0)
                if kind == 0:
                    scale = _positive_search(32, kmaxq + 1, xval, Lqp, weight)
                    eff_max = scale * np.float32(kmaxq)
                    if eff_max <= 0:
                        scales[ib] = np.float32(0.0)
                        continue
                    denom = eff_max
                else:
                    scale = mx / fq
                    denom = mx
                for k in range(ng):
                    on_grid[k] = kind != 4
                for js in range(is_lo, -is_lo + 1):
                    idv = (fq + np.float32(js) * is_step) / denom
                    this_scale = np.float32(1.0) / idv
                    for k in range(ng):
                        u = 0
                        for i in range(dim):
                            li = nearest_int(np.float32(0.5) * (idv * xval[dim * k + i] - np.float32(1.0)))
                            li = max(0, min(kmaxq - 1, li))
                            Laux[dim * k + i] = li
                            u |= li << (bits * i)
                        gi = kmap[u]
                        on_grid_aux[k] = True
                        if gi < 0:
                            on_grid_aux[k] = False
                            if (
                                _best_neighbour(
                                    neigh, -gi - 1, grid, gridf, dim, xval, waux, dim * k, this_scale, Laux
                                )
                                < 0
                            ):
                                return 1
                    sumqx = np.float32(0.0)
                    sumq2 = np.float32(0.0)
                    for i in range(bsz):
                        w = weight[i]
                        q = np.float32(2 * Laux[i] + 1)
                        sumqx += w * xval[i] * q
                        sumq2 += w * q * q
                    if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                        scale = sumqx / sumq2
                        best = scale * sumqx
                        for i in range(bsz):
                            L[i] = Laux[i]
                        for k in range(ng):
                            on_grid[k] = on_grid_aux[k]
                n_off = 0
                for k in range(ng):
                    if not on_grid[k]:
                        n_off += 1
                if scale > 0 and (kind == 0 or n_off > 0):
                    idv = np.float32(1.0) / scale
                    for k in range(ng):
                        if (kind == 1 or kind == 2 or kind == 3) and on_grid[k]:
                            continue
                        u = 0
                        for i in range(dim):
                            li = nearest_int(np.float32(0.5) * (idv * xval[dim * k + i] - np.float32(1.0)))
                            li = max(0, min(kmaxq - 1, li))
                            L[dim * k + i] = li
                            u |= li << (bits * i)
                        gi = kmap[u]
                        if gi < 0:
                            if (
                                _best_neighbour(
                                    neigh, -gi - 1, grid, gridf, dim, xval, waux, dim * k, scale, L
                                )
                                < 0
                            ):
                                return 1
                    sumqx = np.float32(0.0)
                    sumq2 = np.float32(0.0)
                    for i in range(bsz):
                        w = weight[i]
                        q = np.float32(2 * L[i] + 1)
                        sumqx += w * xval[i] * q
                        sumq2 += w * q * q
                    if sumq2 > 0:
                        scale = sumqx / sumq2
                if scale < 0:
                    scale = -scale
                    if kind == 0 or kind == 3:  # ggml flips the first four sign groups only
                        for k in range(4):
                            signs[k] = (~signs[k]) & 127
                    else:
                        for k in range(bsz // 8):
                            signs[k] = ((~signs[k]) & 127) if parity else ((~signs[k]) & 0xFF)
                for k in range(ng):
                    u = 0
                    for i in range(dim):
                        u |= L[dim * k + i] << (bits * i)
                    if u >= kmap.shape[0] or kmap[u] < 0:
                        return 1
                    gidx[k] = kmap[u]
                if not (scale >= 0):
                    return 1
                # pack this sub-block
                if kind == 0:
                    q0 = 0
                    q1 = 0
                    for k in range(4):
                        q0 |= gidx[k] << (8 * k)
                        q1 |= signs[k] << (7 * k)
                    _put_u32(row, ob + 2 + 8 * ib, q0)
                    _put_u32(row, ob + 6 + 8 * ib, q1)
                elif kind == 1:
                    for k in range(2):
                        v = gidx[k] | (signs[k] << 9)
                        row[ob + 2 + 4 * ib + 2 * k] = v & 0xFF
                        row[ob + 3 + 4 * ib + 2 * k] = (v >> 8) & 0xFF
                elif kind == 2:
                    for k in range(2):
                        i8 = 2 * ib + k
                        row[ob + 2 + i8] = gidx[k] & 255
                        row[ob + 66 + i8 // 4] |= ((gidx[k] >> 8) << (2 * (i8 % 4))) & 0xFF
                        row[ob + 34 + i8] = signs[k]
                elif kind == 3:
                    for k in range(8):
                        row[ob + 2 + 8 * ib + k] = gidx[k] & 0xFF
                    v = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
                    _put_u32(row, ob + 66 + 4 * ib, v)
                else:
                    # ggml advances its qs/signs pointers only past the sub-blocks it encodes: after a
                    # zero sub-block the later ones land one slot early (the qh bits do not move)
                    for k in range(8):
                        row[ob + 2 + 8 * done + k] = gidx[k] & 255
                        row[ob + 66 + ib] |= ((gidx[k] >> 8) << k) & 0xFF
                    for k in range(4):
                        row[ob + 74 + 4 * done + k] = signs[k]
                    done += 1
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            if max_scale == 0:
                if kind == 0 or kind == 1 or kind == 3:
                    for k in range(bbytes):
                        row[ob + k] = 0
                continue
            d = max_scale / np.float32(31.0)
            put_half(row, ob, d * fudge if kind >= 2 else d)
            idv = np.float32(1.0) / d
            for ib in range(nsub):
                li = nearest_int(np.float32(0.5) * (idv * scales[ib] - np.float32(1.0)))
                li = max(0, min(15, li))
                if kind == 0:
                    _or_u32(row, ob + 6 + 8 * ib, li << 28)
                elif kind == 1:
                    row[ob + 66 + ib // 2] |= li << (4 * (ib % 2))
                elif kind == 2:
                    row[ob + 74 + ib // 2] |= li << (4 * (ib % 2))
                elif kind == 3:
                    _or_u32(row, ob + 66 + 4 * ib, li << 28)
                else:
                    row[ob + 106 + ib // 2] |= li << (4 * (ib % 2))
    return 0


# ------------------------------------------------------------------------------ IQ1_S / IQ1_M kernel


@njit(inline="always", **JIT)
def _best_neighbour_iq1(neigh, start, lv, x, r, xo, weight, wo, scale, xx, L, lo):
    """iq1_find_best_neighbour2 (the listed neighbours only; -1 when none has a finite distance)."""
    nn = np.int64(neigh[start])
    best = _FLT_MAX
    gi = -1
    for j in range(1, nn + 1):
        g = np.int64(neigh[start + j])
        d2 = np.float32(0.0)
        for i in range(8):
            q = xx[lv[g, i]]
            w = weight[wo + i]
            diff = scale * q - x[r, xo + i]
            d2 += w * diff * diff
        if d2 < best:
            best = d2
            gi = g
    if gi >= 0:
        for i in range(8):
            L[lo + i] = lv[gi, i]
    return gi


@njit(**JIT)
def _iq1_rows(x, qw, has_qw, is_m, grid, kmap, neigh, out):
    """quantize_row_iq1_s_impl / quantize_row_iq1_m_impl over all rows; returns 1 where ggml aborts."""
    rows, n = x.shape
    nbl = n // QK_K
    bsz = 16 if is_m else 32
    nsub = QK_K // bsz
    bbytes = 56 if is_m else 50
    delta = np.float32(0.125)
    x_p = np.empty(3, np.float32)
    x_m = np.empty(3, np.float32)
    x_p[0] = np.float32(-1.0) + delta
    x_p[1] = delta
    x_p[2] = np.float32(1.0) + delta
    x_m[0] = np.float32(-1.0) - delta
    x_m[1] = -delta
    x_m[2] = np.float32(1.0) - delta
    masks = (0x00, 0x80, 0x08, 0x88)
    weight = np.empty(32, np.float32)
    vals = np.empty(32, np.float32)
    idx = np.empty(32, np.int64)
    sumx = np.empty(33, np.float32)
    sumw = np.empty(33, np.float32)
    px = np.empty((2, 17), np.float32)
    pw = np.empty((2, 17), np.float32)
    L = np.zeros(32, np.int64)
    index = np.zeros(4, np.int64)
    scales = np.zeros(16, np.float32)
    shifts = np.zeros(16, np.int64)
    eps = np.float32(1e-7) if is_m else np.float32(1e-12)
    cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1]
    cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2]
    cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1]
    cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2]
    p2 = x_p[2]
    m2 = x_m[2]
    lv = np.empty(grid.shape, np.int64)  # each coordinate's level 0..2, ggml's (pg[i] - 1)/2
    for g in range(grid.shape[0]):
        for i in range(8):
            lv[g, i] = (np.int64(grid[g, i]) - 1) // 2
    xp0, xp1, xp2 = x_p[0], x_p[1], x_p[2]
    xm0, xm1, xm2 = x_m[0], x_m[1], x_m[2]
    for r in range(rows):
        row = out[r]
        for ibl in range(nbl):
            xo = ibl * QK_K
            ob = ibl * bbytes
            for k in range(bbytes):
                row[ob + k] = 0
            max_scale = np.float32(0.0)
            sumx2 = np.float32(0.0)
            for i in range(QK_K):
                sumx2 += x[r, xo + i] * x[r, xo + i]
            sigma2 = np.float32(2.0) * sumx2 / np.float32(QK_K)
            for ib in range(nsub):
                xb = xo + bsz * ib
                for i in range(bsz):
                    v = x[r, xb + i]
                    weight[i] = qw[xb + i] * np.sqrt(sigma2 + v * v) if has_qw else v * v
                mx = abs(x[r, xb])
                for i in range(1, bsz):
                    a = abs(x[r, xb + i])
                    mx = mx if mx > a else a
                if mx < eps:
                    scales[ib] = np.float32(0.0)
                    shifts[ib] = 0 if is_m else 1
                    continue
                # stable ascending sort of the values (glibc's qsort is a merge sort here)
                for j in range(bsz):
                    v = x[r, xb + j]
                    p = j
                    while p > 0 and vals[p - 1] > v:
                        vals[p] = vals[p - 1]
                        idx[p] = idx[p - 1]
                        p -= 1
                    vals[p] = v
                    idx[p] = j
                best_score = -_FLT_MAX
                scale = mx
                besti1 = -1
                besti2 = -1
                best_k = 0 if not is_m else -1
                if not is_m:
                    sumx[0] = np.float32(0.0)
                    sumw[0] = np.float32(0.0)
                    for j in range(bsz):
                        i = idx[j]
                        sumx[j + 1] = sumx[j] + weight[i] * x[r, xb + i]
                        sumw[j + 1] = sumw[j] + weight[i]
                    for i1 in range(bsz + 1):
                        for i2 in range(i1, bsz + 1):
                            a = sumx[i1] - sumx[0]
                            b = sumx[i2] - sumx[i1]
                            c = sumx[bsz] - sumx[i2]
                            wa = sumw[i1] - sumw[0]
                            wb = sumw[i2] - sumw[i1]
                            wc = sumw[bsz] - sumw[i2]
                            sumqx = a * xp0 + b * xp1 + c * xp2
                            sumq2 = wa * xp0 * xp0 + wb * xp1 * xp1 + wc * xp2 * xp2
                            if sumq2 > 0 and sumqx * sumqx > best_score * sumq2:
                                scale = sumqx / sumq2
                                best_score = scale * sumqx
                                besti1 = i1
                                besti2 = i2
                                best_k = 1
                            sumqx = a * xm0 + b * xm1 + c * xm2
                            sumq2 = wa * xm0 * xm0 + wb * xm1 * xm1 + wc * xm2 * xm2
                            if sumq2 > 0 and sumqx * sumqx > best_score * sumq2:
                                scale = sumqx / sumq2
                                best_score = scale * sumqx
                                besti1 = i1
                                besti2 = i2
                                best_k = -1
                    if besti1 < 0 or besti2 < 0 or best_k == 0:
                        scales[ib] = np.float32(0.0)
                        shifts[ib] = 1
                        continue
                else:
                    px[0, 0] = np.float32(0.0)
                    px[1, 0] = np.float32(0.0)
                    pw[0, 0] = np.float32(0.0)
                    pw[1, 0] = np.float32(0.0)
                    for j in range(bsz):
                        i = idx[j]
                        h = 0 if i < bsz // 2 else 1
                        px[h, j + 1] = px[h, j] + weight[i] * x[r, xb + i]
                        px[1 - h, j + 1] = px[1 - h, j]
                        pw[h, j + 1] = pw[h, j] + weight[i]
                        pw[1 - h, j + 1] = pw[1 - h, j]
                    tx0 = px[0, bsz]
                    tx1 = px[1, bsz]
                    tw0 = pw[0, bsz]
                    tw1 = pw[1, bsz]
                    for i1 in range(bsz + 1):
                        for i2 in range(i1, bsz + 1):
                            sx0 = px[0, i1] + px[0, i2]
                            sx1 = px[1, i1] + px[1, i2]
                            qxp0 = tx0 * p2 - sx0
                            qxm0 = tx0 * m2 - sx0
                            qxp1 = tx1 * p2 - sx1
                            qxm1 = tx1 * m2 - sx1
                            q2p0 = tw0 * p2 * p2 + pw[0, i1] * cp1 + pw[0, i2] * cp2
                            q2m0 = tw0 * m2 * m2 + pw[0, i1] * cm1 + pw[0, i2] * cm2
                            q2p1 = tw1 * p2 * p2 + pw[1, i1] * cp1 + pw[1, i2] * cp2
                            q2m1 = tw1 * m2 * m2 + pw[1, i1] * cm1 + pw[1, i2] * cm2
                            # the four sign choices in ggml's order, as scalars (kept in registers)
                            for k in range(4):
                                if k == 0:
                                    sx = qxp0 + qxp1
                                    s2 = q2p0 + q2p1
                                elif k == 1:
                                    sx = qxp0 + qxm1
                                    s2 = q2p0 + q2m1
                                elif k == 2:
                                    sx = qxm0 + qxp1
                                    s2 = q2m0 + q2p1
                                else:
                                    sx = qxm0 + qxm1
                                    s2 = q2m0 + q2m1
                                if s2 > 0 and sx * sx > best_score * s2:
                                    scale = sx / s2
                                    best_score = scale * sx
                                    besti1 = i1
                                    besti2 = i2
                                    best_k = k
                    if besti1 < 0 or besti2 < 0 or best_k < 0:
                        scales[ib] = np.float32(0.0)
                        shifts[ib] = 0
                        continue
                for j in range(besti1):
                    L[idx[j]] = 0
                for j in range(besti1, besti2):
                    L[idx[j]] = 1
                for j in range(besti2, bsz):
                    L[idx[j]] = 2
                if scale < 0:
                    for j in range(bsz):
                        L[j] = 2 - L[j]
                    scale = -scale
                    best_k = 3 - best_k if is_m else -best_k
                all_on_grid = True
                for k in range(bsz // 8):
                    if is_m:
                        use_p = (best_k < 2) if k == 0 else (best_k % 2 == 0)
                    else:
                        use_p = best_k == 1
                    xx = x_p if use_p else x_m
                    u = 0
                    for j in range(8):
                        u |= L[8 * k + j] << (2 * j)
                    gi = kmap[u]
                    if gi < 0:
                        all_on_grid = False
                        gi = _best_neighbour_iq1(
                            neigh, -gi - 1, lv, x, r, xb + 8 * k, weight, 8 * k, scale, xx, L, 8 * k
                        )
                        if gi < 0:
                            return 1
                    index[k] = gi
                if not all_on_grid:
                    sumqx = np.float32(0.0)
                    sumq2 = np.float32(0.0)
                    for k in range(bsz // 8):
                        if is_m:
                            use_p = (best_k < 2) if k == 0 else (best_k % 2 == 0)
                        else:
                            use_p = best_k == 1
                        xx = x_p if use_p else x_m
                        for j in range(8):
                            w = weight[8 * k + j]
                            q = xx[lv[index[k], j]]
                            sumqx += w * q * x[r, xb + 8 * k + j]
                            sumq2 += w * q * q
                    if sumqx > 0 and sumq2 > 0:
                        scale = sumqx / sumq2
                if is_m:
                    row[ob + 2 * ib] = index[0] & 255
                    row[ob + 2 * ib + 1] = index[1] & 255
                    row[ob + 32 + ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) & 0xFF
                else:
                    h = 0
                    for k in range(4):
                        row[ob + 2 + 4 * ib + k] = index[k] & 255
                        h |= (index[k] >> 8) << (3 * k)
                    row[ob + 34 + 2 * ib] = h & 0xFF
                    row[ob + 35 + 2 * ib] = (h >> 8) & 0xFF
                if not (scale >= 0):
                    return 1
                scales[ib] = scale
                shifts[ib] = best_k
                max_scale = max_scale if max_scale > scale else scale
            if max_scale == 0:
                continue
            d = max_scale / np.float32(15.0)
            idv = np.float32(1.0) / d
            if not is_m:
                put_half(row, ob, d * np.float32(1.125))
                for ib in range(nsub):
                    li = nearest_int(np.float32(0.5) * (idv * scales[ib] - np.float32(1.0)))
                    li = max(0, min(7, li))
                    if shifts[ib] == -1:
                        li |= 8
                    row[ob + 35 + 2 * ib] |= (li << 4) & 0xFF
                continue
            sc = np.zeros(4, np.int64)
            sqxf = np.float32(0.0)
            sq2f = np.float32(0.0)
            for ib in range(nsub):
                li = nearest_int(np.float32(0.5) * (idv * scales[ib] - np.float32(1.0)))
                li = max(0, min(7, li))
                sc[ib // 4] |= li << (3 * (ib % 4))
                row[ob + 32 + ib] |= masks[shifts[ib]]
                xb = xo + bsz * ib
                for i in range(bsz):
                    v = x[r, xb + i]
                    weight[i] = qw[xb + i] * np.sqrt(sigma2 + v * v) if has_qw else v * v
                qh = np.int64(row[ob + 32 + ib])
                for k in range(2):
                    use_p = (shifts[ib] < 2) if k == 0 else (shifts[ib] % 2 == 0)
                    xx = x_p if use_p else x_m
                    g = np.int64(row[ob + 2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700)
                    fl = np.float32(2 * li + 1)
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[lv[g, j]] * fl
                        sqxf += w * q * x[r, xb + 8 * k + j]
                        sq2f += w * q * q
            if sq2f > 0:
                d = sqxf / sq2f
            hb = fp16_bits(d * np.float32(1.1125))
            sc[0] |= (hb & 0x000F) << 12
            sc[1] |= (hb & 0x00F0) << 8
            sc[2] |= (hb & 0x0F00) << 4
            sc[3] |= hb & 0xF000
            for k in range(4):
                row[ob + 48 + 2 * k] = sc[k] & 0xFF
                row[ob + 49 + 2 * k] = (sc[k] >> 8) & 0xFF
    return 0


# ------------------------------------------------------------------------------ public API


def _check(qtype: str, n: int) -> None:
    if qtype not in IQ_TYPES:
        raise QuantizationError(f"{qtype} is not one of {', '.join(IQ_TYPES)}.")
    if n % QK_K or n <= 0:
        raise QuantizationError(f"{qtype} needs rows whose length is a multiple of {QK_K}, got rows of {n}.")


class ImatrixRequiredError(QuantizationError):
    """A type llama.cpp only writes with an importance matrix was asked for without one."""


def imatrix_required_error(qtype: str, tensors: str | None = None) -> ImatrixRequiredError:
    """The one-sentence refusal for a type that llama.cpp only writes with an importance matrix."""
    what = f"{tensors} cannot be quantized to {qtype}" if tensors else f"{qtype} cannot be written"
    return ImatrixRequiredError(
        f"{what} without an importance matrix, which llama.cpp requires for it; "
        "calibrate first (Calibrate, or --imatrix FILE) and export again."
    )


def quantize_rows(
    x: np.ndarray, qtype: str, imatrix: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Quantize float32 rows (rows, n_per_row) to an i-quant, as ggml_quantize_chunk does.

    Releases the GIL. Types in ``NEEDS_IMATRIX`` are refused without an importance matrix, before any work.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise QuantizationError(f"{qtype} quantization expects 2-D rows, got shape {x.shape}.")
    rows, n = x.shape
    _check(qtype, n)
    if imatrix is None and qtype in NEEDS_IMATRIX:
        raise imatrix_required_error(qtype)
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.shape[0] != n:
            raise QuantizationError(
                f"The importance matrix has {qw.shape[0]} values but the rows have {n}; one per column is needed."
            )
    else:
        qw = np.zeros(1, np.float32)
    shape = (rows, row_bytes(qtype, n))
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    elif out.dtype != np.uint8 or out.shape != shape or not out.flags.c_contiguous:
        raise QuantizationError(f"The output buffer for {qtype} must be C-contiguous uint8 of shape {shape}.")
    if rows == 0:
        return out
    grid, kmap, neigh = grid_tables(qtype)
    kind = _KIND[qtype]
    if kind <= 4:
        bad = _lattice_rows(x, qw, imatrix is not None, kind, grid, kmap, neigh, out)
    else:
        bad = _iq1_rows(x, qw, imatrix is not None, kind == 6, grid, kmap, neigh, out)
    if bad:
        raise QuantizationError(
            f"A tensor of shape {x.shape} cannot be quantized to {qtype}: its values are so large that "
            "their squares overflow float32, and llama.cpp's quantizer would abort on it.",
            hint="Scale or exclude the tensor, or choose a K-quant for it.",
        )
    return out


def dequantize_rows(data: np.ndarray, qtype: str, n_per_row: int) -> np.ndarray:
    """Decode i-quant rows (rows, row bytes) back to float32 (rows, n_per_row) with gguf-py's decoder."""
    _check(qtype, n_per_row)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != row_bytes(qtype, n_per_row):
        raise QuantizationError(
            f"{qtype} data of shape {data.shape} does not hold rows of {n_per_row} weights "
            f"({row_bytes(qtype, n_per_row)} bytes each)."
        )
    if data.shape[0] == 0:
        return np.empty((0, n_per_row), np.float32)
    y = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype])
    return np.ascontiguousarray(y, dtype=np.float32).reshape(data.shape[0], n_per_row)
