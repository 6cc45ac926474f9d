"""Small typed accumulators a calibration hook feeds, and the frozen statistics they end in.

``InputAccumulator`` sums over the rows (tokens) that enter one linear layer, per input channel:
count, Σx², absmax, Σ|x| and a log-binned histogram of |x|; with experts, one row of sums per
expert with its own token count (as llama-imatrix keeps them). ``HiddenAccumulator`` follows the
residual stream after one decoder layer (token norms, per-channel absmax). ``HessianAccumulator``
sums XᵀX for GPTQ (``H = 2XᵀX / n``). Sums stay on the device the layer runs on (float64 where the
device has it, float32 on MPS) and cross to numpy once, in ``result()``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# |x| histogram, keyed by the top 12 bits of the float32 pattern: exponent plus 3 mantissa bits, so
# eight bins per octave (exact, no logarithm needed). Bin 0 holds |x| < 2^-24 (zeros included), bins
# 1..320 cover 2^-24 to 2^16, the last bin everything from 2^16 up.
_KEY_SHIFT = 20
_KEY_LO = (127 - 24) << 3  # key of 2^-24
_KEY_SPAN = 40 << 3  # 40 octaves
HIST_BINS = _KEY_SPAN + 2


def hist_edges() -> np.ndarray:
    """Edges (|x| values, float64) of the activation histogram bins: ``HIST_BINS + 1`` of them,
    starting at 0 and ending at +inf."""
    k = np.arange(_KEY_SPAN + 1) + _KEY_LO
    v = np.exp2((k >> 3) - 127.0) * (1.0 + (k & 7) / 8.0)
    return np.concatenate([[0.0], v, [np.inf]])


def _acc_dtype(device: Any) -> Any:
    import torch

    return torch.float32 if str(device).startswith("mps") else torch.float64


def _fold(keys: np.ndarray) -> np.ndarray:
    """Counts per raw key (the top 12 bits of |x|, ``_reduce_kernel.N_KEYS`` of them) → ``HIST_BINS``."""
    out = np.zeros(HIST_BINS, dtype=np.int64)
    np.add.at(out, _FOLD, keys.astype(np.int64))
    return out


_FOLD = np.clip(np.arange(2048) - _KEY_LO, -1, _KEY_SPAN) + 1  # raw key → histogram bin


@functools.cache
def _have_numba() -> bool:
    from studio.core.jit import HAVE_NUMBA

    return HAVE_NUMBA


def _compiled(x: Any) -> bool:
    """True when ``x`` is reduced by the numba kernel (a CPU tensor, numba present)."""
    return x.device.type == "cpu" and _have_numba()


@dataclass(frozen=True, eq=False)
class Reduction:
    """Per-channel reductions of one batch of rows ``x`` (2-D, rows × channels), computed once and shared.

    Several linears read the same tensor (q, k and v; gate and up): the hook reduces it once. On a CPU
    a compiled kernel reads ``x`` once (float64 sums); elsewhere torch reduces it on its device
    (float32 sums), without a transfer. ``hist`` counts raw keys (top 12 bits of |x|, 2048 of them);
    ``InputAccumulator.result`` folds them into ``HIST_BINS``.
    """

    rows: int
    sum_sq: Any  # torch (channels,)
    absmax: Any  # torch float32 (channels,)
    sum_abs: Any
    hist: Any | None  # torch int64 (2048,) raw key counts
    finite: bool

    @classmethod
    def of(cls, x: Any, *, histogram: bool = True) -> Reduction:
        """Reduce ``x`` (any float dtype, rows × channels)."""
        import torch

        xf = x.detach()
        if xf.dtype != torch.float32:
            xf = xf.float()
        rows, cols = xf.shape
        if _compiled(xf):
            from studio.core.calib._reduce_kernel import N_KEYS, reduce_rows

            xn = (xf if xf.is_contiguous() else xf.contiguous()).numpy()
            sq, sa = np.zeros(cols), np.zeros(cols)
            am = np.zeros(cols, dtype=np.float32)
            keys = np.zeros(N_KEYS, dtype=np.int64)
            finite = reduce_rows(xn, xn.view(np.uint32), sq, sa, am, keys, histogram)  # NaN and Inf reach Σx²
            return cls(
                rows,
                torch.from_numpy(sq),
                torch.from_numpy(am),
                torch.from_numpy(sa),
                torch.from_numpy(keys) if histogram else None,
                finite,
            )
        a = xf.abs()
        sq = (a * a).sum(0)
        amax = a.amax(0) if rows else torch.zeros(cols, device=a.device)
        finite = bool(torch.isfinite(sq).all()) and bool(torch.isfinite(amax).all())
        hist = None
        if histogram and finite:
            hist = torch.bincount((a.view(torch.int32) >> _KEY_SHIFT).reshape(-1), minlength=2048)
        return cls(rows, sq, amax, a.sum(0), hist, finite)


@dataclass(frozen=True, eq=False)
class InputStats:
    """What entered one linear layer over the calibration tokens, per input channel.

    Arrays are (n_experts, n_cols); a dense layer has one expert. ``count`` is tokens per expert.
    """

    n_cols: int
    count: np.ndarray  # int64 (E,)
    sum_sq: np.ndarray  # float64 (E, n)
    absmax: np.ndarray  # float32 (E, n)
    sum_abs: np.ndarray  # float64 (E, n)
    hist: np.ndarray  # int64 (HIST_BINS,): |x| of every element, all experts together (``hist_edges``)

    def __post_init__(self) -> None:
        for a in (self.count, self.sum_sq, self.absmax, self.sum_abs, self.hist):
            a.flags.writeable = False

    @property
    def n_experts(self) -> int:
        """Number of experts (1 for a dense layer)."""
        return int(self.count.shape[0])

    @property
    def tokens(self) -> int:
        """Rows seen, over all experts."""
        return int(self.count.sum())

    def _per_token(self, total: np.ndarray) -> np.ndarray:
        c = self.count.astype(np.float64)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(c > 0, total / np.where(c > 0, c, 1.0), 0.0)

    @property
    def mean_sq(self) -> np.ndarray:
        """mean(x²) per expert and channel (the imatrix values)."""
        return self._per_token(self.sum_sq)

    @property
    def rms(self) -> np.ndarray:
        """sqrt(mean(x²)) per channel, over all experts (n,)."""
        n = max(self.tokens, 1)
        return np.sqrt(self.sum_sq.sum(0) / n)

    @property
    def mean_abs(self) -> np.ndarray:
        """mean |x| per channel, over all experts (n,)."""
        n = max(self.tokens, 1)
        return self.sum_abs.sum(0) / n

    @property
    def channel_absmax(self) -> np.ndarray:
        """max |x| per channel, over all experts (n,)."""
        return self.absmax.max(0)

    @property
    def mean_magnitude(self) -> float:
        """mean |x| over every element (LLM.int8()'s "mean magnitude")."""
        n = self.tokens * self.n_cols
        return float(self.sum_abs.sum() / n) if n else 0.0

    @property
    def nbytes(self) -> int:
        """Memory held by the arrays."""
        return sum(a.nbytes for a in (self.count, self.sum_sq, self.absmax, self.sum_abs, self.hist)) + 256


def merge_input_stats(parts: list[InputStats]) -> InputStats:
    """The statistics of consecutive batches of rows from each batch's own (in order): the sums are
    added in that order from zero, as one ``InputAccumulator`` fed every batch in turn adds them."""
    first = parts[0]
    count = np.zeros_like(first.count)
    sq, sa = np.zeros_like(first.sum_sq), np.zeros_like(first.sum_abs)
    am, hist = np.zeros_like(first.absmax), np.zeros_like(first.hist)
    for p in parts:
        count += p.count
        np.add(sq, p.sum_sq, out=sq)
        np.add(sa, p.sum_abs, out=sa)
        np.maximum(am, p.absmax, out=am)
        hist += p.hist
    return InputStats(first.n_cols, count, sq, am, sa, hist)


class InputAccumulator:
    """Running sums for one linear layer's input; feed it ``Reduction`` objects."""

    def __init__(self, n_cols: int, device: Any, n_experts: int = 1) -> None:
        import torch

        dt = _acc_dtype(device)
        self.n_cols = int(n_cols)
        self.count = [0] * n_experts
        self.sum_sq = torch.zeros((n_experts, n_cols), dtype=dt, device=device)
        self.sum_abs = torch.zeros((n_experts, n_cols), dtype=dt, device=device)
        self.absmax = torch.zeros((n_experts, n_cols), dtype=torch.float32, device=device)
        self.hist = torch.zeros(2048, dtype=torch.int64, device=device)  # raw keys, folded in result()
        cpu = self.sum_sq.device.type == "cpu"
        self._np = (
            (self.sum_sq.numpy(), self.sum_abs.numpy(), self.absmax.numpy(), self.hist.numpy())
            if cpu
            else None
        )
        self.last: Any = None  # the last Reduction added (sites sharing this accumulator add it once)

    def add(self, r: Reduction, expert: int = 0) -> None:
        """Add one batch of rows (for ``expert``)."""
        self.count[expert] += r.rows
        if self._np is not None and r.sum_sq.device.type == "cpu" and r.sum_sq.dtype == self.sum_sq.dtype:
            # numpy on the kernel's float64 sums: each small torch op costs several µs of dispatch
            sq, sa, am, hist = self._np
            np.add(sq[expert], r.sum_sq.numpy(), out=sq[expert])
            np.add(sa[expert], r.sum_abs.numpy(), out=sa[expert])
            np.maximum(am[expert], r.absmax.numpy(), out=am[expert])
            if r.hist is not None:
                np.add(hist, r.hist.numpy(), out=hist)
            return
        dev = self.sum_sq.device
        self.sum_sq[expert] += r.sum_sq.to(dev, self.sum_sq.dtype)
        self.sum_abs[expert] += r.sum_abs.to(dev, self.sum_abs.dtype)
        self.absmax[expert] = self.absmax[expert].maximum(r.absmax.to(dev))
        if r.hist is not None:
            self.hist += r.hist.to(dev)

    def result(self) -> InputStats:
        """The frozen statistics (numpy)."""
        return InputStats(
            self.n_cols,
            np.asarray(self.count, dtype=np.int64),
            self.sum_sq.double().cpu().numpy(),
            self.absmax.cpu().numpy().astype(np.float32),
            self.sum_abs.double().cpu().numpy(),
            _fold(self.hist.cpu().numpy()),
        )


@dataclass(frozen=True, eq=False)
class HiddenStats:
    """The residual stream after one decoder layer: per-token L2 norms and per-channel absmax."""

    layer: int
    tokens: int
    mean_norm: float
    max_norm: float
    rms: float  # sqrt(mean over tokens and channels of h²)
    absmax: np.ndarray  # float32 (hidden,)

    def __post_init__(self) -> None:
        self.absmax.flags.writeable = False

    @property
    def nbytes(self) -> int:
        """Memory held."""
        return self.absmax.nbytes + 128


class HiddenAccumulator:
    """Running sums for the hidden states after one layer (kept on the device until ``result``)."""

    def __init__(self, layer: int, hidden: int, device: Any) -> None:
        import torch

        self.layer = layer
        self.tokens = 0
        self.sums: Any = torch.zeros(3, dtype=_acc_dtype(device), device=device)  # Σ norms, max norm, Σ h²
        self.absmax = torch.zeros(hidden, dtype=torch.float32, device=device)

    def add(self, h: Any) -> None:
        """Add a batch of hidden states (…, hidden)."""
        import torch

        hf = h.detach().reshape(-1, h.shape[-1]).float()
        if not hf.shape[0]:
            return
        self.tokens += int(hf.shape[0])
        if _compiled(hf) and self.absmax.device.type == "cpu":
            from studio.core.calib._reduce_kernel import hidden_rows

            s_norm, m_norm, s_sq = hidden_rows(hf.contiguous().numpy(), self.absmax.numpy())
            sums = self.sums.numpy()  # a view: numpy scalar updates, not three torch dispatches
            sums[0] += s_norm
            sums[1] = max(sums[1], m_norm)
            sums[2] += s_sq
            return
        sq = hf.square().sum(-1).to(self.sums.dtype)
        norms = sq.sqrt()
        self.sums[0] += norms.sum()
        self.sums[1] = torch.maximum(self.sums[1], norms.max())
        self.sums[2] += sq.sum()
        self.absmax = self.absmax.maximum(hf.abs().amax(0))

    def merge(self, other: HiddenAccumulator) -> None:
        """Add ``other``'s sums (of batches that came after this one's): each batch's sums are added
        whole, so merging per-batch accumulators in order gives the sums of one fed every batch."""
        import torch

        dev = self.sums.device
        o = other.sums.to(dev, self.sums.dtype)
        self.tokens += other.tokens
        self.sums[0] += o[0]
        self.sums[1] = torch.maximum(self.sums[1], o[1])
        self.sums[2] += o[2]
        self.absmax = self.absmax.maximum(other.absmax.to(dev))

    def result(self) -> HiddenStats:
        """The frozen statistics."""
        n = max(self.tokens, 1)
        width = int(self.absmax.shape[0]) or 1
        s_norm, m_norm, s_sq = (float(v) for v in self.sums.cpu())
        return HiddenStats(
            self.layer,
            self.tokens,
            s_norm / n,
            m_norm,
            math.sqrt(s_sq / (n * width)),
            self.absmax.cpu().numpy().astype(np.float32),
        )


_HESSIAN_BLOCK = 1 << 24  # values of a Hessian scaled and rounded to float32 at once (128 MB of float64)


class HessianAccumulator:
    """Σ XᵀX over the rows entering one linear, for GPTQ: ``hessian()`` is ``2 XᵀX / n`` (float32 numpy)."""

    def __init__(self, n_cols: int, device: Any, dtype: Any = None) -> None:
        import torch

        self.n_cols = int(n_cols)
        self.rows = 0
        self.xtx = torch.zeros((n_cols, n_cols), dtype=dtype or _acc_dtype(device), device=device)
        self.last: Any = None

    def add(self, x: Any) -> None:
        """Add rows ``x`` (rows × n_cols)."""
        xf = x.reshape(-1, self.n_cols).to(self.xtx.dtype)
        self.xtx.addmm_(xf.T, xf)
        self.rows += int(xf.shape[0])

    def tensor(self, consume: bool = False) -> Any:
        """``2 XᵀX / n`` as a float32 torch tensor on the accumulator's device (zeros when no row was seen),
        made a block of rows at a time: the scaled float64 copy of a 14336-wide input's sum was another
        1.6 GB beside the sum and its float32 result (the same values: each element is scaled, then rounded).
        ``consume``: the sum is not used again, so a float32 one is scaled in place (no second n × n copy)."""
        import torch

        if consume and self.xtx.dtype == torch.float32:
            if self.rows:
                self.xtx.mul_(2.0 / self.rows)
            out, self.xtx = self.xtx, None
            return out
        out = torch.empty(self.xtx.shape, dtype=torch.float32, device=self.xtx.device)
        per = max(1, _HESSIAN_BLOCK // max(1, self.n_cols))
        for a in range(0, self.n_cols, per):
            part = self.xtx[a : a + per]
            out[a : a + per] = part * (2.0 / self.rows) if self.rows else part
        return out

    def hessian(self) -> np.ndarray:
        """``2 XᵀX / n`` (zeros when no row was seen)."""
        return self.tensor().cpu().numpy()


__all__ = [
    "HIST_BINS",
    "HessianAccumulator",
    "HiddenAccumulator",
    "HiddenStats",
    "InputAccumulator",
    "InputStats",
    "Reduction",
    "hist_edges",
    "merge_input_stats",
]
