"""A made-up sensitivity scan with a model's real sizes, for the allocator's and the budget dialog's tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


def synthetic_scan(info, kl: Mapping[str, float]):
    """The scan of ``info`` at the qtypes of ``kl`` whose KLs are made up: ``kl[effective type]`` × (1 + i)
    for the i-th tensor (later tensors weigh more); only the bytes and fallbacks are the model's."""
    from studio.core.calib.sensitivity import sizes_only

    base = sizes_only(info, tuple(kl))
    tensors = tuple(
        dataclasses.replace(
            t,
            by_type={
                q: dataclasses.replace(c, kl=kl[c.effective] * (1 + i), measured=True)
                for q, c in t.by_type.items()
            },
        )
        for i, t in enumerate(base.tensors)
    )
    return dataclasses.replace(base, tensors=tensors, mode="exact", method="imatrix")
