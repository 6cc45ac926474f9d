"""Block formats with 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), IQ4_XS and the float types.

The quantizers are numba kernels that follow llama.cpp's ggml-quants.c step by step in float32:
same search order, same accumulation order, same rounding (``numba_ops.nearest_int``, Q8_0 uses
roundf, the legacy types truncate ``x + 0.5``), so the bytes are identical. fp16 scales are rounded
to nearest-even like ggml, by the fast kernels themselves (``numba_ops.put_half``) or by numpy's
``astype(float16)`` after the search kernels. Block geometry comes from ``types.QTYPES``.

Every kernel takes a C-contiguous float32 ``(rows, n_per_row)`` array and writes into a preallocated
uint8 ``(rows, row_bytes)`` array, so callers can hand it row chunks of a larger output.
"""

from __future__ import annotations

import numpy as np

from studio.core.jit import HAVE_NUMBA, njit
from studio.core.quant.numba_ops import JIT as _JIT
from studio.core.quant.numba_ops import fp16_from_bits, nearest_int, put_half
from studio.core.quant.types import FLOAT_TYPES, GROUP_MAX_EPS, IQ4NL_LEVELS, QTYPES

__all__ = [
    "HAVE_NUMBA",
    "all_finite",
    "dequantize_rows",
    "quantize_rows",
]

_IQ4_F32 = IQ4NL_LEVELS.astype(np.float32)

# Bytes per block, the stride of each kernel's output (numba freezes these as constants).
_B_Q8_0, _B_Q4_0, _B_Q4_1, _B_Q5_0, _B_Q5_1, _B_IQ4_NL, _B_IQ4_XS = (
    QTYPES[t].type_size for t in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS")
)


# ----------------------------------------------------------------------------------------- helpers


@njit(**_JIT)
def _roundf(v):
    # C roundf: halves away from zero (np.rint would round them to even).
    t = np.float32(int(v))
    f = v - t
    if f >= np.float32(0.5):
        t += np.float32(1.0)
    elif f <= np.float32(-0.5):
        t -= np.float32(1.0)
    return int(t)


@njit(**_JIT)
def _best_index(vals, x):
    # Index of the table level nearest to x; ties go to the upper level, as in best_index_int8.
    # The C binary search ends on the unique ml with vals[ml] <= x < vals[ml + 1]; four selects
    # find the same ml without unpredictable branches.
    if x != x:
        return 15  # NaN: every C comparison is false, the search ends on the top level
    if x <= vals[0]:
        return 0
    if x >= vals[15]:
        return 15
    ml = 8 if vals[8] <= x else 0
    ml = ml + 4 if vals[ml + 4] <= x else ml
    ml = ml + 2 if vals[ml + 2] <= x else ml
    ml = ml + 1 if vals[ml + 1] <= x else ml
    return ml if x - vals[ml] < vals[ml + 1] - x else ml + 1


@njit(**_JIT)
def _amax32(x, r, o):
    # max |x| over a 32-value block. Eight running maxima break the compare-select dependency chain
    # that dominates a single-accumulator loop; max is exact in any order, so the result is the same.
    m0 = abs(x[r, o])
    m1 = abs(x[r, o + 1])
    m2 = abs(x[r, o + 2])
    m3 = abs(x[r, o + 3])
    m4 = abs(x[r, o + 4])
    m5 = abs(x[r, o + 5])
    m6 = abs(x[r, o + 6])
    m7 = abs(x[r, o + 7])
    for j in range(o + 8, o + 32, 8):
        a = abs(x[r, j])
        m0 = a if a > m0 else m0
        a = abs(x[r, j + 1])
        m1 = a if a > m1 else m1
        a = abs(x[r, j + 2])
        m2 = a if a > m2 else m2
        a = abs(x[r, j + 3])
        m3 = a if a > m3 else m3
        a = abs(x[r, j + 4])
        m4 = a if a > m4 else m4
        a = abs(x[r, j + 5])
        m5 = a if a > m5 else m5
        a = abs(x[r, j + 6])
        m6 = a if a > m6 else m6
        a = abs(x[r, j + 7])
        m7 = a if a > m7 else m7
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    m4 = m5 if m5 > m4 else m4
    m6 = m7 if m7 > m6 else m6
    m0 = m2 if m2 > m0 else m0
    m4 = m6 if m6 > m4 else m4
    return m4 if m4 > m0 else m0


@njit(**_JIT)
def _first_absmax(x, r, o):
    # Signed value of the first element with the largest |x| in the block (+0.0 if all are zero),
    # what C's "if (amax < fabsf(v))" loop keeps: the max first, then a short search for it.
    amax = _amax32(x, r, o)
    if amax == np.float32(0.0):
        return np.float32(0.0)
    for j in range(32):
        if abs(x[r, o + j]) == amax:
            return x[r, o + j]
    return np.float32(0.0)


@njit(inline="always", **_JIT)
def _min_max32(x, r, o):
    """(min, max) of the 32 values at x[r, o:o+32], as ggml's Q4_1/Q5_1 scan them."""
    mn = np.float32(np.inf)
    mx = np.float32(-np.inf)
    for j in range(32):
        v = x[r, o + j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit(**_JIT)
def _row_sigma2(x, r, n):
    s = np.float32(0.0)
    for j in range(n):
        v = x[r, j]
        s += v * v
    return s / np.float32(n)


@njit(**_JIT)
def _make_qx(xb, w, wx, nmax, L):
    # make_qx_quants(32, nmax, rmse_type=1, weights): signed symmetric scale search over 19 candidates.
    # xb and w are private 32-value copies, so the compiler knows L's stores cannot alias them.
    mx = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(32):
        ax = abs(xb[i])
        if ax > amax:
            amax = ax
            mx = xb[i]
    if amax < GROUP_MAX_EPS:
        for i in range(32):
            L[i] = 0
        return np.float32(0.0)
    fn = np.float32(nmax)
    magic = np.float32(12582912.0)
    hi = np.float32(nmax - 1)
    lo = -fn
    iscale = -fn / mx
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(32):
        wx[i] = w[i] * xb[i]  # C's w*x[i]*l is (w*x[i])*l: the product can be kept
    for i in range(32):
        lv = nearest_int(iscale * xb[i])
        lv = max(-nmax, min(nmax - 1, lv))
        L[i] = lv + nmax
        fl = np.float32(lv)
        sumlx += wx[i] * fl
        suml2 += w[i] * fl * fl
    scale = sumlx / suml2 if suml2 != np.float32(0.0) else np.float32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fn + np.float32(0.1) * np.float32(step)) / mx
        sumlx = np.float32(0.0)
        suml2 = np.float32(0.0)
        for i in range(32):
            # |iscale*x| <= nmax + 1 here, so adding and removing 1.5*2^23 is nearest_int exactly,
            # and the clamp can stay in float (no int round trip in the hot loop).
            fl = (iscale * xb[i] + magic) - magic
            fl = fl if fl < hi else hi
            fl = fl if fl > lo else lo
            sumlx += wx[i] * fl
            suml2 += w[i] * fl * fl
        if suml2 > np.float32(0.0) and sumlx * sumlx > best * suml2:
            for i in range(32):
                lv = nearest_int(iscale * xb[i])
                L[i] = nmax + max(-nmax, min(nmax - 1, lv))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(**_JIT)
def _make_qkx3(x, r, o, w, nmax, L, Laux):
    # make_qkx3_quants(32, nmax, rmin=-0.9, rdelta=0.05, nstep=36, use_mad=False) -> (scale, min).
    # When a step improves the error its min is used by every following step (as in the C loop).
    rmin = np.float32(-0.9)
    rdelta = np.float32(0.05)
    fn = np.float32(nmax)
    mn = x[r, o]
    mx = x[r, o]
    sum_w = w[0]
    sum_x = sum_w * x[r, o]
    for i in range(1, 32):
        xi = x[r, o + i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        wi = w[i]
        sum_w += wi
        sum_x += wi * xi
    if mn > np.float32(0.0):
        mn = np.float32(0.0)
    if mx <= mn:
        for i in range(32):
            L[i] = 0
        return np.float32(0.0), mn
    iscale = fn / (mx - mn)
    scale = np.float32(1.0) / iscale
    best_mad = np.float32(0.0)
    for i in range(32):
        xi = x[r, o + i]
        lv = nearest_int(iscale * (xi - mn))
        lv = max(0, min(nmax, lv))
        L[i] = lv
        diff = scale * np.float32(lv) + mn - xi
        best_mad += w[i] * (diff * diff)
    for step in range(37):
        iscale = (rmin + rdelta * np.float32(step) + fn) / (mx - mn)
        sum_l = np.float32(0.0)
        sum_l2 = np.float32(0.0)
        sum_xl = np.float32(0.0)
        for i in range(32):
            xi = x[r, o + i]
            lv = nearest_int(iscale * (xi - mn))
            lv = max(0, min(nmax, lv))
            Laux[i] = lv
            wi = w[i]
            fl = np.float32(lv)
            sum_l += wi * fl
            sum_l2 += wi * fl * fl
            sum_xl += wi * fl * xi
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > np.float32(0.0):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > np.float32(0.0):
                this_min = np.float32(0.0)
                this_scale = sum_xl / sum_l2
            mad = np.float32(0.0)
            for i in range(32):
                diff = this_scale * np.float32(Laux[i]) + this_min - x[r, o + i]
                mad += w[i] * (diff * diff)
            if mad < best_mad:
                for i in range(32):
                    L[i] = Laux[i]
                best_mad = mad
                scale = this_scale
                mn = this_min
    return scale, mn


@njit(**_JIT)
def _imatrix_weights(x, r, o, qw, sigma2, w):
    for j in range(32):
        v = x[r, o + j]
        w[j] = qw[o + j] * np.sqrt(sigma2 + v * v)


@njit(**_JIT)
def _pack_nibbles(out, base, L):
    for j in range(16):
        out[base + j] = (L[j] & 15) | ((L[j + 16] & 15) << 4)


@njit(**_JIT)
def _pack_q5(out, qh_at, qs_at, L):
    qh = 0
    for j in range(16):
        a = L[j]
        b = L[j + 16]
        out[qs_at + j] = (a & 15) | ((b & 15) << 4)
        qh |= ((a >> 4) & 1) << j
        qh |= ((b >> 4) & 1) << (j + 16)
    for k in range(4):
        out[qh_at + k] = (qh >> (8 * k)) & 255


# ----------------------------------------------------------------------------------------- kernels


@njit(**_JIT)
def _k_q8_0(x, out):
    rows, n = x.shape
    for r in range(rows):
        orow = out[r]
        for b in range(n // 32):
            o = b * 32
            d = _amax32(x, r, o) / np.float32(127.0)
            inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
            put_half(orow, b * _B_Q8_0, d)
            base = b * _B_Q8_0 + 2
            for j in range(32):
                orow[base + j] = _roundf(x[r, o + j] * inv) & 255


@njit(**_JIT)
def _k_q4_0(x, out):
    rows, n = x.shape
    for r in range(rows):
        orow = out[r]
        for b in range(n // 32):
            o = b * 32
            mx = _first_absmax(x, r, o)
            d = mx / np.float32(-8.0)
            inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
            put_half(orow, b * _B_Q4_0, d)
            base = b * _B_Q4_0 + 2
            for j in range(16):
                q0 = np.int32(x[r, o + j] * inv + np.float32(8.5))
                q1 = np.int32(x[r, o + 16 + j] * inv + np.float32(8.5))
                q0 = q0 if q0 < 15 else np.int32(15)
                q1 = q1 if q1 < 15 else np.int32(15)
                orow[base + j] = np.uint8(q0 | (q1 << 4))


@njit(**_JIT)
def _k_q5_0(x, out):
    rows, n = x.shape
    L = np.empty(32, dtype=np.int32)
    for r in range(rows):
        orow = out[r]
        for b in range(n // 32):
            o = b * 32
            mx = _first_absmax(x, r, o)
            d = mx / np.float32(-16.0)
            inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
            put_half(orow, b * _B_Q5_0, d)
            for j in range(32):
                L[j] = min(31, int(x[r, o + j] * inv + np.float32(16.5)))
            _pack_q5(orow, b * _B_Q5_0 + 2, b * _B_Q5_0 + 6, L)


@njit(**_JIT)
def _k_q4_1(x, out):
    rows, n = x.shape
    for r in range(rows):
        orow = out[r]
        for b in range(n // 32):
            o = b * 32
            mn, mx = _min_max32(x, r, o)
            d = (mx - mn) / np.float32(15.0)
            inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
            put_half(orow, b * _B_Q4_1, d)
            put_half(orow, b * _B_Q4_1 + 2, mn)
            base = b * _B_Q4_1 + 4
            for j in range(16):
                q0 = min(15, int((x[r, o + j] - mn) * inv + np.float32(0.5)))
                q1 = min(15, int((x[r, o + 16 + j] - mn) * inv + np.float32(0.5)))
                orow[base + j] = q0 | (q1 << 4)


@njit(**_JIT)
def _k_q5_1(x, out):
    rows, n = x.shape
    L = np.empty(32, dtype=np.int32)
    for r in range(rows):
        orow = out[r]
        for b in range(n // 32):
            o = b * 32
            mn, mx = _min_max32(x, r, o)
            d = (mx - mn) / np.float32(31.0)
            inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
            put_half(orow, b * _B_Q5_1, d)
            put_half(orow, b * _B_Q5_1 + 2, mn)
            for j in range(32):
                # C casts to uint8_t without a clamp; the value never exceeds 31.
                L[j] = int((x[r, o + j] - mn) * inv + np.float32(0.5)) & 255
            _pack_q5(orow, b * _B_Q5_1 + 4, b * _B_Q5_1 + 8, L)


@njit(**_JIT)
def _k_qx_imatrix(x, qw, out, dsc, nmax, bsize):
    # Q4_0 (nmax 8, 18-byte blocks) and Q5_0 (nmax 16, 22-byte blocks) with an importance matrix.
    rows, n = x.shape
    w = np.empty(32, dtype=np.float32)
    wx = np.empty(32, dtype=np.float32)
    xb = np.empty(32, dtype=np.float32)
    L = np.empty(32, dtype=np.int32)
    for r in range(rows):
        orow = out[r]
        sigma2 = _row_sigma2(x, r, n)
        for b in range(n // 32):
            o = b * 32
            _imatrix_weights(x, r, o, qw, sigma2, w)
            for j in range(32):
                xb[j] = x[r, o + j]
            dsc[r, b] = _make_qx(xb, w, wx, nmax, L)
            if nmax == 8:
                _pack_nibbles(orow, b * bsize + 2, L)
            else:
                _pack_q5(orow, b * bsize + 2, b * bsize + 6, L)


@njit(**_JIT)
def _k_qkx_imatrix(x, qw, out, dsc, msc, nmax, bsize):
    # Q4_1 (nmax 15, 20-byte blocks) and Q5_1 (nmax 31, 24-byte blocks) with an importance matrix.
    rows, n = x.shape
    w = np.empty(32, dtype=np.float32)
    L = np.empty(32, dtype=np.int32)
    Laux = np.empty(32, dtype=np.int32)
    for r in range(rows):
        orow = out[r]
        sigma2 = _row_sigma2(x, r, n)
        for b in range(n // 32):
            o = b * 32
            _imatrix_weights(x, r, o, qw, sigma2, w)
            scale, mn = _make_qkx3(x, r, o, w, nmax, L, Laux)
            dsc[r, b] = scale
            msc[r, b] = mn
            if nmax == 15:
                _pack_nibbles(orow, b * bsize + 4, L)
            else:
                _pack_q5(orow, b * bsize + 4, b * bsize + 8, L)


@njit(**_JIT)
def _iq4_sub_scale(x, r, o, w, vals, L, lo):
    # Best scale of one 32-value sub-block over the 15 candidate grids (ntry = 7); 0 if all ~zero.
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(32):
        ax = abs(x[r, o + j])
        if ax > amax:
            amax = ax
            mx = x[r, o + j]
    if amax < GROUP_MAX_EPS:
        return np.float32(0.0)
    d = -mx / vals[0]
    inv = np.float32(1.0) / d
    sumqx = np.float32(0.0)
    sumq2 = np.float32(0.0)
    for j in range(32):
        xj = x[r, o + j]
        li = _best_index(vals, inv * xj)
        L[lo + j] = li
        q = vals[li]
        wj = w[j]
        sumqx += wj * q * xj
        sumq2 += wj * q * q
    d = sumqx / sumq2 if sumq2 > np.float32(0.0) else np.float32(0.0)
    best = d * sumqx
    for itry in range(-7, 8):
        inv = np.float32(itry - 127) / mx
        sumqx = np.float32(0.0)
        sumq2 = np.float32(0.0)
        for j in range(32):
            xj = x[r, o + j]
            q = vals[_best_index(vals, inv * xj)]
            wj = w[j]
            sumqx += wj * q * xj
            sumq2 += wj * q * q
        if sumq2 > np.float32(0.0) and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit(**_JIT)
def _k_iq4(x, qw, has_qw, out, dsc, sbs, vals):
    # IQ4_NL (sbs 32, 18-byte blocks) and IQ4_XS (sbs 256, 136-byte blocks), quantize_row_iq4_nl_impl.
    rows, n = x.shape
    nsub = sbs // 32
    bsize = _B_IQ4_NL if sbs == 32 else _B_IQ4_XS
    w = np.empty(32, dtype=np.float32)
    L = np.empty(sbs, dtype=np.int32)
    scales = np.empty(nsub, dtype=np.float32)
    for r in range(rows):
        orow = out[r]
        for sb in range(n // sbs):
            base = sb * sbs
            sigma2 = np.float32(0.0)
            for j in range(sbs):
                v = x[r, base + j]
                sigma2 += v * v
            sigma2 *= np.float32(2.0) / np.float32(sbs)
            max_scale = np.float32(0.0)
            amax_scale = np.float32(0.0)
            for ib in range(nsub):
                o = base + ib * 32
                if has_qw:
                    _imatrix_weights(x, r, o, qw, sigma2, w)
                else:
                    for j in range(32):
                        v = x[r, o + j]
                        w[j] = v * v
                s = _iq4_sub_scale(x, r, o, w, vals, L, ib * 32)
                scales[ib] = s
                if abs(s) > amax_scale:
                    amax_scale = abs(s)
                    max_scale = s
            ob = sb * bsize
            if nsub > 1:
                d = -max_scale / np.float32(32.0)
                dsc[r, sb] = d
                inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
                sh = 0
                for ib in range(nsub):
                    lv = nearest_int(inv * scales[ib])
                    lv = max(-32, min(31, lv))
                    dl = d * np.float32(lv)
                    idl = np.float32(1.0) / dl if dl != np.float32(0.0) else np.float32(0.0)
                    o = base + ib * 32
                    for j in range(32):
                        L[ib * 32 + j] = _best_index(vals, idl * x[r, o + j])
                    lv += 32
                    if ib % 2 == 0:
                        orow[ob + 4 + ib // 2] = lv & 15
                    else:
                        orow[ob + 4 + ib // 2] |= (lv & 15) << 4
                    sh |= (lv >> 4) << (2 * (ib % 8))
                orow[ob + 2] = sh & 255
                orow[ob + 3] = (sh >> 8) & 255
                qs_at = ob + 8
            else:
                d = scales[0]
                dsc[r, sb] = d
                inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
                for j in range(32):
                    L[j] = _best_index(vals, inv * x[r, base + j])
                qs_at = ob + 2
            for i in range(nsub):
                for j in range(16):
                    orow[qs_at + 16 * i + j] = L[32 * i + j] | (L[32 * i + 16 + j] << 4)


@njit(**_JIT)
def _k_f16(u, h):
    # float32 bits -> IEEE half bits for a whole array.
    for i in range(u.size):
        h[i] = fp16_from_bits(np.int64(u[i]))


@njit(**_JIT)
def _k_bf16(u, h):
    # float32 bits -> bfloat16 bits, round to nearest-even on the upper half (ggml_compute_fp32_to_bf16).
    for i in range(u.size):
        b = u[i]
        if (b & 0x7FFFFFFF) > 0x7F800000:
            h[i] = (b >> 16) | 64
        else:
            h[i] = (b + (0x7FFF + ((b >> 16) & 1))) >> 16


@njit(**_JIT)
def _max_exponent(u):
    # Largest exponent field among float32 bit patterns: 0x7F800000 means a NaN or an infinity.
    m = 0
    for i in range(u.size):
        e = u[i] & 0x7F800000
        m = e if e > m else m
    return m


# ----------------------------------------------------------------------------------------- numpy side


def all_finite(x: np.ndarray) -> bool:
    """Whether a float32 array holds no NaN or infinity (one integer pass, no temporaries)."""
    if not HAVE_NUMBA or x.dtype != np.float32 or not x.flags.c_contiguous:
        return bool(np.isfinite(x).all())
    return x.size == 0 or int(_max_exponent(x.reshape(-1).view(np.uint32))) != 0x7F800000


def _put_half_scales(out: np.ndarray, vals: np.ndarray, bsize: int, at: int) -> None:
    # Writes float32 scales as little-endian fp16 at byte ``at`` of every block (round to nearest-even).
    rows, nb = vals.shape
    blocks = out.reshape(rows, nb, bsize)
    with np.errstate(over="ignore"):  # scales beyond 65504 become inf, as in ggml
        half = vals.astype("<f2")
    blocks[:, :, at : at + 2] = half.view(np.uint8).reshape(rows, nb, 2)


def _float_rows(x: np.ndarray, qtype: str, out: np.ndarray) -> None:
    if qtype == "F32":
        out[...] = x.astype("<f4", copy=False).view(np.uint8)
    elif HAVE_NUMBA:
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).reshape(-1)
        (_k_f16 if qtype == "F16" else _k_bf16)(u, out.view(np.uint16).reshape(-1))
    elif qtype == "F16":
        out[...] = x.astype("<f2").view(np.uint8)
    else:  # BF16, rounded to nearest-even on the upper 16 bits like ggml_compute_fp32_to_bf16
        u = x.view(np.uint32)
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        h = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype("<u2")
        if nan.any():
            h[nan] = ((u[nan] >> 16) | 64).astype("<u2")
        out[...] = h.view(np.uint8)


_PLAIN = {"Q8_0": _k_q8_0, "Q4_0": _k_q4_0, "Q5_0": _k_q5_0, "Q4_1": _k_q4_1, "Q5_1": _k_q5_1}


def quantize_rows(x: np.ndarray, qtype: str, imatrix: np.ndarray | None, out: np.ndarray) -> None:
    """Quantize float32 ``(rows, n)`` into the preallocated uint8 ``out`` (rows, row bytes) on the CPU."""
    if qtype in FLOAT_TYPES:
        _float_rows(x, qtype, out)
        return
    if not HAVE_NUMBA:  # pragma: no cover
        import torch

        from studio.core.quant import legacy_torch

        qw = None if imatrix is None else torch.from_numpy(imatrix)
        out[...] = legacy_torch.quantize_rows_torch(torch.from_numpy(x), qtype, qw).numpy()
        return
    if not (x.flags.c_contiguous and out.flags.c_contiguous and x.dtype == np.float32):
        raise ValueError("quantize_rows needs C-contiguous float32 input and uint8 output arrays")
    rows, n = x.shape
    bs, bsize = QTYPES[qtype].block_size, QTYPES[qtype].type_size
    nb = n // bs
    qw = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    if qtype == "Q8_0" or (qw is None and qtype in _PLAIN):
        _PLAIN[qtype](x, out)  # these write their fp16 scales themselves
        return
    dsc = np.empty((rows, nb), dtype=np.float32)
    if qtype in ("Q4_0", "Q5_0"):
        _k_qx_imatrix(x, qw, out, dsc, 8 if qtype == "Q4_0" else 16, bsize)
    elif qtype in ("Q4_1", "Q5_1"):
        msc = np.empty((rows, nb), dtype=np.float32)
        _k_qkx_imatrix(x, qw, out, dsc, msc, 15 if qtype == "Q4_1" else 31, bsize)
        _put_half_scales(out, msc, bsize, 2)
    elif qtype in ("IQ4_NL", "IQ4_XS"):
        sbs = 32 if qtype == "IQ4_NL" else 256
        has = qw is not None
        _k_iq4(x, qw if has else np.zeros(1, np.float32), has, out, dsc, sbs, _IQ4_F32)
    else:
        raise KeyError(qtype)
    _put_half_scales(out, dsc, bsize, 0)


# ----------------------------------------------------------------------------------------- decoding


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view("<f2").astype(np.float32).reshape(-1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    # qs (nb, 16) -> (nb, 32): element j is the low nibble of byte j, element j+16 the high one.
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def _high_bits(qh_bytes: np.ndarray) -> np.ndarray:
    qh = qh_bytes.copy().view("<u4")  # (nb, 1)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def dequantize_rows(data: np.ndarray, qtype: str, n_per_row: int) -> np.ndarray:
    """Decode uint8 ``(rows, row bytes)`` of ``qtype`` into float32 ``(rows, n_per_row)``."""
    rows = data.shape[0]
    if qtype == "F32":
        return data.copy().view("<f4").astype(np.float32).reshape(rows, n_per_row)
    if qtype == "F16":
        return data.copy().view("<f2").astype(np.float32).reshape(rows, n_per_row)
    if qtype == "BF16":
        u = data.copy().view("<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(rows, n_per_row)
    bsize = QTYPES[qtype].type_size
    b = np.ascontiguousarray(data).reshape(-1, bsize)
    d = _half(b, 0)[:, None]
    if qtype == "Q8_0":
        y = b[:, 2:].view(np.int8).astype(np.float32) * d
    elif qtype == "Q4_0":
        y = (_nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32) * d
    elif qtype == "Q4_1":
        y = _nibbles(b[:, 4:]).astype(np.float32) * d + _half(b, 2)[:, None]
    elif qtype == "Q5_0":
        q = _nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6]) << 4)
        y = (q.astype(np.int8) - np.int8(16)).astype(np.float32) * d
    elif qtype == "Q5_1":
        q = _nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8]) << 4)
        y = q.astype(np.float32) * d + _half(b, 2)[:, None]
    elif qtype == "IQ4_NL":
        y = d * _IQ4_F32[_nibbles(b[:, 2:])]
    elif qtype == "IQ4_XS":
        sh = b[:, 2:4].copy().view("<u2").astype(np.int32)  # (nb, 1)
        sl = b[:, 4:8].astype(np.int32)
        ib = np.arange(8)
        ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
        dl = d * (ls - 32).astype(np.float32)  # (nb, 8)
        q = _nibbles(b[:, 8:].reshape(-1, 16)).reshape(-1, 8, 32)
        y = dl[:, :, None] * _IQ4_F32[q]
    else:
        raise KeyError(qtype)
    return np.ascontiguousarray(y, dtype=np.float32).reshape(rows, n_per_row)
