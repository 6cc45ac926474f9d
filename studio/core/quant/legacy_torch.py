"""Torch versions of the 32-value block formats, IQ4_XS and the float types, for CPU, CUDA and MPS.

The arithmetic is the float32 arithmetic of llama.cpp's ggml-quants.c, vectorized across blocks:
each per-block sum is a loop over the 32 positions where every step is one tensor operation over all
blocks, so values are added in the C order, with the primitives of ``torch_ops``.
"""

from __future__ import annotations

import numpy as np
import torch

from studio.core.quant.torch_ops import (
    EPS,
    div,
    f32,
    fp16_bytes,
    nearest_int,
    qx_search,
    seq_sum,
    sqrt,
)
from studio.core.quant.types import IQ4NL_LEVELS, row_bytes

__all__ = ["quantize_rows_torch"]

_IQ4 = IQ4NL_LEVELS.tolist()


def _first_absmax(xb: torch.Tensor):
    # (amax, signed value) of the first element with the largest |x|; +0.0 when all are zero (C starts at 0).
    ax = xb.abs()
    idx = ax.argmax(dim=-1, keepdim=True)
    amax = ax.gather(-1, idx).squeeze(-1)
    mx = xb.gather(-1, idx).squeeze(-1)
    return amax, torch.where(amax == 0, torch.zeros_like(mx), mx)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    q = q.to(torch.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _pack_qh(q: torch.Tensor) -> torch.Tensor:
    bits = ((q.to(torch.int64) >> 4) & 1) << torch.arange(32, device=q.device, dtype=torch.int64)
    qh = bits.sum(dim=1, keepdim=True)  # distinct bits: an exact integer sum
    shifts = torch.arange(0, 32, 8, device=q.device, dtype=torch.int64)
    return ((qh >> shifts) & 255).to(torch.uint8)


def _row_sigma2(x: torch.Tensor) -> torch.Tensor:
    return div(seq_sum(x * x, -1), float(x.shape[1]))


def _imatrix_weights(x: torch.Tensor, qw: torch.Tensor) -> torch.Tensor:
    sigma2 = _row_sigma2(x)
    return qw[None, :] * sqrt(sigma2[:, None] + x * x)


def _make_qx(xb: torch.Tensor, w: torch.Tensor, nmax: int):
    """make_qx_quants(32, nmax, rmse_type=1, weights) over all blocks -> (levels 0..2nmax-1, scale)."""
    amax, mx = _first_absmax(xb)
    zero = amax < EPS
    mxs = torch.where(zero, torch.ones_like(mx), mx)
    wx = w * xb

    def trial(num: float):
        iscale = div(num, mxs)
        lv = nearest_int(iscale[:, None] * xb).clamp(-nmax, nmax - 1)
        fl = lv.to(torch.float32)
        return lv, seq_sum(wx * fl, -1), seq_sum(w * fl * fl, -1)

    L, scale = qx_search(trial, nmax)
    zf = torch.zeros_like(scale)
    L = torch.where(zero[:, None], torch.full_like(L, -nmax), L) + nmax
    return L, torch.where(zero, zf, scale)


def _make_qkx3(xb: torch.Tensor, w: torch.Tensor, nmax: int):
    """make_qkx3_quants(32, nmax, -0.9, 0.05, 36) over all blocks -> (levels, scale, min)."""
    mn = xb.gather(1, xb.argmin(dim=1, keepdim=True)).squeeze(1)
    mx = xb.gather(1, xb.argmax(dim=1, keepdim=True)).squeeze(1)
    sum_w = seq_sum(w, -1, from_first=True)
    sum_x = seq_sum(w * xb, -1, from_first=True)
    zf = torch.zeros_like(mn)
    mn = torch.where(mn > 0, zf, mn)
    deg = mx <= mn
    one = torch.ones_like(mn)

    def rng():
        return torch.where(deg, one, mx - mn)

    iscale = div(float(nmax), rng())
    scale = div(one, iscale)
    L = nearest_int(iscale[:, None] * (xb - mn[:, None])).clamp(0, nmax)
    diff = scale[:, None] * L.to(torch.float32) + mn[:, None] - xb
    best_mad = seq_sum(w * (diff * diff), -1)
    for step in range(37):
        c = np.float32(-0.9) + np.float32(0.05) * np.float32(step) + np.float32(nmax)
        iscale = div(float(c), rng())
        la = nearest_int(iscale[:, None] * (xb - mn[:, None])).clamp(0, nmax)
        fl = la.to(torch.float32)
        wl = w * fl
        sum_l = seq_sum(wl, -1)
        sum_l2 = seq_sum(wl * fl, -1)
        sum_xl = seq_sum(wl * xb, -1)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = (D > 0) & ~deg
        Ds = torch.where(ok, D, one)
        this_scale = div(sum_w * sum_xl - sum_x * sum_l, Ds)
        this_min = div(sum_l2 * sum_x - sum_l * sum_xl, Ds)
        pos = this_min > 0
        this_min = torch.where(pos, zf, this_min)
        l2s = torch.where(sum_l2 != 0, sum_l2, one)
        this_scale = torch.where(pos, div(sum_xl, l2s), this_scale)
        diff = this_scale[:, None] * fl + this_min[:, None] - xb
        mad = seq_sum(w * (diff * diff), -1)
        upd = ok & (mad < best_mad)
        L = torch.where(upd[:, None], la, L)
        best_mad = torch.where(upd, mad, best_mad)
        scale = torch.where(upd, this_scale, scale)
        mn = torch.where(upd, this_min, mn)
    L = torch.where(deg[:, None], torch.zeros_like(L), L)
    return L, torch.where(deg, zf, scale), mn


def _best_index(v: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    # best_index_int8: nearest level, ties to the upper one; ends clamp.
    cnt = torch.searchsorted(vals, v.contiguous(), right=True)
    mu = cnt.clamp(1, 15)
    lo = vals[mu - 1]
    hi = vals[mu]
    idx = torch.where((v - lo) < (hi - v), mu - 1, mu)
    idx = torch.where(v <= vals[0], torch.zeros_like(idx), idx)
    return torch.where(v >= vals[15], torch.full_like(idx, 15), idx)


def _iq4(x: torch.Tensor, qw: torch.Tensor | None, sbs: int) -> torch.Tensor:
    rows, n = x.shape
    vals = torch.tensor(_IQ4, dtype=torch.float32, device=x.device)
    xs = x.reshape(-1, sbs)  # super-blocks
    nsup = xs.shape[0]
    nsub = sbs // 32
    sig = seq_sum(xs * xs, -1) * f32(2.0 / sbs)  # sigma2 *= 2/sbs (a power of two: exact)
    xb = xs.reshape(-1, 32)
    if qw is not None:
        sig_b = sig.repeat_interleave(nsub)
        w = qw.reshape(1, -1, 32).expand(rows, -1, -1).reshape(-1, 32) * sqrt(sig_b[:, None] + xb * xb)
    else:
        w = xb * xb
    amax, mx = _first_absmax(xb)
    skip = amax < EPS
    mxs = torch.where(skip, torch.ones_like(mx), mx)

    def trial(inv: torch.Tensor):
        li = _best_index(inv[:, None] * xb, vals)
        q = vals[li]
        wq = w * q
        return li, seq_sum(wq * xb, -1), seq_sum(wq * q, -1)

    inv0 = div(torch.ones_like(mxs), div(-mxs, -127.0))
    _, sumqx, sumq2 = trial(inv0)
    zf = torch.zeros_like(sumqx)
    d = torch.where(sumq2 > 0, div(sumqx, torch.where(sumq2 > 0, sumq2, torch.ones_like(sumq2))), zf)
    best = d * sumqx
    for itry in range(-7, 8):
        _, sumqx, sumq2 = trial(div(float(itry - 127), mxs))
        upd = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = torch.where(upd, div(sumqx, torch.where(upd, sumq2, torch.ones_like(sumq2))), d)
        best = torch.where(upd, d * sumqx, best)
    scales = torch.where(skip, zf, d)
    if nsub == 1:
        inv = torch.where(
            scales != 0, div(torch.ones_like(scales), torch.where(scales != 0, scales, 1.0)), zf
        )
        L = _best_index(inv[:, None] * xb, vals)
        head = fp16_bytes(scales)
        return torch.cat([head, _pack_nibbles(L)], dim=1).reshape(rows, -1)
    sc = scales.reshape(nsup, nsub)
    # C's "if (fabsf(d) > amax_scale)" never picks a NaN scale (from overflowing input); argmax would.
    asc = torch.where(torch.isnan(sc), torch.full_like(sc, -1.0), sc.abs())
    pick = asc.argmax(dim=1, keepdim=True)
    amax_s = asc.gather(1, pick).squeeze(1)
    max_s = torch.where(amax_s > 0, sc.gather(1, pick).squeeze(1), torch.zeros_like(amax_s))
    dd = div(-max_s, 32.0)
    zs = torch.zeros_like(dd)
    inv = torch.where(dd != 0, div(torch.ones_like(dd), torch.where(dd != 0, dd, 1.0)), zs)
    lv = nearest_int(inv[:, None] * sc).clamp(-32, 31)
    dl = (dd[:, None] * lv.to(torch.float32)).reshape(-1)
    zl = torch.zeros_like(dl)
    idl = torch.where(dl != 0, div(torch.ones_like(dl), torch.where(dl != 0, dl, 1.0)), zl)
    L = _best_index(idl[:, None] * xb, vals)
    ls = (lv + 32).to(torch.int64)
    sl = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).to(torch.uint8)
    sh = ((ls >> 4) << (2 * torch.arange(nsub, device=x.device, dtype=torch.int64))).sum(dim=1, keepdim=True)
    shb = torch.cat([sh & 255, (sh >> 8) & 255], dim=1).to(torch.uint8)
    qs = _pack_nibbles(L).reshape(nsup, -1)
    return torch.cat([fp16_bytes(dd), shb, sl, qs], dim=1).reshape(rows, -1)


def quantize_rows_torch(x: torch.Tensor, qtype: str, imatrix: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize float32 ``(rows, n)`` on its device; returns uint8 ``(rows, row bytes)`` on that device."""
    x = x.to(torch.float32).contiguous()
    rows, n = x.shape
    if qtype == "F32":
        return x.view(torch.uint8).reshape(rows, n * 4)
    if qtype == "F16":
        return x.to(torch.float16).view(torch.uint8).reshape(rows, n * 2)
    if qtype == "BF16":
        return x.to(torch.bfloat16).view(torch.uint8).reshape(rows, n * 2)
    if rows == 0 or n == 0:
        return torch.empty((rows, row_bytes(qtype, n)), dtype=torch.uint8)
    qw = None if imatrix is None else imatrix.to(device=x.device, dtype=torch.float32).reshape(-1)
    if qtype in ("IQ4_NL", "IQ4_XS"):
        return _iq4(x, qw, 32 if qtype == "IQ4_NL" else 256)
    xb = x.reshape(-1, 32)
    if qtype == "Q8_0":
        amax = xb.abs().amax(dim=1)
        d = div(amax, 127.0)
        zf = torch.zeros_like(d)
        inv = torch.where(d != 0, div(torch.ones_like(d), torch.where(d != 0, d, 1.0)), zf)
        v = xb * inv[:, None]
        t = torch.trunc(v)
        f = v - t
        t = t + (f >= 0.5).to(torch.float32) - (f <= -0.5).to(torch.float32)
        q = t.to(torch.int32).to(torch.int8).view(torch.uint8)
        return torch.cat([fp16_bytes(d), q], dim=1).reshape(rows, -1)
    if qtype in ("Q4_0", "Q5_0"):
        half = 8 if qtype == "Q4_0" else 16
        if qw is None:
            _, mx = _first_absmax(xb)
            d = div(mx, -float(half))
            zf = torch.zeros_like(d)
            inv = torch.where(d != 0, div(torch.ones_like(d), torch.where(d != 0, d, 1.0)), zf)
            q = (xb * inv[:, None] + (half + 0.5)).to(torch.int32).clamp_max(2 * half - 1)
        else:
            w = _imatrix_weights(x, qw).reshape(-1, 32)
            q, d = _make_qx(xb, w, half)
        if qtype == "Q4_0":
            return torch.cat([fp16_bytes(d), _pack_nibbles(q)], dim=1).reshape(rows, -1)
        return torch.cat([fp16_bytes(d), _pack_qh(q), _pack_nibbles(q & 15)], dim=1).reshape(rows, -1)
    if qtype in ("Q4_1", "Q5_1"):
        top = 15 if qtype == "Q4_1" else 31
        if qw is None:
            mn = xb.gather(1, xb.argmin(dim=1, keepdim=True)).squeeze(1)
            mx = xb.gather(1, xb.argmax(dim=1, keepdim=True)).squeeze(1)
            d = div(mx - mn, float(top))
            zf = torch.zeros_like(d)
            inv = torch.where(d != 0, div(torch.ones_like(d), torch.where(d != 0, d, 1.0)), zf)
            q = ((xb - mn[:, None]) * inv[:, None] + 0.5).to(torch.int32)
            q = q.clamp_max(15) if top == 15 else q & 255
        else:
            w = _imatrix_weights(x, qw).reshape(-1, 32)
            q, d, mn = _make_qkx3(xb, w, top)
        head = torch.cat([fp16_bytes(d), fp16_bytes(mn)], dim=1)
        if qtype == "Q4_1":
            return torch.cat([head, _pack_nibbles(q)], dim=1).reshape(rows, -1)
        return torch.cat([head, _pack_qh(q), _pack_nibbles(q & 15)], dim=1).reshape(rows, -1)
    raise KeyError(qtype)
