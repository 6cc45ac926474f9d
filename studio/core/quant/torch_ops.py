"""Elementwise primitives of ggml's reference quantizers for the torch kernels (``legacy_torch``, ``kquants_torch``).

They give C's float32 results on CPU, CUDA and MPS: a division always takes two full tensors,
because torch turns a division by a Python scalar into a multiplication by its reciprocal on some
devices; sums run in index order (C's ``float s = 0`` loop), never as torch's pairwise reductions;
constants are the float32 values C uses. Only elementwise ops, so nothing fuses a multiply-add.
"""

from __future__ import annotations

import numpy as np
import torch

from studio.core.quant.types import GROUP_MAX_EPS

__all__ = [
    "EPS",
    "div",
    "f32",
    "fp16",
    "fp16_bytes",
    "nearest_int",
    "qx_search",
    "seq_sum",
    "sqrt",
]

EPS = float(GROUP_MAX_EPS)


def f32(v: float) -> float:
    """A Python float holding exactly the float32 constant C would use."""
    return float(np.float32(v))


def div(a, b):
    """a / b with both sides full tensors, so every device performs a true IEEE division."""
    if not isinstance(a, torch.Tensor):
        a = torch.full_like(b, f32(a))
    if not isinstance(b, torch.Tensor):
        b = torch.full_like(a, f32(b))
    return torch.div(a, b)


def nearest_int(v: torch.Tensor) -> torch.Tensor:
    """ggml's nearest_int, bit for bit: the low 23 bits of v + 1.5*2^23 as float32, minus 2^22
    (round half to even for |v| < 2^22; the same value as C for inf from overflowing input).

    A NaN gives its payload bits there. C's NaNs here are x86's default quiet NaN (payload 0, so 0),
    but torch's CPU kernels may return another one (0x7fffffff from a division): every NaN is read
    as the default one (test_extreme_values_equal_llama_cpp_on_numpy_and_torch).
    """
    v = torch.where(torch.isnan(v), torch.zeros_like(v), v)
    return ((v + 12582912.0).contiguous().view(torch.int32) & 0x7FFFFF) - 0x400000


def sqrt(t: torch.Tensor) -> torch.Tensor:
    """C's correctly rounded sqrtf: the float64 root rounded to float32 (torch's vectorized float32
    root may be off by one ulp). MPS has no float64 and keeps its own root."""
    if t.device.type == "mps":
        return torch.sqrt(t)
    return torch.sqrt(t.to(torch.float64)).to(torch.float32)


def seq_sum(t: torch.Tensor, dim: int = 0, *, from_first: bool = False) -> torch.Tensor:
    """Sum over ``dim`` in index order, from 0 (C's ``float s = 0``) or from the first element."""
    n = t.shape[dim]
    s = t.select(dim, 0).clone() if from_first else torch.zeros_like(t.select(dim, 0))
    for i in range(1 if from_first else 0, n):
        s = s + t.select(dim, i)
    return s


def fp16_bytes(v: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 bytes (N, 2) of float32 ``v``, rounded to nearest-even like ggml."""
    return v.to(torch.float16).reshape(-1, 1).contiguous().view(torch.uint8)


def fp16(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp16 bytes (N, 2), the stored fp16 value back in float32) of float32 ``v``."""
    h = v.to(torch.float16)
    return h.reshape(-1, 1).contiguous().view(torch.uint8), h.to(torch.float32)


def qx_search(trial, nmax: int):
    """make_qx_quants' search (rmse_type 1) over its 19 trial scales -nmax - 0.1 step / max (float32 as in C).

    ``trial(numerator)`` gives, per group, (what to keep of that trial, Σ w·x·l, Σ w·l²); returns what
    was kept of the best trial (the first of equals, as C's loop keeps it) and its scale.
    """
    kept, sumlx, suml2 = trial(-float(nmax))
    scale = torch.where(suml2 != 0, div(sumlx, suml2), torch.zeros_like(sumlx))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        k, sumlx, suml2 = trial(-float(np.float32(nmax) + np.float32(0.1) * np.float32(step)))
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        kept = torch.where(better[(...,) + (None,) * (k.dim() - better.dim())], k, kept)
        scale = torch.where(better, div(sumlx, suml2), scale)
        best = torch.where(better, scale * sumlx, best)
    return kept, scale
