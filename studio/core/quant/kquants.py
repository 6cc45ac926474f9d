"""K-quant block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), byte-identical to llama.cpp.

The kernels follow the float32 arithmetic of ggml's reference quantizers operation by
operation (same order of sums, division where C divides, C's ``nearest_int`` magic-number
rounding, ggml's round-to-nearest-even fp16 conversion, C's uint8/int8 wrap-around), compiled
with numba without fast-math so LLVM may not reassociate or contract anything. The scale
searches run over a tile of groups at once (position-major), so the sequential per-group sums
of many groups interleave: that is why they beat the C code, which waits on one sum at a time.
The kernels release the GIL, so a caller may run several at once on disjoint row ranges; numba
caches the compiled code on disk (first use in a fresh checkout compiles for ~20-60 s).
"""

from __future__ import annotations

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jit import njit
from studio.core.quant.numba_ops import JIT, fp16_value, nearest_int, nearest_int32, put_half
from studio.core.quant.types import GROUP_MAX_EPS, QK_K, QTYPES, row_bytes

KQUANT_TYPES: tuple[str, ...] = tuple(n for n, i in QTYPES.items() if i.kquant)

# Bytes per super-block, the stride of each kernel's output (numba freezes these as constants).
_B_Q2_K, _B_Q3_K, _B_Q4_K, _B_Q5_K, _B_Q6_K = (
    QTYPES[t].type_size for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
)


# ------------------------------------------------------------------- scale searches (ggml)


@njit(**JIT)
def _symmetric_search(n, nmax, x, xo, L, lo, laux, qw, qo, has_qw):
    """ggml's make_qx_quants with rmse_type 1: weights qw, or x² without them."""
    fmax = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(n):
        ax = abs(x[xo + i])
        if ax > amax:
            amax = ax
            fmax = x[xo + i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[lo + i] = 0
        return np.float32(0.0)
    fnmax = np.float32(nmax)
    iscale = np.float32(-nmax) / fmax
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        xi = x[xo + i]
        li = nearest_int(iscale * xi)
        li = max(-nmax, min(nmax - 1, li))
        L[lo + i] = li + nmax
        wi = qw[qo + i] if has_qw else xi * xi
        fl = np.float32(li)
        sumlx += wi * xi * fl
        suml2 += wi * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else np.float32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + np.float32(0.1) * np.float32(step)) / fmax
        sumlx = np.float32(0.0)
        suml2 = np.float32(0.0)
        for i in range(n):
            xi = x[xo + i]
            li = nearest_int(iscale * xi)
            li = max(-nmax, min(nmax - 1, li))
            laux[i] = li
            wi = qw[qo + i] if has_qw else xi * xi
            fl = np.float32(li)
            sumlx += wi * xi * fl
            suml2 += wi * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[lo + i] = laux[i] + nmax
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(**JIT)
def _positive_search(n, nmax, x, L, qw):
    """ggml's make_qp_quants: quantize non-negative group scales to 0..nmax with weights qw.

    L is uint8 as in C, so a negative level wraps and is read back wrapped.
    """
    fmax = np.float32(0.0)
    for i in range(n):
        fmax = fmax if fmax > x[i] else x[i]
    if fmax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return np.float32(0.0)
    fnmax = np.float32(nmax)
    iscale = fnmax / fmax
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = np.float32(1.0) / iscale
    best = np.float32(0.0)
    for i in range(n):
        diff = x[i] - scale * np.float32(L[i])
        best += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (np.float32(0.1) * np.float32(step) + fnmax) / fmax
        scale_is = np.float32(1.0) / iscale_is
        mse = np.float32(0.0)
        for i in range(n):
            li = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * np.float32(li)
            mse += qw[i] * diff * diff
        if mse < best:
            best = mse
            iscale = iscale_is
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        li = min(nmax, nearest_int(iscale * x[i]))
        L[i] = li & 0xFF
        fl = np.float32(li)
        sumlx += qw[i] * x[i] * fl
        suml2 += qw[i] * fl * fl
    for _ in range(5):
        changed = 0
        for i in range(n):
            wi = qw[i]
            fo = np.float32(L[i])
            slx = sumlx - wi * x[i] * fo
            sl2 = suml2 - wi * fo * fo
            if slx > 0 and sl2 > 0:
                nl = min(nmax, nearest_int(x[i] * sl2 / slx))
                if nl != L[i]:
                    fn = np.float32(nl)
                    slx += wi * x[i] * fn
                    sl2 += wi * fn * fn
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = nl & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else np.float32(0.0)


# ------------------------------------------------------------- lane-parallel scale searches
# ggml's per-group searches (make_qx_quants, make_qkx2/3_quants, make_q3_quants) run for a tile
# of independent groups at once: position-major arrays (n, lanes), every sum still sequential
# over the positions of its own group, but the groups' dependency chains interleave (and
# vectorize), where C waits on one chain. The per-block searches above stay scalar.


@njit(inline="always", **JIT)
def _lanes_absmax(tn, n, xt, amax, fmax):
    """Per lane: the largest |x| and the signed value that has it (the first one on ties, as C)."""
    for t in range(tn):
        amax[t] = np.float32(0.0)
        fmax[t] = np.float32(0.0)
    for i in range(n):
        for t in range(tn):
            ax = abs(xt[i, t])
            upd = ax > amax[t]
            fmax[t] = xt[i, t] if upd else fmax[t]
            amax[t] = ax if upd else amax[t]


@njit(**JIT)
def _symmetric_lanes(tn, n, nmax, xt, wt, Lt, ws, sc_out):
    """make_qx_quants (rmse_type 1) for lanes 0..tn-1 of xt/wt (n, lanes); levels into Lt."""
    amax = ws[0]
    fmax = ws[1]
    iscale = ws[2]
    sumlx = ws[3]
    suml2 = ws[4]
    best = ws[5]
    best_is = ws[6]
    scale = ws[7]
    lo = np.int32(-nmax)
    hi = np.int32(nmax - 1)
    fn = np.float32(nmax)
    _lanes_absmax(tn, n, xt, amax, fmax)
    for t in range(tn):
        iscale[t] = np.float32(-nmax) / fmax[t]
        sumlx[t] = np.float32(0.0)
        suml2[t] = np.float32(0.0)
    for i in range(n):
        for t in range(tn):
            fl = np.float32(max(lo, min(hi, nearest_int32(iscale[t] * xt[i, t]))))
            w = wt[i, t]
            sumlx[t] += w * xt[i, t] * fl
            suml2[t] += w * fl * fl
    for t in range(tn):
        s = sumlx[t] / suml2[t] if suml2[t] != 0 else np.float32(0.0)
        scale[t] = s
        best[t] = s * sumlx[t]
        best_is[t] = iscale[t]
    for step in range(-9, 10):
        if step == 0:
            continue
        for t in range(tn):
            iscale[t] = -(fn + np.float32(0.1) * np.float32(step)) / fmax[t]
            sumlx[t] = np.float32(0.0)
            suml2[t] = np.float32(0.0)
        for i in range(n):
            for t in range(tn):
                fl = np.float32(max(lo, min(hi, nearest_int32(iscale[t] * xt[i, t]))))
                w = wt[i, t]
                sumlx[t] += w * xt[i, t] * fl
                suml2[t] += w * fl * fl
        for t in range(tn):
            if suml2[t] > 0 and sumlx[t] * sumlx[t] > best[t] * suml2[t]:
                scale[t] = sumlx[t] / suml2[t]
                best[t] = scale[t] * sumlx[t]
                best_is[t] = iscale[t]
    # C keeps the levels of the best step; recomputing them from its scale gives the same
    for i in range(n):
        for t in range(tn):
            ix = max(lo, min(hi, nearest_int32(best_is[t] * xt[i, t]))) + np.int32(nmax)
            Lt[i, t] = ix if amax[t] >= GROUP_MAX_EPS else np.int32(0)
    for t in range(tn):
        sc_out[t] = scale[t] if amax[t] >= GROUP_MAX_EPS else np.float32(0.0)


@njit(**JIT)
def _affine_lanes(tn, n, nmax, xt, wt, Lt, laux, ws, rmin, rdelta, nstep, use_mad, sc_out, mn_out):
    """make_qkx2_quants / make_qkx3_quants for lanes 0..tn-1: scales and -mins out."""
    fmin = ws[0]
    fmax = ws[1]
    sum_w = ws[2]
    sum_x = ws[3]
    iscale = ws[4]
    scale = ws[5]
    best = ws[6]
    best_is = ws[7]
    best_min = ws[8]
    sl = ws[9]
    sl2 = ws[10]
    sxl = ws[11]
    ts = ws[12]
    tm = ws[13]
    cur = ws[14]
    min0 = ws[15]
    hi = np.int32(nmax)
    zero = np.int32(0)
    fn = np.float32(nmax)
    for t in range(tn):
        fmin[t] = xt[0, t]
        fmax[t] = xt[0, t]
        sum_w[t] = wt[0, t]
        sum_x[t] = wt[0, t] * xt[0, t]
    for i in range(1, n):
        for t in range(tn):
            v = xt[i, t]
            fmin[t] = v if v < fmin[t] else fmin[t]
            fmax[t] = v if v > fmax[t] else fmax[t]
            sum_w[t] += wt[i, t]
            sum_x[t] += wt[i, t] * v
    for t in range(tn):
        if fmin[t] > 0:
            fmin[t] = np.float32(0.0)
        iscale[t] = fn / (fmax[t] - fmin[t])
        scale[t] = np.float32(1.0) / iscale[t]
        best[t] = np.float32(0.0)
        best_is[t] = iscale[t]
        best_min[t] = fmin[t]
        min0[t] = fmin[t]
    for i in range(n):
        for t in range(tn):
            v = xt[i, t]
            fl = np.float32(max(zero, min(hi, nearest_int32(iscale[t] * (v - fmin[t])))))
            diff = scale[t] * fl + fmin[t] - v
            diff = abs(diff) if use_mad else diff * diff
            best[t] += wt[i, t] * diff
    for step in range(nstep + 1):
        for t in range(tn):
            iscale[t] = (rmin + rdelta * np.float32(step) + fn) / (fmax[t] - fmin[t])
            sl[t] = np.float32(0.0)
            sl2[t] = np.float32(0.0)
            sxl[t] = np.float32(0.0)
        for i in range(n):
            for t in range(tn):
                v = xt[i, t]
                li = max(zero, min(hi, nearest_int32(iscale[t] * (v - fmin[t]))))
                laux[i, t] = li
                fl = np.float32(li)
                wl = wt[i, t] * fl
                sl[t] += wl
                sl2[t] += wl * fl
                sxl[t] += wl * v
        for t in range(tn):
            D = sum_w[t] * sl2[t] - sl[t] * sl[t]
            a = (sum_w[t] * sxl[t] - sum_x[t] * sl[t]) / D
            b = (sl2[t] * sum_x[t] - sl[t] * sxl[t]) / D
            if b > 0:
                b = np.float32(0.0)
                a = sxl[t] / sl2[t]
            ts[t] = a
            tm[t] = b
            cur[t] = np.float32(0.0) if D > 0 else np.float32(np.inf)
        for i in range(n):
            for t in range(tn):
                diff = ts[t] * np.float32(laux[i, t]) + tm[t] - xt[i, t]
                diff = abs(diff) if use_mad else diff * diff
                cur[t] += wt[i, t] * diff
        for t in range(tn):
            # D <= 0 left cur at +inf (or NaN), which never beats best, as C skips the step
            if cur[t] < best[t]:
                best[t] = cur[t]
                scale[t] = ts[t]
                best_is[t] = iscale[t]
                best_min[t] = fmin[t]
                fmin[t] = tm[t]
    # C keeps the levels of the best step; recomputing them from its range gives the same.
    # A group with max <= min (constant, after min is clamped to <= 0) is all zeros in C.
    for i in range(n):
        for t in range(tn):
            li = max(zero, min(hi, nearest_int32(best_is[t] * (xt[i, t] - best_min[t]))))
            Lt[i, t] = li if fmax[t] > min0[t] else zero
    for t in range(tn):
        flat = not (fmax[t] > min0[t])
        sc_out[t] = np.float32(0.0) if flat else scale[t]
        mn_out[t] = -min0[t] if flat else -fmin[t]


@njit(**JIT)
def _q3_lanes(tn, n, nmax, xt, Lt, ws, sc_out):
    """make_q3_quants (do_rmse: weights x², five greedy passes) for lanes 0..tn-1."""
    amax = ws[0]
    fmax = ws[1]
    sumlx = ws[2]
    suml2 = ws[3]
    active = ws[4]
    lo = np.int32(-nmax)
    hi = np.int32(nmax - 1)
    _lanes_absmax(tn, n, xt, amax, fmax)
    for t in range(tn):
        # iscale is kept in active[] until the passes start
        active[t] = np.float32(-nmax) / fmax[t]
        sumlx[t] = np.float32(0.0)
        suml2[t] = np.float32(0.0)
    for i in range(n):
        for t in range(tn):
            v = xt[i, t]
            li = max(lo, min(hi, nearest_int32(active[t] * v)))
            Lt[i, t] = li
            w = v * v
            fl = np.float32(li)
            sumlx[t] += w * v * fl
            suml2[t] += w * fl * fl
    for t in range(tn):
        active[t] = np.float32(1.0)
    # C stops a group after a pass without change; active[] marks the groups still going
    for _ in range(5):
        for t in range(tn):
            active[t] = np.float32(2.0) if active[t] > 0 else np.float32(0.0)
        for i in range(n):
            for t in range(tn):
                if active[t] == 0:
                    continue
                v = xt[i, t]
                w = v * v
                fo = np.float32(Lt[i, t])
                slx = sumlx[t] - w * v * fo
                if slx > 0:
                    sl2 = suml2[t] - w * fo * fo
                    nl = max(lo, min(hi, nearest_int32(v * sl2 / slx)))
                    if nl != Lt[i, t]:
                        fn = np.float32(nl)
                        slx += w * v * fn
                        sl2 += w * fn * fn
                        if sl2 > 0 and slx * slx * suml2[t] > sumlx[t] * sumlx[t] * sl2:
                            Lt[i, t] = nl
                            sumlx[t] = slx
                            suml2[t] = sl2
                            active[t] = np.float32(1.0)
        for t in range(tn):
            # 2.0 = nothing changed in this pass
            active[t] = np.float32(0.0) if active[t] == 2 else active[t]
    for i in range(n):
        for t in range(tn):
            Lt[i, t] = Lt[i, t] + np.int32(nmax) if amax[t] >= GROUP_MAX_EPS else np.int32(0)
    for t in range(tn):
        if amax[t] < GROUP_MAX_EPS:
            sc_out[t] = np.float32(0.0)
        else:
            sc_out[t] = sumlx[t] / suml2[t] if suml2[t] > 0 else np.float32(0.0)


# ------------------------------------------------------------------------- packing helpers


@njit(**JIT)
def _pack_scale_min_k4(out, r, so, ls, lm):
    # 6-bit scale and min per group of 32 into 12 bytes (ls, lm are uint8 as in C)
    for j in range(8):
        out[r, so + j] = 0
    for j in range(4, 12):
        out[r, so + j] = 0
    for j in range(8):
        s = ls[j]
        m = lm[j]
        if j < 4:
            out[r, so + j] = s
            out[r, so + j + 4] = m
        else:
            out[r, so + j + 4] = ((s & 0xF) | ((m & 0xF) << 4)) & 0xFF
            out[r, so + j - 4] = (out[r, so + j - 4] | ((s >> 4) << 6)) & 0xFF
            out[r, so + j] = (out[r, so + j] | ((m >> 4) << 6)) & 0xFF


@njit(inline="always", **JIT)
def _scale_min_k4(out, r, so, j):
    if j < 4:
        return out[r, so + j] & 63, out[r, so + j + 4] & 63
    sc = (out[r, so + j + 4] & 0xF) | ((out[r, so + j - 4] >> 6) << 4)
    m = (out[r, so + j + 4] >> 4) | ((out[r, so + j] >> 6) << 4)
    return sc, m


@njit(**JIT)
def _pack_2bit(out, r, qo, L):
    # four 2-bit values of positions l, l+32, l+64, l+96 per byte, per 128 weights
    for j in range(0, QK_K, 128):
        for ix in range(32):
            out[r, qo + j // 4 + ix] = (
                L[j + ix] | (L[j + ix + 32] << 2) | (L[j + ix + 64] << 4) | (L[j + ix + 96] << 6)
            ) & 0xFF


@njit(**JIT)
def _pack_q3_scales(out, r, so, j, ix):
    # 6-bit signed-offset scale j: low nibble in bytes 0..7, top 2 bits in bytes 8..11
    if j < 8:
        out[r, so + j] = ix & 0xF
    else:
        out[r, so + j - 8] = (out[r, so + j - 8] | ((ix & 0xF) << 4)) & 0xFF
    hi = np.int64(out[r, so + 8 + j % 4]) | (((np.int64(ix) >> 4) << (2 * (j // 4))) & 0xFF)
    out[r, so + 8 + j % 4] = hi & 0xFF


@njit(inline="always", **JIT)
def _q3_scale(out, r, so, j):
    if j < 8:
        sc = np.int64(out[r, so + j]) & 0xF
    else:
        sc = np.int64(out[r, so + j - 8]) >> 4
    return (sc | (((np.int64(out[r, so + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32


# ---------------------------------------------------------------------------------- kernels
# Each kernel walks the chunk's super-blocks in tiles: gather the tile's groups position-major,
# run the lane search, then finish each super-block (scale quantization, requantization with
# the fp16-rounded scales, bit packing) exactly as ggml's per-block code does.


@njit(**JIT)
def _q45k_rows(x, qw, has_qw, nmax, out):
    # Q4_K (nmax 15) and Q5_K (nmax 31); without weights ggml uses make_qkx2 and the block
    # maxima, with weights make_qkx3 and make_qp_quants for the eight scales and mins.
    rows, n = x.shape
    nb = n // QK_K
    bb = _B_Q4_K if nmax == 15 else _B_Q5_K
    TB = 8
    T = TB * 8
    xt = np.empty((32, T), np.float32)
    wt = np.empty((32, T), np.float32)
    Lt = np.empty((32, T), np.int32)
    laux = np.empty((32, T), np.int32)
    ws = np.empty((16, T), np.float32)
    sc = np.empty(T, np.float32)
    mn = np.empty(T, np.float32)
    swt = np.empty(T, np.float32)
    L = np.zeros(QK_K, np.int64)
    ls = np.zeros(8, np.int64)
    lm = np.zeros(8, np.int64)
    if has_qw:
        rmin, rdelta, nstep = np.float32(-0.9), np.float32(0.05), 36
    elif nmax == 15:
        rmin, rdelta, nstep = np.float32(-1.0), np.float32(0.1), 20
    else:
        rmin, rdelta, nstep = np.float32(-0.5), np.float32(0.1), 15
    for b0 in range(0, rows * nb, TB):
        tb = min(TB, rows * nb - b0)
        for bl in range(tb):
            r = (b0 + bl) // nb
            xo = ((b0 + bl) % nb) * QK_K
            sigma2 = np.float32(0.0)
            if has_qw:
                sum_x2 = np.float32(0.0)
                for ix in range(QK_K):
                    sum_x2 += x[r, xo + ix] * x[r, xo + ix]
                sigma2 = np.float32(2.0) * sum_x2 / np.float32(QK_K)
            for j in range(8):
                t = bl * 8 + j
                go = xo + 32 * j
                if has_qw:
                    sumw = np.float32(0.0)
                    for i in range(32):
                        v = x[r, go + i]
                        xt[i, t] = v
                        w = qw[go + i] * np.sqrt(sigma2 + v * v)
                        wt[i, t] = w
                        sumw += w
                    swt[t] = sumw
                else:
                    sum_x2 = np.float32(0.0)
                    for i in range(32):
                        v = x[r, go + i]
                        xt[i, t] = v
                        sum_x2 += v * v
                    av_x = np.sqrt(sum_x2 / np.float32(32.0))
                    for i in range(32):
                        wt[i, t] = av_x + abs(xt[i, t])
        _affine_lanes(tb * 8, 32, nmax, xt, wt, Lt, laux, ws, rmin, rdelta, nstep, False, sc, mn)
        for bl in range(tb):
            r = (b0 + bl) // nb
            xo = ((b0 + bl) % nb) * QK_K
            o = ((b0 + bl) % nb) * bb
            s0 = bl * 8
            for j in range(8):
                for i in range(32):
                    L[32 * j + i] = Lt[i, s0 + j]
            if has_qw:
                d_block = _positive_search(8, 63, sc[s0 : s0 + 8], ls, swt[s0 : s0 + 8])
                m_block = _positive_search(8, 63, mn[s0 : s0 + 8], lm, swt[s0 : s0 + 8])
                if nmax == 31:
                    for j in range(8):
                        ls[j] = min(63, ls[j])
                        lm[j] = min(63, lm[j])
            else:
                max_scale = np.float32(0.0)
                max_min = np.float32(0.0)
                for j in range(8):
                    if sc[s0 + j] > max_scale:
                        max_scale = sc[s0 + j]
                    if mn[s0 + j] > max_min:
                        max_min = mn[s0 + j]
                inv_scale = np.float32(63.0) / max_scale if max_scale > 0 else np.float32(0.0)
                inv_min = np.float32(63.0) / max_min if max_min > 0 else np.float32(0.0)
                for j in range(8):
                    ls[j] = min(63, nearest_int(inv_scale * sc[s0 + j]) & 0xFF)
                    lm[j] = min(63, nearest_int(inv_min * mn[s0 + j]) & 0xFF)
                d_block = max_scale / np.float32(63.0)
                m_block = max_min / np.float32(63.0)
            _pack_scale_min_k4(out, r, o + 4, ls, lm)
            dd = put_half(out[r], o, d_block)
            dm = put_half(out[r], o + 2, m_block)
            for j in range(8):
                s, m = _scale_min_k4(out, r, o + 4, j)
                d = dd * np.float32(s)
                if d == 0:
                    continue
                dmj = dm * np.float32(m)
                for i in range(32):
                    li = nearest_int((x[r, xo + 32 * j + i] + dmj) / d)
                    L[32 * j + i] = max(0, min(nmax, li))
            if nmax == 15:
                for c in range(4):
                    for i in range(32):
                        out[r, o + 16 + 32 * c + i] = L[64 * c + i] | (L[64 * c + 32 + i] << 4)
            else:
                for i in range(32):
                    h = 0
                    for c in range(4):
                        l1 = L[64 * c + i]
                        l2 = L[64 * c + 32 + i]
                        h |= (l1 >> 4) << (2 * c)
                        h |= (l2 >> 4) << (2 * c + 1)
                        out[r, o + 48 + 32 * c + i] = (l1 & 0xF) | ((l2 & 0xF) << 4)
                    out[r, o + 16 + i] = h


@njit(**JIT)
def _q6k_rows(x, qw, has_qw, out):
    rows, n = x.shape
    nb = n // QK_K
    TB = 4
    T = TB * 16
    xt = np.empty((16, T), np.float32)
    wt = np.empty((16, T), np.float32)
    Lt = np.empty((16, T), np.int32)
    ws = np.empty((8, T), np.float32)
    sc = np.empty(T, np.float32)
    L = np.zeros(QK_K, np.int64)
    for b0 in range(0, rows * nb, TB):
        tb = min(TB, rows * nb - b0)
        for bl in range(tb):
            r = (b0 + bl) // nb
            xo = ((b0 + bl) % nb) * QK_K
            for g in range(16):
                t = bl * 16 + g
                for i in range(16):
                    v = x[r, xo + 16 * g + i]
                    xt[i, t] = v
                    wt[i, t] = qw[xo + 16 * g + i] if has_qw else v * v
        _symmetric_lanes(tb * 16, 16, 32, xt, wt, Lt, ws, sc)
        for bl in range(tb):
            r = (b0 + bl) // nb
            xo = ((b0 + bl) % nb) * QK_K
            o = ((b0 + bl) % nb) * _B_Q6_K
            s0 = bl * 16
            max_scale = np.float32(0.0)
            max_abs = np.float32(0.0)
            for g in range(16):
                s = sc[s0 + g]
                if abs(s) > max_abs:
                    max_abs = abs(s)
                    max_scale = s
            if max_abs < GROUP_MAX_EPS:
                for k in range(_B_Q6_K):
                    out[r, o + k] = 0
                continue
            for g in range(16):
                for i in range(16):
                    L[16 * g + i] = Lt[i, s0 + g]
            iscale = np.float32(-128.0) / max_scale
            dd = put_half(out[r], o + 208, np.float32(1.0) / iscale)
            for g in range(16):
                out[r, o + 192 + g] = min(127, nearest_int(iscale * sc[s0 + g])) & 0xFF
            for g in range(16):
                s8 = np.int64(out[r, o + 192 + g])
                if s8 > 127:
                    s8 -= 256
                d = dd * np.float32(s8)
                if d == 0:
                    continue
                for i in range(16):
                    li = nearest_int(x[r, xo + 16 * g + i] / d)
                    L[16 * g + i] = max(-32, min(31, li)) + 32
            for h in range(2):
                j = 128 * h
                for i in range(32):
                    q1 = L[j + i]
                    q2 = L[j + i + 32]
                    q3 = L[j + i + 64]
                    q4 = L[j + i + 96]
                    out[r, o + 64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                    out[r, o + 64 * h + i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
                    out[r, o + 128 + 32 * h + i] = (
                        (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
                    )


@njit(**JIT)
def _q3k_rows(x, qw, has_qw, out):
    rows, n = x.shape
    nb = n // QK_K
    TB = 4
    T = TB * 16
    xt = np.empty((16, T), np.float32)
    wt = np.empty((16, T), np.float32)
    Lt = np.empty((16, T), np.int32)
    ws = np.empty((8, T), np.float32)
    sc = np.empty(T, np.float32)
    swt = np.empty(T, np.float32)
    L = np.zeros(QK_K, np.int64)
    ls = np.zeros(16, np.int64)
    laux = np.zeros(16, np.int64)
    for b0 in range(0, rows * nb, TB):
        tb = min(TB, rows * nb - b0)
        if has_qw:
            for bl in range(tb):
                r = (b0 + bl) // nb
                xo = ((b0 + bl) % nb) * QK_K
                sum_x2 = np.float32(0.0)
                for ix in range(QK_K):
                    sum_x2 += x[r, xo + ix] * x[r, xo + ix]
                sigma2 = np.float32(2.0) * sum_x2 / np.float32(QK_K)
                for g in range(16):
                    t = bl * 16 + g
                    sumw = np.float32(0.0)
                    for i in range(16):
                        v = x[r, xo + 16 * g + i]
                        xt[i, t] = v
                        w = qw[xo + 16 * g + i] * np.sqrt(sigma2 + v * v)
                        wt[i, t] = w
                        sumw += w
                    swt[t] = sumw
            _symmetric_lanes(tb * 16, 16, 4, xt, wt, Lt, ws, sc)
        else:
            for bl in range(tb):
                r = (b0 + bl) // nb
                xo = ((b0 + bl) % nb) * QK_K
                for g in range(16):
                    for i in range(16):
                        xt[i, bl * 16 + g] = x[r, xo + 16 * g + i]
            _q3_lanes(tb * 16, 16, 4, xt, Lt, ws, sc)
        for bl in range(tb):
            r = (b0 + bl) // nb
            xo = ((b0 + bl) % nb) * QK_K
            o = ((b0 + bl) % nb) * _B_Q3_K
            so = o + 96
            s0 = bl * 16
            for k in range(12):
                out[r, so + k] = 0
            for g in range(16):
                for i in range(16):
                    L[16 * g + i] = Lt[i, s0 + g]
            if has_qw:
                d_block = _symmetric_search(16, 32, sc, s0, ls, 0, laux, swt, s0, True)
                for g in range(16):
                    _pack_q3_scales(out, r, so, g, ls[g])
                dd = put_half(out[r], o + 108, d_block)
            else:
                max_scale = np.float32(0.0)
                amax = np.float32(0.0)
                for g in range(16):
                    if abs(sc[s0 + g]) > amax:
                        amax = abs(sc[s0 + g])
                        max_scale = sc[s0 + g]
                if max_scale != 0:
                    iscale = np.float32(-32.0) / max_scale
                    for g in range(16):
                        lv = nearest_int(iscale * sc[s0 + g]) & 0xFF
                        if lv > 127:
                            lv -= 256
                        lv = max(-32, min(31, lv)) + 32
                        _pack_q3_scales(out, r, so, g, lv)
                    dd = put_half(out[r], o + 108, np.float32(1.0) / iscale)
                else:
                    dd = put_half(out[r], o + 108, np.float32(0.0))
            for g in range(16):
                d = dd * np.float32(_q3_scale(out, r, so, g))
                if d == 0:
                    continue
                for i in range(16):
                    li = nearest_int(x[r, xo + 16 * g + i] / d)
                    L[16 * g + i] = max(-4, min(3, li)) + 4
            for k in range(32):
                out[r, o + k] = 0
            for j in range(QK_K):
                if L[j] > 3:
                    out[r, o + j % 32] |= 1 << (j // 32)
                    L[j] -= 4
            _pack_2bit(out, r, o + 32, L)


@njit(**JIT)
def _q2k_rows(x, qw, has_qw, out):
    rows, n = x.shape
    nb = n // QK_K
    TB = 4
    T = TB * 16
    xt = np.empty((16, T), np.float32)
    wt = np.empty((16, T), np.float32)
    Lt = np.empty((16, T), np.int32)
    laux = np.empty((16, T), np.int32)
    ws = np.empty((16, T), np.float32)
    sc = np.empty(T, np.float32)
    mn = np.empty(T, np.float32)
    swt = np.empty(T, np.float32)
    L = np.zeros(QK_K, np.int64)
    ls = np.zeros(16, np.int64)
    lm = np.zeros(16, np.int64)
    if has_qw:
        rmin, rdelta, nstep = np.float32(-0.9), np.float32(0.05), 36
    else:
        rmin, rdelta, nstep = np.float32(-0.5), np.float32(0.1), 15
    for b0 in range(0, rows * nb, TB):
        tb = min(TB, rows * nb - b0)
        for bl in range(tb):
            r = (b0 + bl) // nb
            xo = ((b0 + bl) % nb) * QK_K
            sigma2 = np.float32(0.0)
            if has_qw:
                sum_x2 = np.float32(0.0)
                for ix in range(QK_K):
                    sum_x2 += x[r, xo + ix] * x[r, xo + ix]
                sigma2 = sum_x2 / np.float32(QK_K)
            for g in range(16):
                t = bl * 16 + g
                sumw = np.float32(0.0)
                for i in range(16):
                    v = x[r, xo + 16 * g + i]
                    xt[i, t] = v
                    w = qw[xo + 16 * g + i] * np.sqrt(sigma2 + v * v) if has_qw else abs(v)
                    wt[i, t] = w
                    sumw += w
                swt[t] = sumw
        _affine_lanes(tb * 16, 16, 3, xt, wt, Lt, laux, ws, rmin, rdelta, nstep, not has_qw, sc, mn)
        for bl in range(tb):
            r = (b0 + bl) // nb
            xo = ((b0 + bl) % nb) * QK_K
            o = ((b0 + bl) % nb) * _B_Q2_K
            s0 = bl * 16
            for g in range(16):
                for i in range(16):
                    L[16 * g + i] = Lt[i, s0 + g]
            if has_qw:
                dm = _positive_search(16, 15, sc[s0 : s0 + 16], ls, swt[s0 : s0 + 16])
                mm = _positive_search(16, 15, mn[s0 : s0 + 16], lm, swt[s0 : s0 + 16])
                dd = put_half(out[r], o + 80, dm)
                dmin = put_half(out[r], o + 82, mm)
                for g in range(16):
                    out[r, o + g] = (ls[g] | (lm[g] << 4)) & 0xFF
            else:
                max_scale = np.float32(0.0)
                max_min = np.float32(0.0)
                for g in range(16):
                    if sc[s0 + g] > max_scale:
                        max_scale = sc[s0 + g]
                    if mn[s0 + g] > max_min:
                        max_min = mn[s0 + g]
                if max_scale > 0:
                    iscale = np.float32(15.0) / max_scale
                    for g in range(16):
                        out[r, o + g] = nearest_int(iscale * sc[s0 + g]) & 0xFF
                    dd = put_half(out[r], o + 80, max_scale / np.float32(15.0))
                else:
                    for g in range(16):
                        out[r, o + g] = 0
                    dd = put_half(out[r], o + 80, np.float32(0.0))
                if max_min > 0:
                    iscale = np.float32(15.0) / max_min
                    for g in range(16):
                        out[r, o + g] = (
                            np.int64(out[r, o + g]) | (nearest_int(iscale * mn[s0 + g]) << 4)
                        ) & 0xFF
                    dmin = put_half(out[r], o + 82, max_min / np.float32(15.0))
                else:
                    dmin = put_half(out[r], o + 82, np.float32(0.0))
            for g in range(16):
                d = dd * np.float32(out[r, o + g] & 0xF)
                if d == 0:
                    continue
                m = dmin * np.float32(out[r, o + g] >> 4)
                for i in range(16):
                    li = nearest_int((x[r, xo + 16 * g + i] + m) / d)
                    L[16 * g + i] = max(0, min(3, li))
            _pack_2bit(out, r, o + 16, L)


# ------------------------------------------------------------------------------ dequantize


@njit(**JIT)
def _dequant_rows(data, kind, n, y):
    # kind: 2..6 for Q2_K..Q6_K; products in the order of ggml's dequantize_row_*
    rows = data.shape[0]
    nb = n // QK_K
    for r in range(rows):
        for ib in range(nb):
            yo = ib * QK_K
            if kind == 4 or kind == 5:
                bb = _B_Q4_K if kind == 4 else _B_Q5_K
                o = ib * bb
                d = fp16_value(np.int64(data[r, o]) | (np.int64(data[r, o + 1]) << 8))
                dmin = fp16_value(np.int64(data[r, o + 2]) | (np.int64(data[r, o + 3]) << 8))
                for c in range(4):
                    sc, m = _scale_min_k4(data, r, o + 4, 2 * c)
                    d1 = d * np.float32(sc)
                    m1 = dmin * np.float32(m)
                    sc, m = _scale_min_k4(data, r, o + 4, 2 * c + 1)
                    d2 = d * np.float32(sc)
                    m2 = dmin * np.float32(m)
                    for ix in range(32):
                        if kind == 4:
                            q = data[r, o + 16 + 32 * c + ix]
                            q1 = q & 0xF
                            q2 = q >> 4
                        else:
                            q = data[r, o + 48 + 32 * c + ix]
                            h = data[r, o + 16 + ix]
                            q1 = (q & 0xF) + (16 if h & (1 << (2 * c)) else 0)
                            q2 = (q >> 4) + (16 if h & (2 << (2 * c)) else 0)
                        y[r, yo + 64 * c + ix] = d1 * np.float32(q1) - m1
                        y[r, yo + 64 * c + 32 + ix] = d2 * np.float32(q2) - m2
            elif kind == 6:
                o = ib * _B_Q6_K
                d = fp16_value(np.int64(data[r, o + 208]) | (np.int64(data[r, o + 209]) << 8))
                for h in range(2):
                    for ix in range(32):
                        ql0 = data[r, o + 64 * h + ix]
                        ql1 = data[r, o + 64 * h + 32 + ix]
                        qh = data[r, o + 128 + 32 * h + ix]
                        qv = (
                            (ql0 & 0xF) | ((qh & 3) << 4),
                            (ql1 & 0xF) | (((qh >> 2) & 3) << 4),
                            (ql0 >> 4) | (((qh >> 4) & 3) << 4),
                            (ql1 >> 4) | (((qh >> 6) & 3) << 4),
                        )
                        for k in range(4):
                            sc = np.int64(data[r, o + 192 + 8 * h + ix // 16 + 2 * k])
                            if sc > 127:
                                sc -= 256
                            y[r, yo + 128 * h + 32 * k + ix] = d * np.float32(sc) * np.float32(qv[k] - 32)
            elif kind == 3:
                o = ib * _B_Q3_K
                d_all = fp16_value(np.int64(data[r, o + 108]) | (np.int64(data[r, o + 109]) << 8))
                for g in range(16):
                    dl = d_all * np.float32(_q3_scale(data, r, o + 96, g))
                    half = g // 8
                    j = (g % 8) // 2
                    sub = g % 2
                    for ix in range(16):
                        pos = 16 * sub + ix
                        q = (data[r, o + 32 + 32 * half + pos] >> (2 * j)) & 3
                        hbit = data[r, o + pos] & (1 << (4 * half + j))
                        y[r, yo + 16 * g + ix] = dl * np.float32(q - (0 if hbit else 4))
            else:
                o = ib * _B_Q2_K
                d = fp16_value(np.int64(data[r, o + 80]) | (np.int64(data[r, o + 81]) << 8))
                dmin = fp16_value(np.int64(data[r, o + 82]) | (np.int64(data[r, o + 83]) << 8))
                for g in range(16):
                    sc = data[r, o + g]
                    dl = d * np.float32(sc & 0xF)
                    ml = dmin * np.float32(sc >> 4)
                    half = g // 8
                    j = (g % 8) // 2
                    sub = g % 2
                    for ix in range(16):
                        q = (data[r, o + 16 + 32 * half + 16 * sub + ix] >> (2 * j)) & 3
                        y[r, yo + 16 * g + ix] = dl * np.float32(q) - ml


# ------------------------------------------------------------------------------ public API


def _check(qtype: str, n_per_row: int) -> None:
    if qtype not in KQUANT_TYPES:
        raise QuantizationError(f"{qtype} is not a K-quant type; expected one of {', '.join(KQUANT_TYPES)}.")
    if n_per_row % QK_K or n_per_row <= 0:
        raise QuantizationError(
            f"{qtype} needs rows whose length is a multiple of {QK_K}, got rows of {n_per_row}."
        )


def quantize_rows(
    x: np.ndarray, qtype: str, imatrix: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Quantize float32 rows (rows, n_per_row) to K-quant blocks, as ggml_quantize_chunk does.

    Releases the GIL: threads may quantize disjoint row ranges at once. ``out``, when given,
    is a C-contiguous uint8 (rows, row bytes) array written in place and returned.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise QuantizationError(f"{qtype} quantization expects 2-D rows, got shape {x.shape}.")
    rows, n = x.shape
    _check(qtype, n)
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
    has_qw = imatrix is not None
    if qtype == "Q4_K":
        _q45k_rows(x, qw, has_qw, 15, out)
    elif qtype == "Q5_K":
        _q45k_rows(x, qw, has_qw, 31, out)
    elif qtype == "Q6_K":
        _q6k_rows(x, qw, has_qw, out)
    elif qtype == "Q3_K":
        _q3k_rows(x, qw, has_qw, out)
    else:
        _q2k_rows(x, qw, has_qw, out)
    return out


def dequantize_rows(data: np.ndarray, qtype: str, n_per_row: int) -> np.ndarray:
    """Decode K-quant rows (rows, row_bytes) back to float32 (rows, n_per_row)."""
    _check(qtype, n_per_row)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != row_bytes(qtype, n_per_row):
        raise QuantizationError(
            f"{qtype} data of shape {data.shape} does not hold rows of {n_per_row} weights "
            f"({row_bytes(qtype, n_per_row)} bytes each)."
        )
    y = np.empty((data.shape[0], n_per_row), dtype=np.float32)
    if data.shape[0]:
        _dequant_rows(data, int(qtype[1]), n_per_row, y)
    return y


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) every kernel, e.g. before timing."""
    x = np.zeros((1, QK_K), np.float32)
    qw = np.ones(QK_K, np.float32)
    for qtype in KQUANT_TYPES:
        dequantize_rows(quantize_rows(x, qtype), qtype, QK_K)
        quantize_rows(x, qtype, qw)
