"""A sensitivity scan as the window draws it: a layers × roles grid of KLs and the tensors ranked by KL.

Both read one KL per tensor, at one qtype for every tensor (``"Q4_K"``) or at each tensor's own qtype
(a plan's ``HF name → qtype``). Pure functions over ``studio.core.calib.sensitivity.Sensitivity``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from studio.core.modelinfo import Role
from studio.core.quant.types import QTYPES

__all__ = ["SensitivityGrid", "kl_at", "ranked_tensors", "sensitivity_grid"]


def kl_at(tensor: object, qtype: str) -> float | None:
    """The scanned KL of ``tensor`` (a ``TensorSensitivity``) at ``qtype``: 0 for a float type, the
    candidate whose effective (fallback) type is ``qtype`` when it was not scanned under that name, else None."""
    if qtype in QTYPES and QTYPES[qtype].is_float:
        return 0.0
    by_type = tensor.by_type  # type: ignore[attr-defined]
    c = by_type.get(qtype)
    if c is None:
        c = next((v for v in by_type.values() if v.effective == qtype), None)
    return None if c is None else float(c.kl)


def _type_of(types: str | Mapping[str, str], name: str) -> str | None:
    return types if isinstance(types, str) else types.get(name)


@dataclass(frozen=True)
class SensitivityGrid:
    """KL per (layer, role): ``kl[row, col]`` for ``layers[row]`` and ``roles[col]`` (NaN: no tensor).

    ``layers`` lists the block numbers in order, with ``None`` first for the tensors outside the blocks
    (token embedding, output head) when the scan has any; ``names[row][col]`` is the tensor drawn there.
    """

    layers: tuple[int | None, ...]
    roles: tuple[str, ...]
    kl: np.ndarray
    names: tuple[tuple[str | None, ...], ...]

    def name_at(self, row: int, col: int) -> str | None:
        """The tensor of cell (``row``, ``col``), or None outside the grid or on an empty cell."""
        if 0 <= row < len(self.layers) and 0 <= col < len(self.roles):
            return self.names[row][col]
        return None

    def cell_of(self, name: str) -> tuple[int, int] | None:
        """The (row, col) where tensor ``name`` is drawn, or None."""
        for r, row in enumerate(self.names):
            if name in row:
                return r, row.index(name)
        return None


def sensitivity_grid(scan: object, types: str | Mapping[str, str]) -> SensitivityGrid:
    """The layers × roles grid of ``scan``'s KLs at ``types`` (one qtype, or HF name → qtype).

    Roles follow the network's order (``Role``: embedding, attention, feed-forward, output); where several tensors share a cell (the
    experts of one layer) their KLs add up and the cell names the most sensitive one.
    """
    tensors = scan.tensors  # type: ignore[attr-defined]
    order = {r.value: i for i, r in enumerate(Role)}
    roles = tuple(sorted(dict.fromkeys(t.role for t in tensors), key=lambda r: order.get(r, len(order))))
    blocks = sorted({t.layer for t in tensors if t.layer is not None})
    layers: tuple[int | None, ...] = ((None,) if any(t.layer is None for t in tensors) else ()) + tuple(
        blocks
    )
    row_of = {layer: i for i, layer in enumerate(layers)}
    col_of = {role: j for j, role in enumerate(roles)}
    kl = np.full((len(layers), len(roles)), np.nan)
    best = np.full(kl.shape, -np.inf)
    names: list[list[str | None]] = [[None] * len(roles) for _ in layers]
    for t in tensors:
        q = _type_of(types, t.name)
        v = None if q is None else kl_at(t, q)
        if v is None:
            continue
        r, c = row_of[t.layer], col_of[t.role]
        kl[r, c] = v if np.isnan(kl[r, c]) else kl[r, c] + v
        if v > best[r, c]:
            best[r, c], names[r][c] = v, t.name
    return SensitivityGrid(layers, roles, kl, tuple(tuple(n) for n in names))


def ranked_tensors(
    scan: object, types: str | Mapping[str, str], n: int | None = None
) -> tuple[tuple[str, str, float], ...]:
    """``(name, qtype, kl)`` of the ``n`` tensors with the highest KL at ``types`` (all when ``n`` is None),
    most sensitive first."""
    rows = []
    for t in scan.tensors:  # type: ignore[attr-defined]
        q = _type_of(types, t.name)
        v = None if q is None else kl_at(t, q)
        if v is not None:
            rows.append((t.name, q, v))
    rows.sort(key=lambda r: (-r[2], r[0]))
    return tuple(rows if n is None else rows[:n])
