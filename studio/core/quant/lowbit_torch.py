"""Torch versions of the scalar low-bit quantizers (TQ1_0, TQ2_0, MXFP4, Q1_0, Q2_0), for CPU, CUDA and MPS.

Each is ``lowbit``'s kernel vectorized over blocks, in the same float32 arithmetic (ggml's reference
quantizers): absolute maxima, Q1_0's mean of |x| summed in C's order (``seq_sum``), C's ``roundf`` and
``lroundf`` (half away from zero; an infinite or NaN product from an overflowing reciprocal gives
x86's 0 low bits), MXFP4's exponent from log2 and its first-nearest E2M1 value. Byte-identical to
the numba kernels (tests/core/quant/test_gptq_lowgrids.py compares them on CPU torch). The lattice
i-quants have no torch path: their scale search walks a fan of trial scales with data-dependent
neighbour lookups per group, which the numba kernels do on the CPU.
"""

from __future__ import annotations

import torch

from studio.core.quant.torch_ops import div, fp16_bytes, seq_sum

__all__ = ["TORCH_LOWBIT_TYPES", "quantize_rows_torch"]

TORCH_LOWBIT_TYPES: tuple[str, ...] = ("TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "Q2_0")
_TWO31 = 2147483648.0
_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf (half away from zero), as lowbit._roundf: |v| − floor|v| is exact in float32."""
    a = v.abs()
    t = torch.floor(a)
    r = torch.where(a - t >= 0.5, t + 1, t)
    return torch.where(v < 0, -r, r)


def _lround_low32(v: torch.Tensor) -> torch.Tensor:
    """(int) lroundf(v) on x86-64 as int64: 0 where |v| ≥ 2^31, inf or NaN (LONG_MIN's low bits)."""
    ok = v.abs() < _TWO31
    return torch.where(ok, _roundf(torch.where(ok, v, torch.zeros_like(v))), torch.zeros_like(v)).to(
        torch.int64
    )


def _recip(d: torch.Tensor) -> torch.Tensor:
    return torch.where(
        d != 0, div(torch.ones_like(d), torch.where(d != 0, d, torch.ones_like(d))), torch.zeros_like(d)
    )


def _ternary_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, lround(x · 1/d) + 1 as int64) of 256-weight blocks (B, 256)."""
    d = x.abs().amax(dim=1)
    return d, _lround_low32(x * _recip(d)[:, None]) + 1


def _tq1(x: torch.Tensor) -> torch.Tensor:
    d, q = _ternary_blocks(x)
    B = x.shape[0]
    out = torch.empty((B, 54), dtype=torch.uint8, device=x.device)

    def pack(trits: torch.Tensor, tail: bool) -> torch.Tensor:  # (B, k, m): digit k of byte m
        acc = torch.zeros_like(trits[:, 0])
        for k in range(trits.shape[1]):
            acc = (acc * 3 + trits[:, k]) & 0xFF
        if tail:
            acc = (acc * 3) & 0xFF
        return ((acc * 256 + 242) // 243) & 0xFF

    out[:, 0:32] = pack(q[:, :160].reshape(B, 5, 32), False).to(torch.uint8)
    out[:, 32:48] = pack(q[:, 160:240].reshape(B, 5, 16), False).to(torch.uint8)
    out[:, 48:52] = pack(q[:, 240:].reshape(B, 4, 4), True).to(torch.uint8)
    out[:, 52:54] = fp16_bytes(d)
    return out


def _tq2(x: torch.Tensor) -> torch.Tensor:
    d, q = _ternary_blocks(x)
    B = x.shape[0]
    q = (q & 3).reshape(B, 2, 4, 32)  # (half, k, m): element 128·half + 32·k + m
    byte = (q << (2 * torch.arange(4, device=x.device))[None, None, :, None]).sum(2) & 0xFF
    out = torch.empty((B, 66), dtype=torch.uint8, device=x.device)
    out[:, :64] = byte.reshape(B, 64).to(torch.uint8)
    out[:, 64:66] = fp16_bytes(d)
    return out


def _e8m0_half(e: torch.Tensor) -> torch.Tensor:
    bits = torch.where(
        e < 2, torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e.clamp(max=1)), (e - 1) << 23
    )
    return bits.to(torch.int32).view(torch.float32)


def _mxfp4(x: torch.Tensor) -> torch.Tensor:
    amax = x.abs().amax(dim=1)
    pos = amax > 0
    lg = torch.floor(torch.log2(torch.where(pos, amax, torch.ones_like(amax)).double()).float())
    v = lg - 2.0 + 127.0
    ok = v.abs() < _TWO31
    e = torch.where(ok, torch.where(ok, v, torch.zeros_like(v)).trunc(), torch.full_like(v, -_TWO31))
    e = torch.where(pos, e.to(torch.int64) & 0xFF, torch.zeros_like(e, dtype=torch.int64))
    d = _e8m0_half(e)
    kv = torch.tensor(_MXFP4, dtype=torch.float32, device=x.device)
    err = (kv[None, None, :] * d[:, None, None] - x[:, :, None]).abs()
    nib = torch.argmin(err, dim=2)  # the first nearest, as the C loop's strict '<'
    out = torch.empty((x.shape[0], 17), dtype=torch.uint8, device=x.device)
    out[:, 0] = e.to(torch.uint8)
    out[:, 1:] = (nib[:, :16] | (nib[:, 16:] << 4)).to(torch.uint8)
    return out


def _q1(x: torch.Tensor) -> torch.Tensor:
    s = seq_sum(x.abs(), dim=1)
    B = x.shape[0]
    bits = (x >= 0).to(torch.int64).reshape(B, 16, 8) << torch.arange(8, device=x.device)
    out = torch.empty((B, 18), dtype=torch.uint8, device=x.device)
    out[:, 0:2] = fp16_bytes(s / 128.0)
    out[:, 2:] = bits.sum(2).to(torch.uint8)
    return out


def _q2(x: torch.Tensor) -> torch.Tensor:
    amax = x.abs().amax(dim=1)
    v = x * _recip(amax)[:, None]
    ok = v.abs() < _TWO31  # C: (int) of roundf(v), or of v itself, out of range → INT_MIN → code 0
    q = (
        torch.where(ok, _roundf(torch.where(ok, v, torch.zeros_like(v))), torch.full_like(v, -2.0)).to(
            torch.int64
        )
        + 1
    )
    q = q.clamp(0, 3)
    B = x.shape[0]
    out = torch.empty((B, 18), dtype=torch.uint8, device=x.device)
    out[:, 0:2] = fp16_bytes(amax)
    out[:, 2:] = (q.reshape(B, 16, 4) << (2 * torch.arange(4, device=x.device))).sum(2).to(torch.uint8)
    return out


_FNS = {
    "TQ1_0": (_tq1, 256),
    "TQ2_0": (_tq2, 256),
    "MXFP4": (_mxfp4, 32),
    "Q1_0": (_q1, 128),
    "Q2_0": (_q2, 64),
}


def quantize_rows_torch(x: torch.Tensor, qtype: str, imatrix: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize finite float32 rows (rows, n) on their device; uint8 (rows, row bytes). The imatrix is
    unused, as in ggml."""
    del imatrix
    fn, block = _FNS[qtype]
    rows, n = x.shape
    return fn(x.reshape(-1, block).to(torch.float32)).reshape(rows, -1)
