"""The one lookup of "which importance vector belongs to this tensor", for every export route."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from studio.core.errors import ExportError

__all__ = ["imatrix_for"]


def imatrix_for(
    imatrix: Mapping[str, Any] | None, names: Sequence[str], n_per_row: int, n_experts: int = 1
) -> np.ndarray | None:
    """The importance values of one tensor as a float32 vector, or None when ``imatrix`` has none.

    ``names``: the keys to try in order (an imatrix is keyed by HF or by GGUF names). The vector has
    ``n_per_row`` values, or ``n_experts × n_per_row`` for merged experts, expert after expert (as
    llama.cpp takes them; one vector for all experts is repeated). ExportError when the sizes disagree.
    """
    if not imatrix:
        return None
    v = next((imatrix[k] for k in names if imatrix.get(k) is not None), None)
    if v is None:
        return None
    v = np.asarray(v, dtype=np.float32).reshape(-1)
    if n_experts > 1 and v.size == n_per_row * n_experts:
        return v
    if n_experts > 1 and v.size == n_per_row:
        return np.tile(v, n_experts)
    if v.size != n_per_row:
        raise ExportError(
            f"The importance matrix for {names[0]!r} has {v.size} values; its rows have {n_per_row}"
            + (f" (x {n_experts} experts)." if n_experts > 1 else ".")
        )
    return v
