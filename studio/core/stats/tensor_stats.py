"""Statistics of one weight tensor, streamed from disk in row chunks: histogram, per-channel absmax, outliers, |W| heat map.

Two passes over the rows keep memory bounded by one chunk plus the per-channel vectors: the first
finds the range, the moments' mean, the per-channel absmax, the heat map and a log-scale histogram
of |x|; the second bins the values over the now-known range and sums the central moments.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.jobs import JobContext, null_context
from studio.core.model.adapters import adapter_for
from studio.core.model.checkpoint import bf16_to_f32
from studio.core.stats.cache import StatsCache, cache_key

__all__ = [
    "DEFAULT_BINS",
    "DEFAULT_CHUNK_ELEMENTS",
    "HEATMAP_MAX",
    "AbsDistribution",
    "Histogram",
    "OutlierRule",
    "OutlierKind",
    "RowReader",
    "TensorStats",
    "as_matrix_shape",
    "compute_stats",
    "bin_edges",
    "histogram",
    "heatmap_blocks",
    "is_transposed",
    "prepare_kernels",
    "row_reader",
    "stats_of_array",
    "tensor_stats",
]

DEFAULT_BINS = 256
HEATMAP_MAX = 512
# 4 Mi elements (16 MB of float32) per chunk: big enough that numpy's per-call overhead vanishes,
# small enough that a 600M-element embedding never needs more than a few chunk-sized temporaries.
DEFAULT_CHUNK_ELEMENTS = 1 << 22

# |x| is binned by the top 16 bits of its float32 pattern: 128 bins per octave (0.55 % wide), exact
# and branch-free, and it needs no range known in advance.
_ABS_SHIFT = 16
_ABS_KEYS = 1 << (31 - _ABS_SHIFT)
_FINITE_KEYS = 0x7F80_0000 >> _ABS_SHIFT  # keys from here on are inf or NaN

RowReader = Callable[[int, int], np.ndarray]
"""``read(start, stop)`` -> float32 array of rows ``start:stop`` (2-D, any strides)."""


class OutlierKind(str, Enum):
    """How an outlier threshold is set."""

    K_MEDIAN = "k_median"  # more than k times the median of the values compared
    ABS = "abs"  # larger than a fixed magnitude (LLM.int8() uses 6.0)


@dataclass(frozen=True)
class OutlierRule:
    """A threshold rule applied to channel absmax values or to element magnitudes."""

    kind: OutlierKind = OutlierKind.K_MEDIAN
    value: float = 5.0

    @classmethod
    def llm_int8(cls) -> OutlierRule:
        """|x| > 6, the outlier threshold of LLM.int8()."""
        return cls(OutlierKind.ABS, 6.0)

    def threshold(self, median: float) -> float:
        """The magnitude above which a value is an outlier, given the median of the values compared."""
        return float(self.value) if self.kind is OutlierKind.ABS else float(self.value) * float(median)

    def mask(self, values: np.ndarray) -> np.ndarray:
        """Boolean mask of the outliers among ``values`` (e.g. the absmax of each channel)."""
        values = np.asarray(values)
        if values.size == 0:
            return np.zeros(values.shape, dtype=bool)
        return values > self.threshold(float(np.median(values)) if self.kind is OutlierKind.K_MEDIAN else 0.0)

    def label(self) -> str:
        """Short text for a legend, e.g. ``"> 5 × median"``."""
        if self.kind is OutlierKind.ABS:
            return f"|x| > {self.value:g}"
        return f"> {self.value:g} × median"


@dataclass(frozen=True, eq=False)
class Histogram:
    """Counts over uniform bins; ``edges`` has one more entry than ``counts``."""

    edges: np.ndarray  # float64, n + 1
    counts: np.ndarray  # int64, n

    @property
    def centers(self) -> np.ndarray:
        """Bin centres."""
        return 0.5 * (self.edges[:-1] + self.edges[1:])

    def log_counts(self) -> np.ndarray:
        """``log10(1 + counts)``: a log scale on which empty bins stay drawable at zero."""
        return np.log10(1.0 + self.counts.astype(np.float64))


@dataclass(frozen=True, eq=False)
class AbsDistribution:
    """The distribution of |x|: a sorted strided sample for the bulk, exact log-binned counts for the tail.

    Every value above ``tail_from`` is counted in ``tail_counts`` (bins of 1/128 octave keyed by the
    top 16 bits of the float32 pattern, starting at key ``tail_first_key``), so the share of rare
    outliers is exact to within one such bin; below ``tail_from`` shares come from the sample.
    """

    n: int  # finite values described
    sample: np.ndarray  # float32, sorted |x| of every ``stride``-th element
    stride: int
    tail_from: float
    tail_first_key: int
    tail_counts: np.ndarray  # int64

    def share_above(self, t: float) -> float:
        """Share of the values with |x| > ``t``."""
        if self.n == 0:
            return 0.0
        t = abs(float(t))
        if self.stride == 1:
            return float(self.sample.size - np.searchsorted(self.sample, t, side="right")) / self.n
        if t < self.tail_from or self.tail_counts.size == 0:
            return float(self.sample.size - np.searchsorted(self.sample, t, side="right")) / max(
                self.sample.size, 1
            )
        if t >= float(np.finfo(np.float32).max):
            return 0.0
        bits = int(np.array(t, dtype=np.float32).view(np.uint32))
        key = bits >> _ABS_SHIFT
        i = key - self.tail_first_key
        if i < 0:
            return float(self.tail_counts.sum()) / self.n
        if i >= self.tail_counts.size:
            return 0.0
        above = float(self.tail_counts[i + 1 :].sum())
        # The part of t's own bin above t, linear in float32-pattern space (log-linear within one bin).
        frac = (((key + 1) << _ABS_SHIFT) - bits) / float(1 << _ABS_SHIFT)
        return (above + frac * float(self.tail_counts[i])) / self.n

    def quantile(self, q: float) -> float:
        """The value below which a share ``q`` of |x| lies (from the sample)."""
        if self.sample.size == 0:
            return 0.0
        return float(np.quantile(self.sample, q))


@dataclass(frozen=True, eq=False)
class TensorStats:
    """Everything the inspector shows for one tensor, oriented as [output channels, input channels]."""

    name: str
    shape: tuple[int, ...]
    n: int  # all elements
    n_nonfinite: int  # NaN or inf, left out of every statistic below
    min: float
    max: float
    mean: float
    std: float
    kurtosis: float  # excess kurtosis (0 for a normal distribution)
    hist: Histogram  # of the values, uniform bins over [min, max]
    abs_dist: AbsDistribution  # of |x|, for shares and quantiles under any threshold
    absmax_out: np.ndarray  # float32, one per output channel (the scale a per-channel quantizer uses)
    absmax_in: np.ndarray  # float32, one per input channel (outlier features show here)
    heatmap: np.ndarray | None  # float32 block max of |W|, at most HEATMAP_MAX × HEATMAP_MAX
    heat_block: tuple[int, int]  # rows × columns of W pooled into one heat-map pixel
    transposed: bool = False  # stored as [in, out] (GPT-2 Conv1D) and turned around here

    def __post_init__(self) -> None:
        # Shared between workers, the cache and the GUI: nobody may change them after the fact.
        for a in (
            self.hist.edges,
            self.hist.counts,
            self.absmax_out,
            self.absmax_in,
            self.heatmap,
            self.abs_dist.sample,
            self.abs_dist.tail_counts,
        ):
            if a is not None:
                a.flags.writeable = False

    def heat_levels(self, q: float = 99.5) -> tuple[float, float]:
        """Colour range for the heat map: 0 to the ``q``-th percentile, so outlier columns saturate
        while the ordinary weights stay visible."""
        if self.heatmap is None or self.heatmap.size == 0:
            return 0.0, 1.0
        hi = float(np.percentile(self.heatmap, q))
        return 0.0, hi if hi > 0 else max(float(self.heatmap.max()), 1.0)

    @property
    def median_abs(self) -> float:
        """Median of |x| (to within 0.55 %)."""
        return self.abs_dist.quantile(0.5)

    @property
    def absmax(self) -> float:
        """Largest magnitude."""
        return max(abs(self.min), abs(self.max)) if self.n > self.n_nonfinite else 0.0

    def element_outlier_share(self, rule: OutlierRule) -> float:
        """Share of elements whose |x| exceeds ``rule`` (k × median|x|, or a fixed magnitude)."""
        return self.abs_dist.share_above(rule.threshold(self.median_abs))

    def outlier_channels(self, rule: OutlierRule, axis: str = "in") -> np.ndarray:
        """Indices of the channels (``"in"`` or ``"out"``) whose absmax exceeds ``rule``."""
        values = self.absmax_in if axis == "in" else self.absmax_out
        return np.flatnonzero(rule.mask(values))

    def scale_ratio(self, axis: str = "out") -> float:
        """Largest over median channel absmax: how much a per-tensor scale wastes on the typical channel."""
        values = self.absmax_out if axis == "out" else self.absmax_in
        if values.size == 0:
            return float("nan")
        med = float(np.median(values))
        return float(values.max()) / med if med > 0 else float("inf")

    @property
    def nbytes(self) -> int:
        """Memory held by the arrays (for cache budgets)."""
        heat = 0 if self.heatmap is None else self.heatmap.nbytes
        return (
            self.hist.edges.nbytes
            + self.hist.counts.nbytes
            + self.abs_dist.sample.nbytes
            + self.abs_dist.tail_counts.nbytes
            + self.absmax_out.nbytes
            + self.absmax_in.nbytes
            + heat
            + 512
        )


def as_matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """Rows × columns the statistics treat a tensor as: 1-D is one row, N-D folds the trailing axes."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(shape[0]), int(math.prod(shape[1:]))


def heatmap_blocks(rows: int, cols: int, max_size: int = HEATMAP_MAX) -> tuple[int, int]:
    """Rows and columns pooled into one heat-map pixel so that the map is at most ``max_size`` square."""
    return max(1, -(-rows // max_size)), max(1, -(-cols // max_size))


def bin_edges(bins: int, lo: float, hi: float) -> np.ndarray:
    """The float64 edges of ``bins`` uniform bins over [lo, hi], as ``np.histogram`` makes them."""
    lo, hi = _range(lo, hi)
    return np.histogram_bin_edges(np.empty(0, np.float64), bins=bins, range=(lo, hi))


def _range(lo: float, hi: float) -> tuple[np.float64, np.float64]:
    if not hi > lo:  # one distinct value: numpy widens the same way
        lo, hi = lo - 0.5, hi + 0.5
    return np.float64(lo), np.float64(hi)


_HIST_BLOCK = 1 << 16  # float32 scratch of 256 KB stays in L2 cache
# Above this many elements the compiled kernel splits the work over threads (it releases the GIL).
_PARALLEL_MIN = 1 << 22


def prepare_kernels() -> bool:
    """Load (or compile) the histogram kernel now; True when the compiled path is available.

    Loading numba holds the GIL for up to a few hundred milliseconds; a GUI calls this once in a
    background job soon after start-up so that no later statistics job pays it.
    """
    return _compiled_kernel() is not None


@functools.cache
def _compiled_kernel() -> Any:
    """The numba histogram kernel, compiled (or loaded from numba's cache) on first use; None without numba."""
    try:
        from studio.core.stats import _hist_kernel

        kernel = _hist_kernel.histogram_into
        ro = np.zeros(1, np.float32)
        ro.flags.writeable = False  # a weight read from a file: numba compiles read-only arrays apart
        for x in (np.zeros(1, np.float32), ro):  # compile both now, not in the first statistics job
            kernel(x, 0.0, 1.0, np.array([0.0, 1.0]), np.zeros(1, np.int64))
    except Exception:  # numba missing or unable to compile here: the numpy path is exact too
        return None
    return kernel


def histogram(x: np.ndarray, bins: int, lo: float, hi: float, *, threads: int | None = None) -> np.ndarray:
    """Counts of ``x`` in ``bins`` uniform bins over [lo, hi], equal to ``np.histogram(x, bin_edges(...))``.

    One compiled pass when numba is available (split over threads for large inputs); otherwise the
    bin of each value is computed in float32 with numpy and recomputed exactly against the float64
    edges wherever rounding could put it one bin off. ``x`` must be finite; values outside [lo, hi]
    are counted in the end bins.
    """
    edges = bin_edges(bins, lo, hi)
    flat = np.asarray(x).reshape(-1)
    if flat.dtype != np.float32:
        flat = flat.astype(np.float32)
    kernel = _compiled_kernel()
    if kernel is not None:
        return _histogram_compiled(kernel, flat, edges, threads)
    return _histogram_numpy(flat, edges)


def _histogram_compiled(kernel: Any, flat: np.ndarray, edges: np.ndarray, threads: int | None) -> np.ndarray:
    bins = edges.size - 1
    lo, scale = float(edges[0]), bins / float(edges[-1] - edges[0])
    n_threads = threads or min(8, os.cpu_count() or 1)
    if n_threads <= 1 or (threads is None and flat.size < _PARALLEL_MIN):
        counts = np.zeros(bins, np.int64)
        kernel(flat, lo, scale, edges, counts)
        return counts

    parts = np.array_split(flat, n_threads)
    outs = [np.zeros(bins, np.int64) for _ in parts]
    with ThreadPoolExecutor(n_threads) as pool:
        list(pool.map(lambda po: kernel(po[0], lo, scale, edges, po[1]), zip(parts, outs, strict=True)))
    return np.sum(outs, axis=0)


def _histogram_numpy(flat: np.ndarray, edges: np.ndarray) -> np.ndarray:
    bins = edges.size - 1
    lo64, hi64 = edges[0], edges[-1]
    counts = np.zeros(bins, np.int64)
    lo32 = np.float32(lo64)
    scale = np.float32(bins / (hi64 - lo64))
    # float32 error of (x - lo) * scale is a few ulps of a number <= bins; anything closer than eps to
    # an integer (a bin edge) is recomputed exactly.
    eps = np.float32(bins * 1e-6 + 1e-5)
    m = min(_HIST_BLOCK, flat.size)
    f = np.empty(m, np.float32)
    g = np.empty(m, np.float32)
    idx = np.empty(m, np.int32)
    sus = np.empty(m, bool)
    tmp = np.empty(m, bool)
    for s in range(0, flat.size, _HIST_BLOCK):
        xb = flat[s : s + _HIST_BLOCK]
        k = xb.size
        fb, gb, ib, sb, tb = f[:k], g[:k], idx[:k], sus[:k], tmp[:k]
        np.subtract(xb, lo32, out=fb)
        fb *= scale
        np.floor(fb, out=gb)
        np.subtract(fb, gb, out=fb)  # fractional position inside the bin
        np.less(fb, eps, out=sb)
        np.greater(fb, 1 - eps, out=tb)
        sb |= tb
        np.clip(gb, 0, bins - 1, out=gb)
        ib[:] = gb
        if sb.any():
            where = np.flatnonzero(sb)
            exact = np.searchsorted(edges, xb[where].astype(np.float64), side="right") - 1
            ib[where] = np.clip(exact, 0, bins - 1)
        counts += np.bincount(ib, minlength=bins)
    return counts


def _row_step(rows: int, cols: int, fr: int, chunk_elements: int) -> int:
    step = max(1, chunk_elements // max(cols, 1))
    return max(fr, (step // fr) * fr)  # whole heat-map rows per chunk


def _pool(a: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """Block max of a 2-D array over fr × fc blocks (the last blocks may be partial)."""
    r, c = a.shape
    rf = (r // fr) * fr
    parts = []
    if rf:
        parts.append(a[:rf].reshape(r // fr, fr, c).max(axis=1))
    if rf < r:
        parts.append(a[rf:].max(axis=0, keepdims=True))
    p = parts[0] if len(parts) == 1 else np.concatenate(parts)
    cf = (c // fc) * fc
    cols = []
    if cf:
        cols.append(p[:, :cf].reshape(p.shape[0], c // fc, fc).max(axis=2))
    if cf < c:
        cols.append(p[:, cf:].max(axis=1, keepdims=True))
    return cols[0] if len(cols) == 1 else np.concatenate(cols, axis=1)


_SAMPLE_TARGET = 1 << 16
_TAIL_QUANTILE = 0.99


def _sample_stride(n: int, cols: int) -> int:
    if n <= _SAMPLE_TARGET:
        return 1
    stride = n // _SAMPLE_TARGET | 1
    while math.gcd(stride, cols) != 1:  # never walk down one column only
        stride += 2
    return stride


def compute_stats(
    read: RowReader,
    shape: tuple[int, ...],
    *,
    name: str = "",
    bins: int = DEFAULT_BINS,
    heatmap: bool = True,
    heatmap_max: int = HEATMAP_MAX,
    transposed: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ctx: JobContext | None = None,
) -> TensorStats:
    """Statistics of a tensor read in row chunks through ``read``; ``shape`` is the stored shape.

    ``transposed`` says the tensor is stored as [in, out]; the per-channel vectors and the heat map
    are then swapped so that "out" always means output channels.
    """
    ctx = ctx or null_context()
    rows, cols = as_matrix_shape(tuple(shape))
    n = rows * cols
    if n == 0:
        raise StudioError(f"Tensor {name or '?'} has no elements, so it has no statistics.")
    fr, fc = heatmap_blocks(rows, cols, heatmap_max)
    step = _row_step(rows, cols, fr, chunk_elements)
    n_chunks = -(-rows // step)
    stride = _sample_stride(n, cols)

    # -- pass 1: range, sum, per-channel absmax, heat map, |x| sample and tail --------------------------
    row_absmax = np.zeros(rows, np.float32)
    col_absmax = np.zeros(cols, np.float32)
    heat_rows: list[np.ndarray] = []
    samples: list[np.ndarray] = []
    tail_counts = np.zeros(_ABS_KEYS, np.int64)
    tail_from: float | None = None
    lo, hi = math.inf, -math.inf
    total = 0.0
    nonfinite = 0
    for k, r0 in enumerate(range(0, rows, step)):
        ctx.check_cancelled()
        r1 = min(rows, r0 + step)
        c = _chunk(read, r0, r1, cols)
        a = np.abs(c)
        cmin, cmax = float(c.min()), float(c.max())
        clean = math.isfinite(cmin) and math.isfinite(cmax)
        if clean:
            total += float(c.sum(dtype=np.float64))
        else:
            bad = ~np.isfinite(c)
            nonfinite += int(bad.sum())
            a[bad] = 0.0
            good = c[~bad]
            cmin, cmax = (float(good.min()), float(good.max())) if good.size else (math.inf, -math.inf)
            total += float(good.sum(dtype=np.float64))
        lo, hi = min(lo, cmin), max(hi, cmax)
        row_absmax[r0:r1] = a.max(axis=1)
        pooled = _pool(a, fr, 1)  # rows pooled, all columns: gives column absmax and the heat map
        np.maximum(col_absmax, pooled.max(axis=0), out=col_absmax)
        if heatmap:
            heat_rows.append(_pool(pooled, 1, fc))
        flat = a.reshape(-1)
        offset = (-r0 * cols) % stride
        s = flat[offset::stride]
        if not clean:  # NaN/inf (zeroed in a) stay out of the sample
            s = s[np.isfinite(c.reshape(-1)[offset::stride])]
        samples.append(s.copy())
        if tail_from is None:
            # The tail starts near the 99th percentile of the first chunk: rare enough to be cheap,
            # low enough that any outlier threshold worth asking about lies inside it.
            first = samples[-1] if samples[-1].size >= 100 else flat
            tail_from = float(np.quantile(first, _TAIL_QUANTILE)) if first.size else 0.0
        tail = a[a > tail_from]
        if tail.size:
            tail_counts += np.bincount(tail.view(np.uint32) >> _ABS_SHIFT, minlength=_ABS_KEYS)
        ctx.report(k + 1, 2 * n_chunks, f"{name}: scanning")
    tail_counts[_FINITE_KEYS:] = 0
    n_finite = n - nonfinite
    if n_finite == 0:
        raise StudioError(
            f"Tensor {name or '?'} holds only NaN or infinite values; re-download or re-export it."
        )
    mean = total / n_finite

    # -- pass 2: histogram over the known range, central moments ------------------------------------
    counts = np.zeros(bins, np.int64)
    m2 = m4 = 0.0
    mean32 = np.float32(mean)
    for k, r0 in enumerate(range(0, rows, step)):
        ctx.check_cancelled()
        r1 = min(rows, r0 + step)
        c = _chunk(read, r0, r1, cols).reshape(-1)
        if nonfinite:
            c = c[np.isfinite(c)]
        counts += histogram(c, bins, lo, hi)
        d = c - mean32
        d *= d
        m2 += float(d.sum(dtype=np.float64))
        d *= d
        m4 += float(d.sum(dtype=np.float64))
        ctx.report(n_chunks + k + 1, 2 * n_chunks, f"{name}: histogram")
    # Central moments about the float32-rounded mean; correct m2 for the rounding offset.
    delta = float(mean32) - mean
    var = max(m2 / n_finite - delta * delta, 0.0)
    std = math.sqrt(var)
    kurt = (m4 / n_finite) / (var * var) - 3.0 if var > 0 else float("nan")

    nz = np.flatnonzero(tail_counts)
    first_key, last_key = (int(nz[0]), int(nz[-1])) if nz.size else (0, -1)
    sample = np.sort(np.concatenate(samples)) if samples else np.zeros(0, np.float32)
    abs_dist = AbsDistribution(
        n=n_finite,
        sample=sample,
        stride=stride,
        tail_from=float(tail_from or 0.0),
        tail_first_key=first_key,
        tail_counts=tail_counts[first_key : last_key + 1].copy(),
    )
    heat = np.concatenate(heat_rows) if heatmap else None
    absmax_out, absmax_in = (col_absmax, row_absmax) if transposed else (row_absmax, col_absmax)
    if heat is not None and transposed:
        heat = np.ascontiguousarray(heat.T)
    return TensorStats(
        name=name,
        shape=tuple(int(s) for s in shape),
        n=n,
        n_nonfinite=nonfinite,
        min=float(lo),
        max=float(hi),
        mean=float(mean),
        std=std,
        kurtosis=float(kurt),
        hist=Histogram(bin_edges(bins, lo, hi), counts),
        abs_dist=abs_dist,
        absmax_out=absmax_out,
        absmax_in=absmax_in,
        heatmap=heat,
        heat_block=(fc, fr) if transposed else (fr, fc),
        transposed=transposed,
    )


def _chunk(read: RowReader, r0: int, r1: int, cols: int) -> np.ndarray:
    c = np.asarray(read(r0, r1))
    if c.dtype != np.float32:
        c = c.astype(np.float32)
    return c.reshape(r1 - r0, cols)


def stats_of_array(
    x: np.ndarray,
    *,
    name: str = "",
    bins: int = DEFAULT_BINS,
    heatmap: bool = True,
    transposed: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ctx: JobContext | None = None,
) -> TensorStats:
    """Statistics of an in-memory (or memory-mapped) array, read in row chunks without copying it."""
    arr = np.asarray(x)
    rows, cols = as_matrix_shape(arr.shape)
    m = arr.reshape(rows, cols)
    return compute_stats(
        lambda r0, r1: m[r0:r1],
        arr.shape,
        name=name,
        bins=bins,
        heatmap=heatmap,
        transposed=transposed,
        chunk_elements=chunk_elements,
        ctx=ctx,
    )


def row_reader(checkpoint: Any, name: str) -> RowReader:
    """Read rows of ``name`` from an opened checkpoint as float32, converting one chunk at a time.

    Plain float storage (F32/F16/BF16, from safetensors or GGUF) is memory-mapped and converted per
    chunk; other storage (GGUF blocks, FP8) is decoded whole by the checkpoint first.
    """
    info = checkpoint.info.tensor(name)
    rows, cols = as_matrix_shape(info.shape)
    if info.dtype in _STREAMABLE:
        raw = np.asarray(checkpoint.read_raw(name))
        if raw.size == rows * cols:
            m = raw.reshape(rows, cols)
            if info.dtype == "BF16":
                return lambda r0, r1: bf16_to_f32(m[r0:r1])
            return lambda r0, r1: np.asarray(m[r0:r1], dtype=np.float32)  # F32: a view of the map, no copy
    full = checkpoint.read(name).reshape(rows, cols)
    return lambda r0, r1: full[r0:r1]


_STREAMABLE = frozenset({"F32", "F16", "BF16", "F64"})


def is_transposed(checkpoint: Any, name: str) -> bool:
    """Whether the architecture stores ``name`` as [in, out] (GPT-2's Conv1D weights)."""
    info = checkpoint.info
    if getattr(info.format, "value", info.format) == "gguf":
        return False
    try:
        return bool(adapter_for(info.model_type, info.architecture).is_transposed(name))
    except Exception:  # an adapter problem must not block statistics; the layout is then as stored
        return False


def tensor_stats(
    checkpoint: Any,
    name: str,
    *,
    cache: StatsCache | None = None,
    bins: int = DEFAULT_BINS,
    heatmap: bool = True,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ctx: JobContext | None = None,
) -> TensorStats:
    """Statistics of tensor ``name`` of an opened checkpoint, streamed from disk and cached per file+name+mtime."""
    info = checkpoint.info.tensor(name)

    def compute() -> TensorStats:
        return compute_stats(
            row_reader(checkpoint, name),
            info.shape,
            name=name,
            bins=bins,
            heatmap=heatmap,
            transposed=is_transposed(checkpoint, name),
            chunk_elements=chunk_elements,
            ctx=ctx,
        )

    if cache is None:
        return compute()
    return cache.get_or_compute(cache_key(info, f"stats:bins={bins}:heat={int(heatmap)}"), compute, ctx)
