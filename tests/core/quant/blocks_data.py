"""Test matrices for the block quantizers: the distributions llama.cpp must be matched on (issue 3).

Shared by the legacy/IQ4 and K-quant byte-exactness tests, so both cover the same shapes of data.
"""

from __future__ import annotations

import numpy as np

# The acceptance distributions, and harder ones that stress the float32 search arithmetic.
DISTS = ["gauss", "student_t3", "zeros", "constant", "outlier", "tiny", "fp16_limits"]
EXTREME = ["ties", "signed_zeros", "subnormal", "beyond_fp16"]


def make(dist: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A float32 ``(rows, cols)`` matrix of the named kind (``cols`` a multiple of 16)."""
    rng = np.random.default_rng(seed)
    shape = (rows, cols)
    if dist == "gauss":
        return rng.standard_normal(shape, dtype=np.float32)
    if dist == "student_t3":
        return rng.standard_t(3, shape).astype(np.float32)
    if dist == "zeros":
        return np.zeros(shape, np.float32)
    if dist == "constant":
        # positive, negative and tiny constants, and rows constant per 16-group, cyclically
        kinds = [
            np.full(cols, 0.37, np.float32),
            np.full(cols, -2.5, np.float32),
            np.full(cols, 1e-3, np.float32),
            np.repeat(rng.standard_normal(cols // 16), 16).astype(np.float32),
        ]
        return np.stack([kinds[i % 4] for i in range(rows)])
    if dist == "outlier":
        x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        x[np.arange(rows), rng.integers(0, cols, rows)] = np.where(np.arange(rows) % 2, 300.0, -300.0)
        return x
    if dist == "tiny":
        return (rng.standard_normal(shape) * 1e-8).astype(np.float32)
    if dist == "fp16_limits":
        x = rng.uniform(-60000, 60000, shape).astype(np.float32)
        x[0, :64] = 60000.0
        x[1, :64] = -65504.0
        x[2, ::3] = 6e-8  # near the smallest fp16 subnormal
        return x
    if dist == "ties":  # many values exactly halfway between levels
        return (rng.integers(-64, 64, shape) / 8).astype(np.float32)
    if dist == "signed_zeros":
        x = np.where(rng.random(shape) < 0.5, -0.0, 0.0).astype(np.float32)
        x[:, ::37] = rng.standard_normal((rows, len(range(0, cols, 37)))).astype(np.float32)
        return x
    if dist == "subnormal":  # scales overflow to inf inside the search
        return (rng.standard_normal(shape) * 1e-40).astype(np.float32)
    if dist == "beyond_fp16":  # sums overflow to inf/NaN inside the search
        return (rng.standard_normal(shape) * 1e30).astype(np.float32)
    raise ValueError(dist)


def imatrix_for(kind: str | None, cols: int, floor: float = 1e-3) -> np.ndarray | None:
    """None, a random positive importance matrix (values above ``floor``), or one with many exact zeros."""
    if kind is None:
        return None
    rng = np.random.default_rng(7)
    qw = (rng.random(cols, dtype=np.float32) ** 2 * 4 + np.float32(floor)).astype(np.float32)
    if kind == "imatrix_zeros":
        qw[rng.random(cols) < 0.4] = 0.0
        qw[:32] = 0.0  # a whole group without importance
    return qw


def accelerators() -> list[str]:
    """The torch devices besides the CPU that the torch path is checked on (CUDA, MPS)."""
    try:
        import torch
    except ImportError:
        return []
    devs = []
    if torch.cuda.is_available():
        devs.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        devs.append("mps")
    return devs
