"""The budget planner's default type menu: every type llama.cpp writes, less the ones only a model trained
for them survives (``TRAINED_ONLY_TYPES``: ternary, 1- and 2-bit), unless the model's metadata says it was
trained for them.

Why: Q2_0 on the demo's tied embedding measured 33.8 nats of KL (llama.cpp's own Q2_0 preset 12.4); a
scan of a float model can price such a type, but the price is a collapse, and one mis-measured candidate
used to be enough to ship it. A user who names them (``--types``) still gets them, with every guarantee.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from studio.core.plan.scan import TRAINED_ONLY_TYPES

_TRAINED_METHODS = frozenset({"bitnet"})  # quantization_config.quant_method of ternary-trained checkpoints


def trained_for_low_bit(config: Mapping[str, Any] | None) -> bool:
    """Whether a Hugging Face ``config`` says the weights were trained for ternary or 1-2-bit types
    (BitNet: ``architectures`` BitNet…, or ``quantization_config.quant_method`` "bitnet")."""
    if not config:
        return False
    archs = config.get("architectures") or ()
    if any("bitnet" in str(a).lower() for a in (archs if isinstance(archs, list | tuple) else (archs,))):
        return True
    if "bitnet" in str(config.get("model_type") or "").lower():
        return True
    qc = config.get("quantization_config")
    return isinstance(qc, Mapping) and str(qc.get("quant_method") or "").lower() in _TRAINED_METHODS


def default_menu(types: Sequence[str], config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """``types`` (a scan's default candidates) less ``TRAINED_ONLY_TYPES``, unless ``config`` says the model
    was trained for them (then all of ``types``)."""
    if trained_for_low_bit(config):
        return tuple(types)
    return tuple(q for q in types if q not in TRAINED_ONLY_TYPES)


__all__ = ["default_menu", "trained_for_low_bit"]
