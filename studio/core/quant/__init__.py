"""Quantizers: GGUF block formats byte-identical to llama.cpp, and generic INT/FP8 quantizers for analysis.

Glossary (the words every name and docstring under ``studio.core.quant`` uses):

qtype
    A GGUF tensor type such as ``Q4_K`` or ``F16``: a block format with its geometry; the registry
    of their facts is ``studio.core.quant.types``.
preset
    One of llama.cpp's named mixtures (``Q4_K_M``, ``Q8_0``): rules that give each tensor of a model
    a qtype (``studio.core.plan.presets``). Its llama_ftype number is its ``ftype``.
plan
    The qtype of every tensor of one model (``studio.core.plan.plan.Plan``), made by a preset or
    uniformly and then changed by the plan verbs (``with_types``, ``keep_first_last``, ``with_overrides``).
recipe
    How a plan was made (``studio.core.plan.plan.Recipe``), saved with it, so it can be remade for
    another model.
method
    How the codes and scales of one qtype are chosen: round-to-nearest (``rtn``, what llama.cpp
    does) today; calibrated methods (imatrix, GPTQ, AWQ) choose other codes in the same format.
variant
    One quantized result of a model: a GGUF file written from a plan.

The names below are re-exported lazily, so importing one module of the package (the generic
quantizers, the type registry) pays neither for numba (the block kernels) nor for gguf-py (the registry).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "QTYPES": "types",
    "QTypeInfo": "types",
    "fallback_type": "types",
    "qtype_info": "types",
    "row_bytes": "types",
    "dequantize": "blocks",
    "quantize": "blocks",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"studio.core.quant.{_HOME[name]}"), name)
    raise AttributeError(f"module 'studio.core.quant' has no attribute {name!r}")
