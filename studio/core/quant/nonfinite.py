"""NaN and Inf in a checkpoint's tensors: counted, reported, refused before anything is quantized.

safetensors does not check its values, and llama.cpp writes garbage for a NaN block (it only
notices when it validates a loaded file), so the exporter counts them chunk by chunk and refuses the
tensor with one clear error; ``scan_nonfinite`` lists every damaged tensor of a checkpoint up front.
Covered by tests/core/export/test_export_faults.py::test_nan_and_inf_are_refused_with_tensor_and_count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jobs import JobContext

__all__ = ["NonFinite", "count_nonfinite", "nonfinite_error", "scan_nonfinite"]


@dataclass(frozen=True)
class NonFinite:
    """A tensor holding NaN or Inf values."""

    tensor: str
    nan: int
    inf: int


def count_nonfinite(x: np.ndarray) -> tuple[int, int]:
    """(number of NaN, number of ±Inf) in ``x``."""
    if x.dtype.kind != "f" or x.size == 0:
        return 0, 0
    nan = int(np.count_nonzero(np.isnan(x)))
    inf = int(np.count_nonzero(np.isinf(x)))
    return nan, inf


def nonfinite_error(name: str, nan: int, inf: int, path: Any = None) -> QuantizationError:
    """The error for a tensor with NaN/Inf values."""
    where = f" of {path}" if path is not None else ""
    return QuantizationError(
        f"Tensor {name!r}{where} contains {nan} NaN and {inf} Inf values; refusing to quantize it.",
        hint="The checkpoint is damaged or was saved after a diverged step; fix or re-download it.",
    )


def scan_nonfinite(
    checkpoint: Any, names: Iterable[str] | None = None, ctx: JobContext | None = None
) -> list[NonFinite]:
    """Read every (or the named) tensor of an opened checkpoint and list those with NaN/Inf."""
    names = list(names) if names is not None else [t.name for t in checkpoint.info.tensors]
    bad: list[NonFinite] = []
    for i, name in enumerate(names):
        if ctx is not None:
            ctx.check_cancelled()
            ctx.report(i, len(names), f"scanning {name}")
        nan, inf = count_nonfinite(np.asarray(checkpoint.read(name)))
        if nan or inf:
            bad.append(NonFinite(name, nan, inf))
    if ctx is not None:
        ctx.report(len(names), len(names), "scan done")
    return bad
