"""Generic quantizers for analysis: INT8/4/3/2 (symmetric or asymmetric) and simulated FP8.

These are not GGUF formats; the inspector uses them to show how much error a bit width and a scale
granularity would cost. Weights are read as (output channels, ...): the first axis is the channel,
groups run along the last axis (the input dimension), as in GPTQ/AWQ "g128".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.quant.metrics import real_numpy

__all__ = ["FP8_FORMATS", "GenericResult", "quantize_fp8", "quantize_int"]

Granularity = Literal["tensor", "channel", "group"]

# name -> (exponent bits, mantissa bits, exponent bias, largest finite value)
FP8_FORMATS: dict[str, tuple[int, int, int, float]] = {
    "e4m3": (4, 3, 7, 448.0),
    "e5m2": (5, 2, 15, 57344.0),
}


@dataclass(frozen=True, eq=False)
class GenericResult:
    """A simulated quantization: the reconstruction and the parameters that produced it.

    ``scales`` (and ``zero_points`` for asymmetric INT) have one entry per scale group, shaped
    (channels, groups per channel), (channels, 1) or (1, 1); ``codes`` are the integer levels (INT)
    or the unscaled FP8 values (FP8), shaped like the input.
    """

    dequantized: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    codes: np.ndarray
    scheme: str
    bits_per_weight: float


def _as_numpy(w: Any) -> np.ndarray:
    a = real_numpy(w, "A tensor of dtype {dtype} cannot be analysed; only real numbers can.")
    a = a.astype(np.float32, copy=False)
    if not np.isfinite(a).all():
        raise QuantizationError(
            f"A tensor of shape {a.shape} contains {int((~np.isfinite(a)).sum())} NaN or infinite values; "
            "it cannot be analysed.",
        )
    return a


def _grouped(a: np.ndarray, granularity: str, group_size: int | None) -> tuple[np.ndarray, int]:
    """View ``a`` as (scale groups..., values per group): returns a 3-D (channels, groups, g) array."""
    if a.ndim == 0:
        a = a.reshape(1)
    ch = a.shape[0] if a.ndim > 1 else 1
    flat = a.reshape(ch, -1)
    if granularity == "tensor":
        return a.reshape(1, 1, -1), 1
    if granularity == "channel":
        return flat.reshape(ch, 1, -1), ch
    if granularity != "group":
        raise QuantizationError(f"Unknown granularity {granularity!r}; use tensor, channel or group.")
    if group_size not in (32, 64, 128, 256):
        raise QuantizationError(f"Group size {group_size} is not supported; use 32, 64, 128 or 256.")
    if flat.shape[1] % group_size:
        raise QuantizationError(
            f"A tensor of shape {a.shape} has rows of {flat.shape[1]} values, not a multiple of the group "
            f"size {group_size}; use per-channel scales for it.",
        )
    return flat.reshape(ch, -1, group_size), ch


def _bpw(bits: float, group_len: int, params_per_group: int) -> float:
    # 16-bit scale (and zero point) per group, as GGUF-style formats store them.
    return bits + 16.0 * params_per_group / max(group_len, 1)


def quantize_int(
    w: Any,
    bits: int,
    *,
    symmetric: bool = True,
    granularity: Granularity = "channel",
    group_size: int | None = None,
) -> GenericResult:
    """Round-to-nearest INT quantization with float32 scales (and integer zero points if asymmetric).

    ``bits`` is 2 to 16. Symmetric: levels -2^(b-1)..2^(b-1)-1, scale = max|w| / (2^(b-1)-1).
    Asymmetric: levels 0..2^b-1 over [min(w, 0), max(w, 0)], zero point = round(-min/scale). A group
    of zeros gets scale 1.
    """
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 16:
        raise QuantizationError(f"INT{bits} is not supported; use 2 to 16 bits.")
    a = _as_numpy(w)
    if a.size == 0:
        empty = np.zeros((0, 1), np.float32)
        return GenericResult(a.copy(), empty, None if symmetric else empty, a.astype(np.int32), "empty", 0.0)
    g, _ = _grouped(a, granularity, group_size)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        amax = np.abs(g).max(axis=-1, keepdims=True)
        scale = np.where(amax > 0, amax / np.float32(qmax), np.float32(1.0)).astype(np.float32)
        q = np.clip(np.rint(g / scale), -qmax - 1, qmax)
        deq = (q * scale).astype(np.float32)
        zp = None
    else:
        qmax = 2**bits - 1
        lo = np.minimum(g.min(axis=-1, keepdims=True), 0)
        hi = np.maximum(g.max(axis=-1, keepdims=True), 0)
        rng = hi - lo
        scale = np.where(rng > 0, rng / np.float32(qmax), np.float32(1.0)).astype(np.float32)
        zp = np.clip(np.rint(-lo / scale), 0, qmax).astype(np.int32)
        q = np.clip(np.rint(g / scale) + zp, 0, qmax)
        deq = ((q - zp) * scale).astype(np.float32)
    scheme = f"INT{bits} {'sym' if symmetric else 'asym'} {granularity}" + (
        f" g{group_size}" if granularity == "group" else ""
    )
    return GenericResult(
        deq.reshape(a.shape),
        scale[..., 0],
        None if zp is None else zp[..., 0],
        q.astype(np.int32).reshape(a.shape),
        scheme,
        _bpw(bits, g.shape[-1], 1 if symmetric else 2),
    )


def _fp8_round_numpy(v: np.ndarray, fmt: str) -> np.ndarray:
    # Round float32 values to the nearest FP8 value (ties to even), saturating at the largest finite one.
    ebits, mbits, bias, fmax = FP8_FORMATS[fmt]
    x = v.astype(np.float64)
    _, e = np.frexp(x)  # x = m * 2^e with 0.5 <= |m| < 1
    exp = np.maximum(e - 1, 1 - bias)  # subnormals share the smallest exponent
    quantum = np.ldexp(1.0, (exp - mbits).astype(np.int32))
    r = np.rint(x / quantum) * quantum
    return np.clip(r, -fmax, fmax).astype(np.float32)


def _fp8_round(v: np.ndarray, fmt: str) -> np.ndarray:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return _fp8_round_numpy(v, fmt)
    dt = getattr(torch, "float8_e4m3fn" if fmt == "e4m3" else "float8_e5m2", None)
    if dt is None:  # pragma: no cover - older torch
        return _fp8_round_numpy(v, fmt)
    fmax = FP8_FORMATS[fmt][3]
    t = torch.from_numpy(np.clip(v, -fmax, fmax).astype(np.float32))
    return t.to(dt).to(torch.float32).numpy()


def quantize_fp8(
    w: Any,
    fmt: str = "e4m3",
    *,
    granularity: Granularity = "tensor",
    group_size: int | None = None,
) -> GenericResult:
    """Simulated FP8 (E4M3 or E5M2): scale so max|w| maps to the format's largest value, round, rescale."""
    fmt = fmt.lower()
    if fmt not in FP8_FORMATS:
        raise QuantizationError(f"Unknown FP8 format {fmt!r}; use e4m3 or e5m2.")
    a = _as_numpy(w)
    if a.size == 0:
        empty = np.zeros((0, 1), np.float32)
        return GenericResult(a.copy(), empty, None, a.copy(), "empty", 0.0)
    fmax = np.float32(FP8_FORMATS[fmt][3])
    g, _ = _grouped(a, granularity, group_size)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / fmax, np.float32(1.0)).astype(np.float32)
    codes = _fp8_round(g / scale, fmt)
    deq = (codes * scale).astype(np.float32)
    scheme = f"FP8 {fmt.upper()} {granularity}" + (f" g{group_size}" if granularity == "group" else "")
    return GenericResult(
        deq.reshape(a.shape), scale[..., 0], None, codes.reshape(a.shape), scheme, _bpw(8, g.shape[-1], 1)
    )
