"""Vector GPTQ (GPTVQ) onto the lattice i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S).

``gptq_lattice(w, h, qtype)`` keeps what llama.cpp's imatrix-weighted search writes as scales (the
fp16 super-block scale, the 3- or 4-bit sub-block scales, IQ1_S's per-32 delta sign) and chooses the
rest again, one group of 8 input columns at a time (the span of one 8-sign byte: one 8-dimensional
grid point, or two 4-dimensional ones for IQ3). With ``scales="arrival"`` (the default) the sweep runs
super-block by super-block (act-order: super-blocks by decreasing energy, then their groups), and each
super-block's scales are llama.cpp's search on its weights as the errors of the super-blocks before
left them (GPTQ's groups searched on arrival); with ``"float"``, on the float weights before the sweep.
The damping of the IQ2/IQ3 types is at least ``LATTICE_DAMP``. With ``"arrival"`` or ``refit``, after the sweep each super-block's fp16 scale is re-fitted
to its codes (least squares under ``H``, kept only where better; not IQ1_M, whose fp16 scale is spread
over the sub-block scale bits). Per group:

1. the group's current weights (rows × 8, already moved by the errors of earlier groups) are
   quantized jointly: per row the grid point (and signs; IQ1_M's delta sign too) nearest under the
   sub-block scale, the distance weighted per column by ``1 / U_jj²`` (``U`` the upper Cholesky factor
   of ``H⁻¹``: the imatrix ``H_jj`` given the columns already quantized, GPTQ's own metric). The signs
   are the weights' own; where the type stores 7 sign bits (even parity: IQ2_XXS, IQ2_XS, IQ3_XXS)
   and the count of negatives is odd, the cheapest coordinate is flipped, chosen jointly with the point;
2. the group's error goes forward through ``U`` column by column (GPTQ's update with the group's
   values fixed), in lazy batches, groups in order of decreasing ``H_dd`` (act-order keeps the 8
   columns of a group together, since they share a code).

The bytes are the search's with the point indices, sign bits and (IQ1_M) delta bits replaced: a
standard GGUF tensor of the same type and size, read back as gguf-py's dequantizer reads it (a
sub-block ggml left empty decodes to what the decoder sees in its slot, and GPTQ works with that).
The search runs in torch on the weight's device (CPU, CUDA, MPS): per group one (rows × 8) @ (8 ×
points) product and, for the parity types, a (rows × points × 8) minimum.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import gguf
import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jobs import JobContext, null_context
from studio.core.quant import iquants
from studio.core.quant.gptq import (
    FactorCache,
    GptqOptions,
    GptqResult,
    gptq_notes,
    gptq_start,
    inverse_factor,
    output_error_by_rows,
    working_hessian,
)
from studio.core.quant.types import QK_K

__all__ = ["LATTICE_TYPES", "LatticeCodes", "decode", "encode", "gptq_lattice", "unpack"]

LATTICE_TYPES: tuple[str, ...] = iquants.IQ_TYPES
# rows × n values of the scale refit's levels, weights and products at once (32 MB of float64)
_REFIT_BLOCK = 1 << 22
_PARITY = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS"})  # 7 stored sign bits, the 8th their parity
_DIM = {"IQ3_XXS": 4, "IQ3_S": 4}  # coordinates per grid point (8 for the others)
_BYTES = {"IQ2_XXS": 66, "IQ2_XS": 74, "IQ2_S": 82, "IQ3_XXS": 98, "IQ3_S": 110, "IQ1_S": 50, "IQ1_M": 56}
_DELTA = np.float32(0.125)
G = QK_K // 8  # sign groups (8 columns) per super-block
# the least damping of the lattice sweep: at 2-3 bits GPTQ over-fits the calibration Hessian; on the
# demo's ffn_down (IQ2_S, IQ3_XXS), output error on held-out prose over the imatrix search's went from
# 0.79 / 0.78 at 0.01 to 0.77 / 0.75 at 0.1 (while rising on the calibration text); "mean" damping only:
# the default "diag" damping (3.0) blends H with its diagonal far more
LATTICE_DAMP = 0.1
_DAMPED = frozenset({"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"})  # IQ1_S/IQ1_M: not measured


@cache
def table(qtype: str) -> np.ndarray:
    """The decoder's grid (points × coordinates, float32): gguf-py's, so values match its dequantizer."""
    cls = getattr(gguf.quants, qtype)
    cls.init_grid()
    t = np.array(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    t.setflags(write=False)
    return t


@dataclass(frozen=True, eq=False)
class LatticeCodes:
    """What a lattice tensor's bytes say, per super-block (``B`` = rows × super-blocks per row).

    A weight of sign group ``g`` (8 columns) decodes as ``scale[·, g] · table[idx] · sign`` (IQ2/IQ3)
    or ``scale[·, g] · (table[idx] ± 0.125)`` (IQ1, ``dneg``: the delta is negative).
    """

    qtype: str
    scale: np.ndarray  # float32 (B, 32)
    idx: np.ndarray  # int64 (B, points): 32, or 64 for IQ3 (two per sign group)
    neg: np.ndarray | None  # bool (B, 32, 8): negative coordinates (IQ2/IQ3)
    dneg: np.ndarray | None  # bool (B, 32) (IQ1)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at : at + 2]).view("<f2").astype(np.float32)[:, 0]


def _u16(b: np.ndarray, at: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at : at + 2 * count]).view("<u2").astype(np.int64)


def _u32(b: np.ndarray, at: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at : at + 4 * count]).view("<u4").astype(np.int64)


def _nib(b: np.ndarray, at: int, count: int) -> np.ndarray:
    """``count`` 4-bit fields, low nibble first, from byte ``at`` on."""
    k = np.arange(count)
    return (b[:, at + k // 2].astype(np.int64) >> (4 * (k % 2))) & 15


def _bits8(v: np.ndarray) -> np.ndarray:
    return ((v[..., None] >> np.arange(8)) & 1).astype(bool)


def _neg_of7(s7: np.ndarray) -> np.ndarray:
    """ksigns: 7 stored bits, the 8th their parity."""
    neg = _bits8(s7 & 127)
    neg[..., 7] = (neg[..., :7].sum(-1) % 2).astype(bool)
    return neg


def _sub(x: np.ndarray, per: int) -> np.ndarray:
    """Sub-block values (B, 256/(8·per)) spread to the 32 sign groups (``per`` groups each)."""
    return np.repeat(x, per, axis=1)


def unpack(data: np.ndarray, qtype: str, n: int) -> LatticeCodes:
    """The scales and codes of ``qtype`` bytes (rows × row bytes) of rows of ``n`` weights."""
    if qtype not in LATTICE_TYPES or n % QK_K:
        raise QuantizationError(f"{qtype} rows of {n} weights have no lattice codes.")
    b = np.ascontiguousarray(np.asarray(data, np.uint8)).reshape(-1, _BYTES[qtype])
    f = np.float32
    neg = dneg = None
    if qtype == "IQ2_XXS":
        d = _f16(b, 0)
        q = _u32(b, 2, 16).reshape(-1, 8, 2)
        db = d[:, None] * (f(0.5) + (q[:, :, 1] >> 28).astype(f)) * f(0.25)
        scale = _sub(db, 4)
        idx = b[:, 2:66].reshape(-1, 8, 8)[:, :, :4].reshape(-1, 32).astype(np.int64)
        neg = _neg_of7((q[:, :, 1, None] >> (7 * np.arange(4))).reshape(-1, 32))
    elif qtype == "IQ2_XS":
        d = _f16(b, 0)
        qs = _u16(b, 2, 32)
        db = d[:, None] * (f(0.5) + _nib(b, 66, 16).astype(f)) * f(0.25)
        scale, idx, neg = _sub(db, 2), qs & 511, _neg_of7(qs >> 9)
    elif qtype == "IQ2_S":
        d = _f16(b, 0)
        g = np.arange(32)
        hi = (b[:, 66 + g // 4].astype(np.int64) >> (2 * (g % 4))) & 3
        idx = b[:, 2:34].astype(np.int64) | (hi << 8)
        neg = _bits8(b[:, 34:66].astype(np.int64))
        db = d[:, None] * (f(0.5) + _nib(b, 74, 16).astype(f)) * f(0.25)
        scale = _sub(db, 2)
    elif qtype == "IQ3_XXS":
        d = _f16(b, 0)
        ss = _u32(b, 66, 8)
        db = d[:, None] * (f(0.5) + (ss >> 28).astype(f)) * f(0.5)
        scale, idx = _sub(db, 4), b[:, 2:66].astype(np.int64)
        neg = _neg_of7((ss[:, :, None] >> (7 * np.arange(4))).reshape(-1, 32))
    elif qtype == "IQ3_S":
        d = _f16(b, 0)
        p = np.arange(64)
        hi = (b[:, 66 + p // 8].astype(np.int64) >> (p % 8)) & 1
        idx = b[:, 2:66].astype(np.int64) | (hi << 8)
        neg = _bits8(b[:, 74:106].astype(np.int64))
        db = d[:, None] * (1 + 2 * _nib(b, 106, 8)).astype(f)
        scale = _sub(db, 4)
    elif qtype == "IQ1_S":
        d = _f16(b, 0)
        qh = _u16(b, 34, 8)
        dl = d[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(f)
        hi = ((qh[:, :, None] >> (3 * np.arange(4))) & 7).reshape(-1, 32)
        idx = b[:, 2:34].astype(np.int64) | (hi << 8)
        scale, dneg = _sub(dl, 4), _sub((qh & 0x8000) != 0, 4)
    else:  # IQ1_M
        sc = _u16(b, 48, 4)
        dbits = (
            ((sc[:, 0] & 0xF000) >> 12)
            | ((sc[:, 1] & 0xF000) >> 8)
            | ((sc[:, 2] & 0xF000) >> 4)
            | (sc[:, 3] & 0xF000)
        )
        d = dbits.astype(np.uint16).view(np.float16).astype(f)
        s3 = ((sc[:, :, None] >> (3 * np.arange(4))) & 7).reshape(-1, 16)
        dl = d[:, None] * (2 * s3 + 1).astype(f)
        qh = b[:, 32:48].astype(np.int64)
        nibs = np.stack([qh & 15, qh >> 4], axis=2).reshape(-1, 32)
        idx = b[:, 0:32].astype(np.int64) | ((nibs & 7) << 8)
        scale, dneg = _sub(dl, 2), (nibs & 8) != 0
    return LatticeCodes(qtype, np.ascontiguousarray(scale, dtype=f), np.ascontiguousarray(idx), neg, dneg)


def decode(c: LatticeCodes) -> np.ndarray:
    """(B, 256) float32 weights of ``c``: gguf-py's dequantizer's arithmetic."""
    t = table(c.qtype)
    dim = t.shape[1]
    pts = t[c.idx].reshape(c.idx.shape[0], 32, 8)  # (B, 32, 8): a sign group's 8 coordinates
    s = c.scale[:, :, None]
    if c.neg is not None:
        y = s * pts * np.where(c.neg, np.float32(-1), np.float32(1))
    else:
        y = s * (pts + np.where(c.dneg, -_DELTA, _DELTA)[:, :, None])
    del dim
    return y.reshape(-1, QK_K).astype(np.float32)


def _put_u32(b: np.ndarray, at: int, v: np.ndarray) -> None:
    b[:, at : at + 4 * v.shape[1]] = np.ascontiguousarray(v.astype("<u4")).view(np.uint8)


def _put_u16(b: np.ndarray, at: int, v: np.ndarray) -> None:
    b[:, at : at + 2 * v.shape[1]] = np.ascontiguousarray(v.astype("<u2")).view(np.uint8)


def _mask8(neg: np.ndarray) -> np.ndarray:
    return (neg.astype(np.int64) << np.arange(8)).sum(-1)


def encode(template: np.ndarray, c: LatticeCodes) -> np.ndarray:
    """``template``'s bytes (rows × row bytes) with ``c``'s point indices, signs and IQ1_M deltas written in."""
    q = c.qtype
    rows = template.shape[0]
    b = np.array(template, dtype=np.uint8).reshape(-1, _BYTES[q])
    idx = c.idx
    if c.neg is not None and q in _PARITY and bool((c.neg.sum(-1) % 2).any()):
        raise QuantizationError(f"{q} stores only sign patterns with an even number of negatives.")
    if q == "IQ2_XXS":
        w = _u32(b, 2, 16).reshape(-1, 8, 2)
        s7 = (_mask8(c.neg) & 127).reshape(-1, 8, 4)
        w[:, :, 1] = (w[:, :, 1] & 0xF0000000) | (s7 << (7 * np.arange(4))).sum(-1)
        w[:, :, 0] = (idx.reshape(-1, 8, 4) << (8 * np.arange(4))).sum(-1)
        _put_u32(b, 2, w.reshape(-1, 16))
    elif q == "IQ2_XS":
        _put_u16(b, 2, idx | ((_mask8(c.neg) & 127) << 9))
    elif q == "IQ2_S":
        g = np.arange(32)
        b[:, 2:34] = idx & 255
        qh = np.zeros((b.shape[0], 8), np.int64)
        np.add.at(qh, (slice(None), g // 4), (idx >> 8) << (2 * (g % 4)))
        b[:, 66:74] = qh
        b[:, 34:66] = _mask8(c.neg)
    elif q == "IQ3_XXS":
        b[:, 2:66] = idx
        ss = _u32(b, 66, 8)
        s7 = (_mask8(c.neg) & 127).reshape(-1, 8, 4)
        _put_u32(b, 66, (ss & 0xF0000000) | (s7 << (7 * np.arange(4))).sum(-1))
    elif q == "IQ3_S":
        p = np.arange(64)
        b[:, 2:66] = idx & 255
        qh = np.zeros((b.shape[0], 8), np.int64)
        np.add.at(qh, (slice(None), p // 8), (idx >> 8) << (p % 8))
        b[:, 66:74] = qh
        b[:, 74:106] = _mask8(c.neg)
    elif q == "IQ1_S":
        b[:, 2:34] = idx & 255
        qh = _u16(b, 34, 8)
        hi = ((idx >> 8).reshape(-1, 8, 4) << (3 * np.arange(4))).sum(-1)
        _put_u16(b, 34, (qh & 0xF000) | hi)
    else:  # IQ1_M
        b[:, 0:32] = idx & 255
        nib = ((idx >> 8) | (c.dneg.astype(np.int64) << 3)).reshape(-1, 16, 2)
        b[:, 32:48] = nib[:, :, 0] | (nib[:, :, 1] << 4)
    return b.reshape(rows, -1)


# ------------------------------------------------------------------------------------------ search


class _Searcher:
    """The nearest grid point of one sign group, per row, under the weighted metric (torch)."""

    def __init__(self, qtype: str, device: Any) -> None:
        import torch

        self.q = qtype
        self.T = torch.as_tensor(np.array(table(qtype)), device=device)  # (P, dim)
        self.Tt = self.T.T.contiguous()
        self.dim = int(self.T.shape[1])
        self.parity = qtype in _PARITY
        # on the CPU, rows per piece of the flip search's (rows, P, dim) product: about 8 MB, which the
        # allocator reuses (a whole 8960-row matrix's product is 290 MB, mapped and faulted in anew every
        # group); on an accelerator None: one kernel over every row, no host sync to find the odd ones
        cpu = torch.device(device).type == "cpu"
        self.piece = max(1, (1 << 21) // (int(self.T.shape[0]) * self.dim)) if cpu else None

    def _half(self, a: Any, c: Any, s: Any, odd: Any = None) -> tuple[Any, Any, Any]:
        """Per row and point: the weighted distance of |w| (``a``: R × dim) to ``s · T``, and the cheapest flip.

        The flip (``pen``, ``at``) is searched only for the rows in ``odd``; the others' stay 0 (unused)."""
        import torch

        T = self.T
        ca = a * c
        # in place from here: bit for bit s²·(T²c) − 2s·(ca·Tᵀ), with fewer (rows, P) temporaries
        score = ca @ self.Tt
        score.mul_((-2 * s)[:, None])
        score.add_((s * s)[:, None] * ((T * T) @ c)[None, :])
        if not self.parity:
            return score, None, None
        u = (4 * s)[:, None] * ca
        if self.piece is None:
            pen, at = (u[:, None, :] * T[None, :, :]).min(-1)
            return score, pen, at
        pen = torch.zeros_like(score)
        at = torch.zeros(score.shape, dtype=torch.long, device=score.device)
        which = torch.nonzero(odd).reshape(-1)
        for k in range(0, int(which.shape[0]), self.piece):
            r = which[k : k + self.piece]
            pen[r], at[r] = (u[r][:, None, :] * T[None, :, :]).min(-1)
        return score, pen, at

    def choose(self, wg: Any, c: Any, s: Any, dneg: Any) -> tuple[Any, Any, Any, Any]:
        """(idx (R, points), neg (R, 8) or None, dneg (R,) or None, values (R, 8)) for group weights ``wg``."""
        import torch

        R = wg.shape[0]
        rows = torch.arange(R, device=wg.device)
        if self.q in ("IQ1_S", "IQ1_M"):
            T = self.T
            t2 = (T * T) @ c
            best = None
            options = (dneg,) if self.q == "IQ1_S" else (torch.zeros_like(dneg), torch.ones_like(dneg))
            for dn in options:
                delta = torch.where(dn, -_DELTA, _DELTA).to(wg.dtype) * s
                y = wg - delta[:, None]
                score = (s * s)[:, None] * t2[None, :] - 2 * s[:, None] * ((y * c) @ T.T)
                v, p = score.min(1)
                if best is None:
                    best = (v, p, dn)
                else:
                    better = v < best[0]
                    best = (
                        torch.where(better, v, best[0]),
                        torch.where(better, p, best[1]),
                        torch.where(better, dn, best[2]),
                    )
            _, p, dn = best
            vals = s[:, None] * (T[p] + torch.where(dn, -_DELTA, _DELTA).to(wg.dtype)[:, None])
            return p[:, None], None, dn, vals
        a = wg.abs()
        neg = wg < 0
        odd = (neg.sum(1) % 2 == 1) if self.parity else None
        if self.dim == 8:
            score, pen, at = self._half(a, c, s, odd)
            if self.parity:
                total = score + torch.where(odd[:, None], pen, torch.zeros_like(pen))
                p = total.argmin(1)
                j = at[rows, p]
                neg = neg ^ (odd[:, None] & (torch.arange(8, device=wg.device)[None, :] == j[:, None]))
            else:
                p = score.argmin(1)
            idx = p[:, None]
            pts = self.T[p]
        else:
            sa, pa, ja = self._half(a[:, :4], c[:4], s, odd)
            sb, pb, jb = self._half(a[:, 4:], c[4:], s, odd)
            va, ia = sa.min(1)
            vb, ib = sb.min(1)
            if self.parity:
                fa, fia = (sa + pa).min(1)
                fb, fib = (sb + pb).min(1)
                in_a = (fa + vb) <= (va + fb)
                ia = torch.where(odd & in_a, fia, ia)
                ib = torch.where(odd & ~in_a, fib, ib)
                flip = torch.where(in_a, ja[rows, ia], 4 + jb[rows, ib])
                neg = neg ^ (odd[:, None] & (torch.arange(8, device=wg.device)[None, :] == flip[:, None]))
            idx = torch.stack([ia, ib], 1)
            pts = torch.cat([self.T[ia], self.T[ib]], 1)
        vals = s[:, None] * pts * torch.where(neg, -1.0, 1.0).to(wg.dtype)
        return idx, neg, None, vals


# ------------------------------------------------------------------------------------------ GPTQ


def gptq_lattice(
    w: Any,
    h: Any,
    qtype: str,
    *,
    imatrix: np.ndarray | None = None,
    options: GptqOptions | None = None,
    ctx: JobContext | None = None,
    factors: FactorCache | None = None,
) -> GptqResult:
    """Vector GPTQ of weight ``w`` (torch, rows × n) with Hessian ``h`` (n × n) onto lattice type ``qtype``.

    The scales are llama.cpp's imatrix-weighted search's (``imatrix``; the types that need one refuse
    without it, as llama.cpp does). Raises ``HessianError`` when no damping makes ``h`` positive definite.
    ``factors`` shares the inverse factor between calls on the same Hessian object.
    """
    import torch

    opt = options or GptqOptions()
    ctx = ctx or null_context()
    if qtype not in LATTICE_TYPES:
        raise QuantizationError(f"{qtype} is not a lattice type ({', '.join(LATTICE_TYPES)}).")
    rows, n = (int(x) for x in w.shape)
    dev = w.device
    h_in = h  # the caller's object: the key of a shared factor
    st = gptq_start(w, h, qtype, QK_K)
    w0, h, W, dead, n_dead = st.w0, st.h, st.W, st.dead, st.n_dead
    template = iquants.quantize_rows(w0.cpu().numpy(), qtype, imatrix)
    codes0 = unpack(template, qtype, n)
    nbl = n // QK_K
    ng = n // 8
    scale = torch.tensor(codes0.scale.reshape(rows, ng), device=dev)  # a copy: arrival rewrites it
    dneg0 = None if codes0.dneg is None else torch.tensor(codes0.dneg.reshape(rows, ng), device=dev)

    arrival = opt.scales == "arrival"
    energy = st.diag.reshape(ng, 8).sum(1)
    del st
    if opt.act_order and arrival:  # super-blocks by decreasing energy, then their sign groups
        sb_order = torch.argsort(energy.reshape(nbl, G).sum(1), descending=True)
        within = torch.argsort(energy.reshape(nbl, G)[sb_order], dim=1, descending=True)
        gorder = (sb_order[:, None] * G + within).reshape(-1)
    elif opt.act_order:  # whole sign groups, by decreasing energy
        gorder = torch.argsort(energy, descending=True)
    else:
        gorder = torch.arange(ng, device=dev)
    perm = (gorder[:, None] * 8 + torch.arange(8, device=dev)[None, :]).reshape(-1)
    W = W[:, perm]
    damp = max(opt.damp, LATTICE_DAMP) if qtype in _DAMPED and opt.damp_mode == "mean" else opt.damp
    how = ("lattice", opt.act_order, arrival)  # the column order depends on these and on H alone
    hinv, lam, tries = inverse_factor(
        h_in, lambda: working_hessian(h, dead, perm), damp, opt.damp_mode, how, factors
    )
    search = _Searcher(qtype, dev)
    npts = 8 // search.dim
    idx_out = torch.zeros((rows, ng, npts), dtype=torch.long, device=dev)
    neg_out = torch.zeros((rows, ng, 8), dtype=torch.bool, device=dev)
    dneg_out = torch.zeros((rows, ng), dtype=torch.bool, device=dev)
    # arrival: one lazy batch per super-block, whose scales llama.cpp's search finds on the weights as
    # the errors of the super-blocks before it left them (GPTQ's groups searched on arrival)
    bs = QK_K if arrival else max(8, opt.block_size // 8 * 8)
    template = np.array(template)
    scale_np = codes0.scale.reshape(rows, ng).copy()
    qw = None if imatrix is None else np.asarray(imatrix, dtype=np.float32).reshape(-1)
    nb = _BYTES[qtype]
    for i1 in range(0, n, bs):
        ctx.check_cancelled()
        i2 = min(i1 + bs, n)
        W1 = W[:, i1:i2].clone()
        if arrival:
            sb = int(gorder[i1 // 8]) // G
            local = (gorder[i1 // 8 : i2 // 8] - sb * G)[:, None] * 8 + torch.arange(8, device=dev)[None, :]
            x = torch.empty_like(W1)
            x[:, local.reshape(-1)] = W1
            sw = None if qw is None else qw[sb * QK_K : (sb + 1) * QK_K]
            part = iquants.quantize_rows(x.cpu().numpy(), qtype, sw)
            template[:, sb * nb : (sb + 1) * nb] = part
            pc = unpack(part, qtype, QK_K)
            scale_np[:, sb * G : (sb + 1) * G] = pc.scale.reshape(rows, G)
            scale[:, sb * G : (sb + 1) * G] = torch.as_tensor(pc.scale.reshape(rows, G), device=dev)
            if pc.dneg is not None:
                dneg0[:, sb * G : (sb + 1) * G] = torch.as_tensor(pc.dneg.reshape(rows, G), device=dev)
        E1 = torch.zeros_like(W1)
        Hi1 = hinv[i1:i2, i1:i2]
        dg = torch.diagonal(Hi1)
        for b0 in range(0, i2 - i1, 8):
            g = int(gorder[(i1 + b0) // 8])
            c = 1.0 / (dg[b0 : b0 + 8] ** 2)
            dn = None if dneg0 is None else dneg0[:, g]
            idx, neg, dnew, vals = search.choose(W1[:, b0 : b0 + 8], c, scale[:, g], dn)
            idx_out[:, g] = idx
            if neg is not None:
                neg_out[:, g] = neg
            if dnew is not None:
                dneg_out[:, g] = dnew
            e = b0 + 8
            for j in range(8):  # within the sign group column by column, then the block's rest at once
                i = b0 + j
                err = (W1[:, i] - vals[:, j]) / Hi1[i, i]
                W1[:, i:e] -= err[:, None] * Hi1[i, i:e][None, :]
                E1[:, i] = err
            if e < i2 - i1:
                W1[:, e:] -= E1[:, b0:e] @ Hi1[b0:e, e:]
        if i2 < n:
            W[:, i2:] -= E1 @ hinv[i1:i2, i2:]
    del W, hinv

    B = rows * nbl
    new = LatticeCodes(
        qtype,
        scale_np.reshape(B, G),
        idx_out.reshape(B, -1).cpu().numpy(),
        None if codes0.neg is None else neg_out.reshape(B, 32, 8).cpu().numpy(),
        None if codes0.dneg is None else dneg_out.reshape(B, 32).cpu().numpy(),
    )
    data = encode(template, new)
    if (
        arrival or opt.refit
    ) and qtype != "IQ1_M":  # IQ1_M spreads its fp16 scale over the sub-block scale bits
        data = refit_super_scales(data, qtype, w0, h)
        new = unpack(data, qtype, n)
    err, err_rtn = _decoded_error(w0, h, new, dev), _decoded_error(w0, h, codes0, dev)
    return GptqResult(data, qtype, lam, n_dead, err, err_rtn, gptq_notes(tries, lam, opt.damp, n_dead))


def _decoded_error(w0: Any, h: Any, c: LatticeCodes, dev: Any) -> float:
    """``output_error`` of ``c``'s values against ``w0``, decoded a block of rows at a time."""
    import torch

    nbl = int(w0.shape[1]) // QK_K

    def values(a: int, b: int) -> Any:
        r = slice(a * nbl, b * nbl)
        part = LatticeCodes(
            c.qtype,
            c.scale[r],
            c.idx[r],
            None if c.neg is None else c.neg[r],
            None if c.dneg is None else c.dneg[r],
        )
        return torch.as_tensor(decode(part).reshape(b - a, -1), device=dev)

    return output_error_by_rows(w0, h, values)


def refit_super_scales(data: np.ndarray, qtype: str, w: Any, h: Any) -> np.ndarray:
    """``data`` with each super-block's fp16 scale ``d`` re-fitted to its codes: per row, the ``d``s
    minimising the output error ``(w − ŵ) H (w − ŵ)ᵀ`` (one linear least-squares problem, ``ŵ``
    linear in them), rounded to fp16; a row keeps its old ``d``s where the new ones are not better."""
    import torch

    rows, n = (int(x) for x in w.shape)
    nb = n // QK_K
    b = np.array(data, dtype=np.uint8).reshape(rows * nb, _BYTES[qtype])
    d_old = _f16(b, 0).astype(np.float64).reshape(rows, nb)
    dev = h.device if h.device.type != "mps" else torch.device("cpu")  # its float64 solve: Metal has none
    # ŵ = d · L per super-block: L the values of d = 1, decoded a block of rows at a time (the whole
    # matrix's codes and values, 0.5 GB for an 8B's ffn_up, sat beside the layer at the export's peak)
    dd = np.where(d_old != 0, d_old, 1.0)[:, :, None]
    hs = h.to(device=dev)  # as stored: _refit_rows reads it in float64 a super-block's slab at a time
    eye = torch.eye(nb, dtype=torch.float64, device=dev)
    new_d = torch.empty((rows, nb), dtype=torch.float64, device=dev)
    # every row is its own least-squares problem: a block of rows at a time, so that its levels, weights
    # and products stay a few rows × n float64 values (all rows of a 4096 × 14336 down_proj at once asked
    # for 26 GB)
    per = max(1, _REFIT_BLOCK // max(1, n))
    for a in range(0, rows, per):
        r = slice(a, min(a + per, rows))
        lev = decode(unpack(b[r.start * nb : r.stop * nb], qtype, QK_K)).reshape(-1, nb, QK_K)
        new_d[r] = _refit_rows(
            torch.as_tensor(lev / dd[r], dtype=torch.float64, device=dev),
            hs,
            w[r].to(device=dev, dtype=torch.float64),
            torch.as_tensor(d_old[r], dtype=torch.float64, device=dev),
            eye,
        )
    new = new_d.cpu().numpy().reshape(-1)
    b[:, 0:2] = np.ascontiguousarray(new.astype("<f2")).view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, -1)


def _refit_rows(lev: Any, h: Any, w: Any, old: Any, eye: Any) -> Any:
    """``refit_super_scales`` for a block of rows: their levels (rows × nb × 256), the Hessian, the rows'
    weights and old scales; the new scales where they are better, else the old."""
    import torch

    rows, nb, qk = (int(x) for x in lev.shape)
    n = nb * qk
    A = torch.empty((rows, nb, nb), dtype=torch.float64, device=lev.device)
    hw = torch.empty((rows, n), dtype=torch.float64, device=lev.device)
    # in float64 one super-block's slab of H at a time: a float64 copy of the whole Hessian (1.64 GB at
    # an 8B's 14336-wide down_proj) was a best-method budget export's peak on the 8B fixture
    for a in range(nb):
        s = slice(a * qk, (a + 1) * qk)
        ha = h[s].to(torch.float64)  # H's rows of super-block a
        T = torch.einsum("ibj,rbj->rib", ha.view(qk, nb, qk), lev)
        A[:, a] = torch.einsum("ri,rib->rb", lev[:, a], T)
        del T, ha
        hw[:, s] = w @ h[:, s].to(torch.float64)
    rhs = (lev * hw.view(rows, nb, qk)).sum(-1)
    del hw
    reg = 1e-9 * torch.diagonal(A, dim1=-2, dim2=-1).mean(-1).clamp(min=1e-30)
    d = torch.linalg.solve(A + reg[:, None, None] * eye, rhs)
    d16 = d.to(torch.float16).to(torch.float64)

    def loss(x: Any) -> Any:  # the row's error up to a constant: xᵀAx − 2bᵀx
        return torch.einsum("ra,rab,rb->r", x, A, x) - 2 * (rhs * x).sum(-1)

    ok = torch.isfinite(d16).all(-1) & (loss(d16) < loss(old)) & (old != 0).all(-1)
    return torch.where(ok[:, None], d16, old)
