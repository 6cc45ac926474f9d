"""Bit-width sweep of one tensor: how much error each bit width, scale granularity and format costs.

Every INT width in ``SWEEP_BITS`` is tried per tensor, per output channel and per group of
``SWEEP_GROUPS`` values along the input axis, symmetric and asymmetric (``studio.core.quant.generic``),
then FP8 (E4M3, E5M2) and every GGUF type at its own bits per weight (``studio.core.quant.blocks``,
byte-identical to llama.cpp, with llama.cpp's fallback when a row does not fit the type's block).
Each row gets MSE, SNR and cosine from ``studio.core.quant.metrics``.

The cliff: on each INT series (one granularity, one symmetry) it is where the SNR falls below
``CLIFF_SNR_DB``. At 12 dB the error carries 1/16 of the weights' energy (cosine ≈ 0.97). Measured on
SmolLM2-135M (a down projection), llama.cpp's Q3_K gives 16 dB and Q2_K 10 dB, and the whole-model
KL divergence of those presets is 0.15 and 0.41 (``FORMATS.md``): usable above the line, broken
below it.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jobs import JobContext, null_context
from studio.core.quant import generic
from studio.core.quant.metrics import error_metrics
from studio.core.quant.types import QTYPES, fallback_type, row_bytes
from studio.core.stats.tensor_stats import as_matrix_shape, is_transposed

__all__ = [
    "CLIFF_SNR_DB",
    "SWEEP_BITS",
    "SWEEP_GROUPS",
    "Cliff",
    "SweepResult",
    "SweepRow",
    "find_cliffs",
    "sweep_array",
    "sweep_tensor",
]

SWEEP_BITS: tuple[int, ...] = (2, 3, 4, 5, 6, 8, 16)
SWEEP_GROUPS: tuple[int, ...] = (32, 64, 128, 256)
CLIFF_SNR_DB = 12.0

# Values that share one scale in a GGUF type: the sub-block (K-quants keep one super-block of 256).
_SCALE_GROUP = {"Q2_K": 16, "Q3_K": 16, "Q6_K": 16, "Q4_K": 32, "Q5_K": 32, "IQ4_XS": 32}
# Types that store a minimum (or offset) per block besides the scale.
_ASYMMETRIC = frozenset({"Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K"})


@dataclass(frozen=True)
class SweepRow:
    """One quantization of the tensor and its error."""

    scheme: str  # "INT4 sym g32", "FP8 E4M3 per-channel", "Q4_K"
    kind: str  # "int", "fp8" or "gguf"
    bits: int  # bits of each code (a GGUF type's nominal width: 4 for Q4_K)
    granularity: str  # "per-tensor", "per-channel" or "group"
    group: int | None  # values per scale for "group"
    symmetric: bool
    bpw: float  # bits per weight including scales (and zero points or minimums)
    mse: float
    snr_db: float
    cosine: float
    applied: str | None = None  # the GGUF type llama.cpp really uses for these rows (fallback)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (an infinite SNR becomes None)."""
        d = asdict(self)
        d["snr_db"] = self.snr_db if math.isfinite(self.snr_db) else None
        return d


@dataclass(frozen=True)
class Cliff:
    """Where one INT series falls below ``CLIFF_SNR_DB``."""

    granularity: str
    group: int | None
    symmetric: bool
    lowest_good_bits: int | None  # the fewest bits still at or above the line (None: none is)
    bpw_at_line: float | None  # bits per weight where the series crosses the line (interpolated)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True)
class SweepResult:
    """The sweep of one tensor, rows in the order they were measured."""

    tensor: str
    shape: tuple[int, int]  # output channels × input values, as llama.cpp stores it
    rows: tuple[SweepRow, ...]
    cliffs: tuple[Cliff, ...]
    skipped: tuple[str, ...]  # schemes that could not apply, with the reason
    seconds: float
    cliff_snr_db: float = CLIFF_SNR_DB

    def series(
        self, granularity: str, group: int | None = None, symmetric: bool = True
    ) -> tuple[SweepRow, ...]:
        """The INT rows of one granularity and symmetry, fewest bits first (a chart's line)."""
        return tuple(
            sorted(
                (
                    r
                    for r in self.rows
                    if r.kind == "int"
                    and r.granularity == granularity
                    and r.group == group
                    and r.symmetric == symmetric
                ),
                key=lambda r: r.bits,
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """What ``sweep --json`` prints."""
        return {
            "tensor": self.tensor,
            "shape": list(self.shape),
            "rows": [r.to_dict() for r in self.rows],
            "cliff_snr_db": self.cliff_snr_db,
            "cliffs": [c.to_dict() for c in self.cliffs],
            "skipped": list(self.skipped),
            "seconds": self.seconds,
        }


def _int_label(bits: int, symmetric: bool, granularity: str, group: int | None) -> str:
    where = f"g{group}" if granularity == "group" else granularity
    return f"INT{bits} {'sym' if symmetric else 'asym'} {where}"


def _gguf_row(x: np.ndarray, qtype: str, ctx: JobContext) -> SweepRow:
    from studio.core.quant.blocks import dequantize, quantize

    rows, cols = x.shape
    applied = fallback_type(qtype, cols).qtype
    y = np.empty_like(x)
    step = max(1, (1 << 22) // max(cols, 1))  # bounded temporaries on large tensors
    # the sweep has no importance matrix: the types ggml refuses without one (IQ2_XXS, IQ2_XS, IQ1_S)
    # get a flat one, every column alike, so they show as points too
    flat = np.ones(cols, dtype=np.float32) if QTYPES[applied].needs_imatrix else None
    for r0 in range(0, rows, step):
        ctx.check_cancelled()
        r1 = min(rows, r0 + step)
        y[r0:r1] = dequantize(quantize(x[r0:r1], applied, flat), applied, (r1 - r0, cols))
    m = error_metrics(x, y)
    info = QTYPES[applied]
    is_float = info.is_float
    return SweepRow(
        scheme=qtype,
        kind="gguf",
        bits=int(re.search(r"\d+", applied).group()),  # type: ignore[union-attr]
        granularity="per-tensor" if is_float else "group",
        group=None if is_float else _SCALE_GROUP.get(applied, info.block_size),
        symmetric=applied not in _ASYMMETRIC,
        bpw=row_bytes(applied, cols) * 8.0 / cols,
        mse=m.mse,
        snr_db=m.snr_db,
        cosine=m.cosine,
        applied=None if applied == qtype else applied,
    )


def _plan(
    cols: int, bits: tuple[int, ...], groups: tuple[int, ...]
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """(INT configurations to run, skipped notes): groups that do not divide the rows are skipped."""
    grans: list[tuple[str, int | None]] = [("per-tensor", None), ("per-channel", None)]
    skipped = []
    for g in groups:
        if cols % g:
            skipped.append(f"groups of {g}: rows of {cols} values are not a multiple of {g}")
        else:
            grans.append(("group", g))
    return [(b, s, gr, g) for gr, g in grans for s in (True, False) for b in bits], skipped


def sweep_array(
    x: Any,
    *,
    name: str = "",
    bits: tuple[int, ...] = SWEEP_BITS,
    groups: tuple[int, ...] = SWEEP_GROUPS,
    gguf_types: tuple[str, ...] | None = None,
    fp8: bool = True,
    ctx: JobContext | None = None,
) -> SweepResult:
    """Sweep a weight laid out as llama.cpp stores it (rows = output channels); see the module docstring.

    ``gguf_types`` defaults to every quantized GGUF type the studio writes (F16 and BF16 included; IQ2_XXS,
    IQ2_XS and IQ1_S, which need an importance matrix, with a flat one).
    """
    ctx = ctx or null_context()
    t0 = time.monotonic()
    arr = np.asarray(x, dtype=np.float32)
    rows, cols = as_matrix_shape(arr.shape)
    x2 = np.ascontiguousarray(arr.reshape(rows, cols))
    if x2.size == 0:
        raise QuantizationError(f"Tensor {name or '?'} is empty; there is nothing to sweep.")
    if not np.isfinite(x2).all():
        raise QuantizationError(
            f"Tensor {name or '?'} holds {int((~np.isfinite(x2)).sum())} NaN or infinite value(s), so it cannot be swept.",
            hint="Fix or exclude the tensor before quantizing.",
        )
    # by default every type the studio writes (those that need an importance matrix with a flat one)
    types = tuple(q for q in QTYPES if q != "F32") if gguf_types is None else gguf_types
    plan, skipped = _plan(cols, bits, groups)
    fp8_plan = [(f, g) for f in ("e4m3", "e5m2") for g in ("tensor", "channel")] if fp8 else []
    total = len(plan) + len(fp8_plan) + len(types)
    out: list[SweepRow] = []
    done = 0
    for b, sym, gran, g in plan:
        ctx.check_cancelled()
        label = _int_label(b, sym, gran, g)
        ctx.report(done, total, label)
        r = generic.quantize_int(
            x2,
            b,
            symmetric=sym,
            granularity=gran.removeprefix("per-"),
            group_size=g,  # type: ignore[arg-type]
        )
        m = error_metrics(x2, r.dequantized)
        out.append(SweepRow(label, "int", b, gran, g, sym, r.bits_per_weight, m.mse, m.snr_db, m.cosine))
        done += 1
    for fmt, gran in fp8_plan:
        ctx.check_cancelled()
        label = f"FP8 {fmt.upper()} per-{gran}"
        ctx.report(done, total, label)
        r = generic.quantize_fp8(x2, fmt, granularity=gran)  # type: ignore[arg-type]
        m = error_metrics(x2, r.dequantized)
        out.append(
            SweepRow(label, "fp8", 8, f"per-{gran}", None, True, r.bits_per_weight, m.mse, m.snr_db, m.cosine)
        )
        done += 1
    for qtype in types:
        ctx.check_cancelled()
        ctx.report(done, total, qtype)
        out.append(_gguf_row(x2, qtype.upper(), ctx))
        done += 1
    ctx.report(total, total, "sweep done")
    return SweepResult(
        name, (rows, cols), tuple(out), find_cliffs(out), tuple(skipped), time.monotonic() - t0
    )


def find_cliffs(rows: Any, line_db: float = CLIFF_SNR_DB) -> tuple[Cliff, ...]:
    """The cliff of every INT series in ``rows``: the fewest bits at or above ``line_db``."""
    series: dict[tuple[str, int | None, bool], list[SweepRow]] = {}
    for r in rows:
        if r.kind == "int":
            series.setdefault((r.granularity, r.group, r.symmetric), []).append(r)
    out = []
    for (gran, group, sym), rs in series.items():
        rs = sorted(rs, key=lambda r: r.bits)
        good = [r for r in rs if r.snr_db >= line_db]
        lowest = good[0] if good else None
        crossing = None
        for lo, hi in zip(rs, rs[1:], strict=False):
            if lo.snr_db < line_db <= hi.snr_db:
                f = (line_db - lo.snr_db) / (hi.snr_db - lo.snr_db) if math.isfinite(hi.snr_db) else 0.0
                crossing = lo.bpw + f * (hi.bpw - lo.bpw)
        out.append(Cliff(gran, group, sym, lowest.bits if lowest else None, crossing))
    return tuple(out)


def sweep_tensor(checkpoint: Any, name: str, ctx: JobContext | None = None, **kwargs: Any) -> SweepResult:
    """Sweep tensor ``name`` of an opened checkpoint, laid out as llama.cpp quantizes it."""
    if name not in checkpoint:
        raise QuantizationError(
            f"The model has no tensor called {name!r}.",
            hint="List its tensors with quant-studio-cli inspect MODEL.",
        )
    x = checkpoint.read(name)
    rows, cols = as_matrix_shape(x.shape)
    x = x.reshape(rows, cols)
    if is_transposed(checkpoint, name):  # GPT-2 Conv1D stores (in, out); GGUF rows are output channels
        x = np.ascontiguousarray(x.T)
    return sweep_array(x, name=name, ctx=ctx, **kwargs)
