"""Plan with the copies the export makes: a GGUF original's stored type costs a tensor no error.

The export of a folder converted from a GGUF copies a tensor whose planned type is its stored type
(``studio.core.export.source_copy``, llama-quantize's rule), so choosing that type adds no error at all.
The sensitivity scan measures it as every other candidate, by rounding the dequantized values again,
which adds a small error the file will never have (about 1 % relative on Q4_K). ``with_stored_copies``
sets those candidates' KL and error to zero, so the planner sees that keeping a Q4_K_M-born model's Q4_K
tensor at Q4_K is free. It applies only where the export really copies: an unrotated model and a method
that leaves the weights as they are (AWQ rescales them).
"""

from __future__ import annotations

import dataclasses
import os

from studio.core.export.source_copy import stored_source
from studio.core.plan.scan import Sensitivity

COPYING_METHODS = frozenset({"rtn", "imatrix", "gptq"})  # methods that write a tensor's own values


def with_stored_copies(
    scan: Sensitivity, folder: str | os.PathLike[str], method: str
) -> tuple[Sensitivity, str]:
    """(``scan`` with KL 0 for each tensor's candidate at its stored type in the GGUF ``folder`` was
    converted from, a note saying how many); (``scan``, "") where the export would not copy."""
    if scan.rotation is not None or method not in COPYING_METHODS:
        return scan, ""
    stored = stored_source(folder)
    if stored is None:
        return scan, ""
    tensors, n = [], 0
    for t in scan.tensors:
        s = stored.tensors.get(t.gguf_name)
        c = None if s is None else t.by_type.get(s.type_name)
        if c is None or not c.usable or c.effective != s.type_name or c.bytes != s.nbytes or c.kl == 0.0:
            tensors.append(t)
            continue
        by_type = {**t.by_type, s.type_name: dataclasses.replace(c, kl=0.0, error=0.0)}
        tensors.append(dataclasses.replace(t, by_type=by_type))
        n += 1
    if not n:
        return scan, ""
    note = (
        f"{n} tensor(s) cost no error at their stored type in {stored.path.name}: the export copies them "
        "from it unchanged, so the plan counts them at KL 0."
    )
    return dataclasses.replace(scan, tensors=tuple(tensors)), note


__all__ = ["COPYING_METHODS", "with_stored_copies"]
