"""Torch K-quants (Q2_K..Q6_K) for CPU, CUDA and MPS, giving the bytes of llama.cpp.

Same algorithm as ``kquants`` (ggml's reference quantizers), vectorized across groups: the data
is laid out position-major, (positions, groups), so that every per-group sum is a loop over the
positions where each step is one elementwise add over all groups, in the C order, with the
primitives of ``torch_ops``. Constants that C computes in float32 (``rmin + rdelta*step + nmax``)
are computed in float32 on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from studio.core.quant.torch_ops import EPS, div, fp16, nearest_int, qx_search, seq_sum, sqrt
from studio.core.quant.types import QK_K, QTYPES, k4_scales, row_bytes

__all__ = ["dequantize_rows_torch", "quantize_rows_torch"]

_F = np.float32
_KQUANTS = tuple(n for n, i in QTYPES.items() if i.kquant)


def _u8(t: torch.Tensor) -> torch.Tensor:
    return (t & 0xFF).to(torch.uint8)


# --------------------------------------------------------------------------- searches


def _affine(xt, wt, nmax, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants / make_qkx3_quants over groups: xt, wt (n, G) -> (L (n, G), scale, -min)."""
    n = xt.shape[0]
    fmin = xt[0].clone()
    fmax = xt[0].clone()
    sum_w = wt[0].clone()
    sum_x = sum_w * xt[0]
    for i in range(1, n):
        v = xt[i]
        fmin = torch.where(v < fmin, v, fmin)
        fmax = torch.where(v > fmax, v, fmax)
        sum_w = sum_w + wt[i]
        sum_x = sum_x + wt[i] * v
    zero = torch.zeros_like(fmin)
    fmin = torch.where(fmin > 0, zero, fmin)
    min0 = fmin
    iscale = div(float(nmax), fmax - fmin)
    scale = div(1.0, iscale)

    def err(a, fl, b):
        diff = a * fl + b - xt
        diff = diff.abs() if use_mad else diff * diff
        return seq_sum(wt * diff)

    fl = torch.clamp(nearest_int(iscale * (xt - fmin)), 0, nmax).to(torch.float32)
    best = err(scale, fl, fmin)
    best_is = iscale
    best_min = fmin
    for step in range(nstep + 1):
        c = _F(rmin) + _F(rdelta) * _F(step) + _F(nmax)
        isc = div(float(c), fmax - fmin)
        fl = torch.clamp(nearest_int(isc * (xt - fmin)), 0, nmax).to(torch.float32)
        wl = wt * fl
        sl = seq_sum(wl)
        sl2 = seq_sum(wl * fl)
        sxl = seq_sum(wl * xt)
        D = sum_w * sl2 - sl * sl
        a = div(sum_w * sxl - sum_x * sl, D)
        b = div(sl2 * sum_x - sl * sxl, D)
        pos = b > 0
        a = torch.where(pos, div(sxl, sl2), a)
        b = torch.where(pos, zero, b)
        cur = err(a, fl, b)
        better = (D > 0) & (cur < best)
        best = torch.where(better, cur, best)
        scale = torch.where(better, a, scale)
        best_is = torch.where(better, isc, best_is)
        best_min = torch.where(better, fmin, best_min)
        fmin = torch.where(better, b, fmin)
    # the best step's levels, recomputed from its range (C copies the same values)
    L = torch.clamp(nearest_int(best_is * (xt - best_min)), 0, nmax)
    flat = ~(fmax > min0)
    L = torch.where(flat, torch.zeros_like(L), L)
    return L, torch.where(flat, zero, scale), torch.where(flat, -min0, -fmin)


def _signed_absmax(xt):
    """Per group (column): the largest |x| and the first value that has it, as C's scan finds it."""
    amax = torch.zeros_like(xt[0])
    fmax = torch.zeros_like(xt[0])
    for i in range(xt.shape[0]):
        ax = xt[i].abs()
        upd = ax > amax
        fmax = torch.where(upd, xt[i], fmax)
        amax = torch.where(upd, ax, amax)
    return amax, fmax


def _positive_max(v):
    """Per row: the largest value, or 0.0 when none is positive (C's loop starts from 0)."""
    m = torch.zeros_like(v[:, 0])
    for j in range(v.shape[1]):
        m = torch.where(v[:, j] > m, v[:, j], m)
    return m


def _symmetric(xt, wt, nmax):
    """make_qx_quants (rmse_type 1) over groups: xt, wt (n, G) -> (L 0..2nmax-1, scale)."""
    amax, fmax = _signed_absmax(xt)
    wx = wt * xt

    def trial(c):
        isc = div(c, fmax)
        fl = torch.clamp(nearest_int(isc * xt), -nmax, nmax - 1).to(torch.float32)
        return isc, seq_sum(wx * fl), seq_sum(wt * fl * fl)

    best_is, scale = qx_search(trial, nmax)
    zero = torch.zeros_like(scale)
    L = torch.clamp(nearest_int(best_is * xt), -nmax, nmax - 1) + nmax
    small = amax < EPS
    L = torch.where(small, torch.zeros_like(L), L)
    return L, torch.where(small, zero, scale)


def _q3_search(xt, nmax):
    """make_q3_quants with do_rmse over groups: xt (n, G) -> (L 0..2nmax-1, scale)."""
    n = xt.shape[0]
    amax, fmax = _signed_absmax(xt)
    iscale = div(float(-nmax), fmax)
    L = torch.clamp(nearest_int(iscale * xt), -nmax, nmax - 1)
    w = xt * xt
    wx = w * xt
    fl = L.to(torch.float32)
    sumlx = seq_sum(wx * fl)
    suml2 = seq_sum(w * fl * fl)
    rows = list(L.unbind(0))
    # Five greedy passes; a group whose pass changed nothing is left alone by C (it stops),
    # and running the pass again on it changes nothing either.
    for _ in range(5):
        for i in range(n):
            fo = rows[i].to(torch.float32)
            slx = sumlx - wx[i] * fo
            sl2 = suml2 - w[i] * fo * fo
            nl = torch.clamp(nearest_int(div(xt[i] * sl2, slx)), -nmax, nmax - 1)
            fn = nl.to(torch.float32)
            slx2 = slx + wx[i] * fn
            sl22 = sl2 + w[i] * fn * fn
            take = (slx > 0) & (nl != rows[i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            rows[i] = torch.where(take, nl, rows[i])
            sumlx = torch.where(take, slx2, sumlx)
            suml2 = torch.where(take, sl22, suml2)
    L = torch.stack(rows) + nmax
    small = amax < EPS
    L = torch.where(small, torch.zeros_like(L), L)
    scale = torch.where(suml2 > 0, div(sumlx, suml2), torch.zeros_like(sumlx))
    return L, torch.where(small, torch.zeros_like(scale), scale)


def _positive(xs, qw, nmax):
    """make_qp_quants over blocks: xs, qw (n, B) -> (L as uint8 values 0..255, scale)."""
    n = xs.shape[0]
    fmax = torch.zeros_like(xs[0])
    for i in range(n):
        fmax = torch.where(fmax > xs[i], fmax, xs[i])
    small = fmax < EPS
    iscale = div(float(nmax), fmax)
    scale = div(1.0, iscale)
    L0 = nearest_int(iscale * xs) & 0xFF
    d = xs - scale * L0.to(torch.float32)
    best = seq_sum(qw * d * d)
    for step in range(-4, 5):
        if step == 0:
            continue
        isc = div(float(_F(0.1) * _F(step) + _F(nmax)), fmax)
        sc = div(1.0, isc)
        li = torch.clamp(nearest_int(isc * xs), max=nmax)
        d = xs - sc * li.to(torch.float32)
        mse = seq_sum(qw * d * d)
        better = mse < best
        best = torch.where(better, mse, best)
        iscale = torch.where(better, isc, iscale)
    li = torch.clamp(nearest_int(iscale * xs), max=nmax)
    fl = li.to(torch.float32)
    wx = qw * xs
    sumlx = seq_sum(wx * fl)
    suml2 = seq_sum(qw * fl * fl)
    rows = list((li & 0xFF).unbind(0))
    for _ in range(5):
        for i in range(n):
            fo = rows[i].to(torch.float32)
            slx = sumlx - wx[i] * fo
            sl2 = suml2 - qw[i] * fo * fo
            nl = torch.clamp(nearest_int(div(xs[i] * sl2, slx)), max=nmax)
            fn = nl.to(torch.float32)
            slx2 = slx + wx[i] * fn
            sl22 = sl2 + qw[i] * fn * fn
            take = (slx > 0) & (sl2 > 0) & (nl != rows[i]) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            rows[i] = torch.where(take, nl & 0xFF, rows[i])
            sumlx = torch.where(take, slx2, sumlx)
            suml2 = torch.where(take, sl22, suml2)
    L = torch.stack(rows)
    zero = torch.zeros_like(sumlx)
    scale = torch.where(suml2 > 0, div(sumlx, suml2), zero)
    return torch.where(small, torch.zeros_like(L), L), torch.where(small, zero, scale)


# --------------------------------------------------------------------------- helpers


def _groups(x: torch.Tensor, size: int) -> torch.Tensor:
    """(rows, n) -> position-major (size, groups) with groups in row-major order."""
    return x.reshape(-1, size).t().contiguous()


def _imatrix_sigma2(x: torch.Tensor, twice: bool) -> torch.Tensor:
    # sum of x² over each 256-block, sequential; then (2*)sum/256 as in ggml
    xb = x.reshape(-1, QK_K).t()
    s = seq_sum(xb * xb)
    if twice:
        s = s * 2.0
    return div(s, float(QK_K))


def _imatrix_weights(x, qw, gs, twice):
    # qw[col] * sqrt(sigma2_block + x²), position-major (gs, groups)
    rows, n = x.shape
    sigma2 = _imatrix_sigma2(x, twice)  # (rows*nb,)
    s = sigma2.repeat_interleave(QK_K // gs)  # per group
    xt = _groups(x, gs)
    q = _groups(qw.reshape(1, n).expand(rows, n), gs)
    return q * sqrt(s[None, :] + xt * xt)


def _blocks_of(t: torch.Tensor, per: int) -> torch.Tensor:
    """Per-group values (G,) or (n, G) -> per-block (per, B) position-major."""
    return t.reshape(-1, per).t()


def _levels_by_block(L: torch.Tensor, gs: int) -> torch.Tensor:
    # position-major group levels (gs, G) -> (B, 256) in weight order
    return L.t().reshape(-1, QK_K)


def _pack_k4_scales(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    # ls, lm (B, 8) int values 0..255 as uint8 in C -> (B, 12) bytes
    lo = torch.cat([ls[:, :4], lm[:, :4], (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)], dim=1)
    hi_s = ((ls[:, 4:] >> 4) << 6) & 0xFF
    hi_m = ((lm[:, 4:] >> 4) << 6) & 0xFF
    top = torch.cat([hi_s, hi_m, torch.zeros_like(hi_s)], dim=1)
    return _u8(lo | top)


def _unpack_k4_scales(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return k4_scales(sc.to(torch.int32), torch.cat)


def _pack_2bit(L: torch.Tensor) -> torch.Tensor:
    # (B, 256) levels 0..3 -> (B, 64): byte 32h+l holds positions 128h+l+32k at bits 2k
    q = L.reshape(-1, 2, 4, 32)
    b = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return _u8(b.reshape(-1, 64))


def _pack_q3_scales(lv6: torch.Tensor) -> torch.Tensor:
    # (B, 16) values 0..63 -> (B, 12)
    lo = (lv6[:, :8] & 0xF) | ((lv6[:, 8:] & 0xF) << 4)
    h = (lv6 >> 4) & 3  # (B, 16); scale j -> byte 8 + j%4, shift 2*(j//4)
    hb = h.reshape(-1, 4, 4)
    hi = hb[:, 0] | (hb[:, 1] << 2) | (hb[:, 2] << 4) | (hb[:, 3] << 6)
    return _u8(torch.cat([lo, hi], dim=1))


def _unpack_q3_scales(sc: torch.Tensor) -> torch.Tensor:
    s = sc.to(torch.int32)
    lo = torch.cat([s[:, :8] & 0xF, s[:, :8] >> 4], dim=1)
    hb = s[:, 8:12]
    hi = torch.cat([(hb >> (2 * k)) & 3 for k in range(4)], dim=1)
    return (lo | (hi << 4)) - 32


def _requant(x_b, d, m, lo, hi, gs):
    # (B, 256) weights, per-group scale d and offset m (B, 256/gs): nearest((x + m)/d) clamped;
    # groups with d == 0 keep the search levels (C's `continue`).
    dd = d.repeat_interleave(gs, dim=1)
    xm = x_b if m is None else x_b + m.repeat_interleave(gs, dim=1)
    return torch.clamp(nearest_int(div(xm, dd)), lo, hi), dd == 0


# --------------------------------------------------------------------------- types


def _q45k(x, qw, nmax):
    rows, n = x.shape
    xt = _groups(x, 32)
    if qw is not None:
        wt = _imatrix_weights(x, qw, 32, True)
        L, sc, mn = _affine(xt, wt, nmax, -0.9, 0.05, 36, False)
        sw = seq_sum(wt)
        ls, d_block = _positive(_blocks_of(sc, 8), _blocks_of(sw, 8), 63)
        lm, m_block = _positive(_blocks_of(mn, 8), _blocks_of(sw, 8), 63)
        ls, lm = ls.t(), lm.t()
        if nmax == 31:
            ls, lm = ls.clamp(max=63), lm.clamp(max=63)
    else:
        av = sqrt(div(seq_sum(xt * xt), 32.0))
        wt = av[None, :] + xt.abs()
        rmin, nstep = (-1.0, 20) if nmax == 15 else (-0.5, 15)
        L, sc, mn = _affine(xt, wt, nmax, rmin, 0.1, nstep, False)
        scb, mnb = sc.reshape(-1, 8), mn.reshape(-1, 8)
        max_scale, max_min = _positive_max(scb), _positive_max(mnb)
        zero = torch.zeros_like(max_scale)
        inv_s = torch.where(max_scale > 0, div(63.0, max_scale), zero)
        inv_m = torch.where(max_min > 0, div(63.0, max_min), zero)
        ls = (nearest_int(inv_s[:, None] * scb) & 0xFF).clamp(max=63)
        lm = (nearest_int(inv_m[:, None] * mnb) & 0xFF).clamp(max=63)
        d_block = div(max_scale, 63.0)
        m_block = div(max_min, 63.0)
    scales = _pack_k4_scales(ls, lm)
    dbytes, dd = fp16(d_block)
    mbytes, dm = fp16(m_block)
    s6, m6 = _unpack_k4_scales(scales)
    d = dd[:, None] * s6.to(torch.float32)
    m = dm[:, None] * m6.to(torch.float32)
    Lb = _levels_by_block(L, 32)
    xb = x.reshape(-1, QK_K)
    q, keep = _requant(xb, d, m, 0, nmax, 32)
    Lb = torch.where(keep, Lb, q)
    c = Lb.reshape(-1, 4, 2, 32)
    if nmax == 15:
        qs = _u8((c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128))
        parts = [dbytes, mbytes, scales, qs]
    else:
        qs = _u8(((c[:, :, 0] & 0xF) | ((c[:, :, 1] & 0xF) << 4)).reshape(-1, 128))
        hb = c >> 4  # (B, 4, 2, 32): bit 2c+k of qh[l]
        qh = torch.zeros_like(hb[:, 0, 0])
        for ci in range(4):
            qh = qh | (hb[:, ci, 0] << (2 * ci)) | (hb[:, ci, 1] << (2 * ci + 1))
        parts = [dbytes, mbytes, scales, _u8(qh), qs]
    return torch.cat(parts, dim=1)


def _q6k(x, qw):
    xt = _groups(x, 16)
    wt = _groups(qw.reshape(1, -1).expand(x.shape[0], -1), 16) if qw is not None else xt * xt
    L, sc = _symmetric(xt, wt, 32)
    scb = sc.reshape(-1, 16)
    max_abs, max_scale = _signed_absmax(scb.t())  # over each block's 16 scales
    empty = max_abs < EPS
    safe = torch.where(empty, torch.ones_like(max_scale), max_scale)
    iscale = div(-128.0, safe)
    dbytes, dd = fp16(div(1.0, iscale))
    s8 = torch.clamp(nearest_int(iscale[:, None] * scb), max=127)
    s8 = ((s8 + 128) & 0xFF) - 128  # int8 storage
    d = dd[:, None] * s8.to(torch.float32)
    Lb = _levels_by_block(L, 16)
    q, keep = _requant(x.reshape(-1, QK_K), d, None, -32, 31, 16)
    Lb = torch.where(keep, Lb, q + 32)
    c = Lb.reshape(-1, 2, 4, 32)
    ql = torch.cat(
        [(c[:, :, 0] & 0xF) | ((c[:, :, 2] & 0xF) << 4), (c[:, :, 1] & 0xF) | ((c[:, :, 3] & 0xF) << 4)], 2
    )
    qh = (c[:, :, 0] >> 4) | ((c[:, :, 1] >> 4) << 2) | ((c[:, :, 2] >> 4) << 4) | ((c[:, :, 3] >> 4) << 6)
    blk = torch.cat([_u8(ql.reshape(-1, 128)), _u8(qh.reshape(-1, 64)), _u8(s8), dbytes], dim=1)
    return torch.where(empty[:, None], torch.zeros_like(blk), blk)


def _q3k(x, qw):
    xt = _groups(x, 16)
    if qw is not None:
        wt = _imatrix_weights(x, qw, 16, True)
        L, sc = _symmetric(xt, wt, 4)
        sw = seq_sum(wt)
        ls, d_block = _symmetric(_blocks_of(sc, 16), _blocks_of(sw, 16), 32)
        ls = ls.t()
        scales = _pack_q3_scales(ls)
        dbytes, dd = fp16(d_block)
    else:
        L, sc = _q3_search(xt, 4)
        scb = sc.reshape(-1, 16)
        _, max_scale = _signed_absmax(scb.t())
        zero = torch.zeros_like(max_scale)
        nz = max_scale != 0
        iscale = div(-32.0, torch.where(nz, max_scale, torch.ones_like(max_scale)))
        lv = nearest_int(iscale[:, None] * scb) & 0xFF
        lv = ((lv + 128) & 0xFF) - 128  # int8_t l
        lv = torch.clamp(lv, -32, 31) + 32
        lv = torch.where(nz[:, None], lv, torch.zeros_like(lv))
        scales = _pack_q3_scales(lv)
        dbytes, dd = fp16(torch.where(nz, div(1.0, iscale), zero))
    d = dd[:, None] * _unpack_q3_scales(scales).to(torch.float32)
    Lb = _levels_by_block(L, 16)
    q, keep = _requant(x.reshape(-1, QK_K), d, None, -4, 3, 16)
    Lb = torch.where(keep, Lb, q + 4)
    high = (Lb > 3).to(torch.int32)
    Lb = Lb - 4 * high
    hm = high.reshape(-1, 8, 32)
    hmask = torch.zeros_like(hm[:, 0])
    for k in range(8):
        hmask = hmask | (hm[:, k] << k)
    return torch.cat([_u8(hmask), _pack_2bit(Lb), scales, dbytes], dim=1)


def _q2k(x, qw):
    xt = _groups(x, 16)
    if qw is not None:
        wt = _imatrix_weights(x, qw, 16, False)
        L, sc, mn = _affine(xt, wt, 3, -0.9, 0.05, 36, False)
        sw = seq_sum(wt)
        ls, dm = _positive(_blocks_of(sc, 16), _blocks_of(sw, 16), 15)
        lm, mm = _positive(_blocks_of(mn, 16), _blocks_of(sw, 16), 15)
        dbytes, dd = fp16(dm)
        mbytes, dmin = fp16(mm)
        sbytes = (ls.t() | (lm.t() << 4)) & 0xFF
    else:
        L, sc, mn = _affine(xt, xt.abs(), 3, -0.5, 0.1, 15, True)
        scb, mnb = sc.reshape(-1, 16), mn.reshape(-1, 16)
        max_scale, max_min = _positive_max(scb), _positive_max(mnb)
        zero = torch.zeros_like(max_scale)
        ps, pm = max_scale > 0, max_min > 0
        one = torch.ones_like(zero)
        ls = nearest_int(div(15.0, torch.where(ps, max_scale, one))[:, None] * scb) & 0xFF
        ls = torch.where(ps[:, None], ls, torch.zeros_like(ls))
        lm = nearest_int(div(15.0, torch.where(pm, max_min, one))[:, None] * mnb)
        sbytes = torch.where(pm[:, None], (ls | (lm << 4)) & 0xFF, ls)
        dbytes, dd = fp16(torch.where(ps, div(max_scale, 15.0), zero))
        mbytes, dmin = fp16(torch.where(pm, div(max_min, 15.0), zero))
    d = dd[:, None] * (sbytes & 0xF).to(torch.float32)
    m = dmin[:, None] * (sbytes >> 4).to(torch.float32)
    Lb = _levels_by_block(L, 16)
    q, keep = _requant(x.reshape(-1, QK_K), d, m, 0, 3, 16)
    Lb = torch.where(keep, Lb, q)
    return torch.cat([_u8(sbytes), _pack_2bit(Lb), dbytes, mbytes], dim=1)


def quantize_rows_torch(x: torch.Tensor, qtype: str, imatrix: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize float32 rows (rows, n_per_row) on x's device; uint8 (rows, row bytes), llama.cpp's bytes."""
    if qtype not in _KQUANTS:
        raise ValueError(f"{qtype} is not a K-quant type; expected one of {', '.join(_KQUANTS)}")
    if x.dim() != 2 or x.shape[1] % QK_K or x.shape[1] == 0:
        raise ValueError(f"{qtype} needs 2-D rows whose length is a multiple of {QK_K}, got {tuple(x.shape)}")
    rows, n = x.shape
    x = x.detach().to(torch.float32).contiguous()
    qw = None
    if imatrix is not None:
        qw = imatrix.detach().to(device=x.device, dtype=torch.float32).reshape(-1).contiguous()
        if qw.numel() != n:
            raise ValueError(f"imatrix has {qw.numel()} weights but rows have {n} columns")
    if rows == 0:
        return torch.empty((0, row_bytes(qtype, n)), dtype=torch.uint8, device=x.device)
    if qtype == "Q4_K":
        blk = _q45k(x, qw, 15)
    elif qtype == "Q5_K":
        blk = _q45k(x, qw, 31)
    elif qtype == "Q6_K":
        blk = _q6k(x, qw)
    elif qtype == "Q3_K":
        blk = _q3k(x, qw)
    else:
        blk = _q2k(x, qw)
    return blk.reshape(rows, -1).contiguous()


def dequantize_rows_torch(data: torch.Tensor, qtype: str, n_per_row: int) -> torch.Tensor:
    """Decode K-quant rows (rows, row bytes) on data's device to float32 (rows, n_per_row)."""
    if qtype not in _KQUANTS:
        raise ValueError(f"{qtype} is not a K-quant type; expected one of {', '.join(_KQUANTS)}")
    rows = data.shape[0]
    b = data.reshape(-1, QTYPES[qtype].type_size).to(torch.int32)

    def half(o):
        h = (b[:, o] | (b[:, o + 1] << 8)).to(torch.int16)
        return h.view(torch.float16).to(torch.float32)[:, None]

    if qtype in ("Q4_K", "Q5_K"):
        d, dmin = half(0), half(2)
        s6, m6 = _unpack_k4_scales(b[:, 4:16])
        ds = d * s6.to(torch.float32)
        ms = dmin * m6.to(torch.float32)
        if qtype == "Q4_K":
            qs = b[:, 16:144].reshape(-1, 4, 32)
            q = torch.stack([qs & 0xF, qs >> 4], dim=2)
        else:
            qs = b[:, 48:176].reshape(-1, 4, 32)
            qh = b[:, 16:48]
            hi = torch.stack(
                [torch.stack([(qh >> (2 * c)) & 1, (qh >> (2 * c + 1)) & 1], 1) for c in range(4)], 1
            )
            q = torch.stack([qs & 0xF, qs >> 4], dim=2) + 16 * hi
        y = ds[:, :, None] * q.reshape(-1, 8, 32).to(torch.float32) - ms[:, :, None]
    elif qtype == "Q6_K":
        d = half(208)
        ql = b[:, :128].reshape(-1, 2, 64)
        qh = b[:, 128:192].reshape(-1, 2, 32)
        sc = b[:, 192:208]
        sc = ((sc + 128) & 0xFF) - 128
        q = (
            torch.stack(
                [
                    (ql[:, :, :32] & 0xF) | ((qh & 3) << 4),
                    (ql[:, :, 32:] & 0xF) | (((qh >> 2) & 3) << 4),
                    (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4),
                    (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4),
                ],
                dim=2,
            )
            - 32
        )  # (B, 2, 4, 32)
        y = (d * sc.to(torch.float32))[:, :, None] * q.reshape(-1, 16, 16).to(torch.float32)
    elif qtype == "Q3_K":
        d = half(108)
        dl = d * _unpack_q3_scales(b[:, 96:108]).to(torch.float32)
        qs = b[:, 32:96].reshape(-1, 2, 1, 32)
        hm = b[:, :32].reshape(-1, 1, 1, 32)
        j = torch.arange(4, device=b.device).reshape(1, 1, 4, 1)
        low = (qs >> (2 * j)) & 3  # (B, 2, 4, 32)
        hbit = (hm >> (torch.arange(2, device=b.device).reshape(1, 2, 1, 1) * 4 + j)) & 1
        q = low - 4 * (1 - hbit)
        y = dl[:, :, None] * q.reshape(-1, 16, 16).to(torch.float32)
    else:
        d, dmin = half(80), half(82)
        sc = b[:, :16]
        dl = d * (sc & 0xF).to(torch.float32)
        ml = dmin * (sc >> 4).to(torch.float32)
        qs = b[:, 16:80].reshape(-1, 2, 1, 32)
        j = torch.arange(4, device=b.device).reshape(1, 1, 4, 1)
        q = (qs >> (2 * j)) & 3
        y = dl[:, :, None] * q.reshape(-1, 16, 16).to(torch.float32) - ml[:, :, None]
    return y.reshape(rows, n_per_row)
