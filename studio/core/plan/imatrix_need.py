"""Which tensors of a plan need an importance matrix, and the refusal when none is given.

Two rules, as in the pinned llama.cpp: ggml refuses to quantize IQ2_XXS, IQ2_XS and IQ1_S without
one (``ggml_quantize_requires_imatrix``), and llama-quantize refuses the very low-bit types on every
tensor but the token embedding and the output (``tensor_requires_imatrix``: IQ1_S, IQ1_M, IQ2_XXS,
IQ2_XS, IQ2_S, IQ3_XXS, and Q2_K in a Q2_K_S file). The studio refuses the same plans, before any
work, in one sentence that names the tensors and offers calibration.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from studio.core.errors import QuantizationError
from studio.core.gguf.layout import layout
from studio.core.quant.types import QTYPES, ftype_of

LLAMA_IMATRIX_TYPES: frozenset[str] = frozenset({"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"})
"""The types llama-quantize's ``tensor_requires_imatrix`` refuses without an importance matrix."""

_EXEMPT = frozenset({"token_embd.weight", "per_layer_token_embd.weight", "output.weight"})
_Q2_K_S = ftype_of("Q2_K_S")
_SHOWN = 3  # tensor names a message spells out


class ImatrixRequiredError(QuantizationError):
    """A plan gives tensors a type that needs an importance matrix, and none (or not theirs) was given."""

    def __init__(self, message: str, tensors: tuple[str, ...], *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.tensors = tensors


def tensor_needs_imatrix(gguf_name: str, qtype: str, ftype: int | None = None) -> bool:
    """Whether llama.cpp refuses to write GGUF tensor ``gguf_name`` as ``qtype`` without an importance
    matrix, in a file whose general.file_type is ``ftype``."""
    info = QTYPES.get(qtype)
    if info is not None and info.needs_imatrix:
        return True  # ggml itself refuses, whatever the tensor
    if gguf_name in _EXEMPT:
        return False
    return qtype in LLAMA_IMATRIX_TYPES or (qtype == "Q2_K" and ftype == _Q2_K_S)


def tensors_needing_imatrix(
    plan: Any, info: Any, *, exclude: Container[str] = ()
) -> tuple[tuple[str, str, str], ...]:
    """(HF name, GGUF name, qtype) of every tensor of ``plan`` that needs an importance matrix, in file
    order; ``exclude``: HF names already quantized another way (a calibrated run's tensors)."""
    out = []
    for tm in layout(info).tensors:
        qtype = plan.types.get(tm.hf_name)
        if qtype is None or tm.hf_name in exclude:
            continue
        if tensor_needs_imatrix(tm.gguf_name, qtype, plan.ftype):
            out.append((tm.hf_name, tm.gguf_name, qtype))
    return tuple(out)


def requirement_text(plan: Any, need: tuple[tuple[str, str, str], ...]) -> str:
    """The sentence that names what needs an importance matrix ("" when nothing does)."""
    if not need:
        return ""
    names = [g for _, g, _ in need]
    shown = ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
    types = "/".join(sorted({q for _, _, q in need}))
    what = "tensor" if len(names) == 1 else f"{len(names)} tensors"
    return f"{plan.name} needs an importance matrix for {what} at {types} ({shown})"


def check_imatrix(
    plan: Any, info: Any, imatrix: Mapping[str, Any] | None, *, exclude: Container[str] = ()
) -> None:
    """Refuse ``plan`` (ImatrixRequiredError) when a tensor that needs an importance matrix has none in
    ``imatrix`` (keyed by HF or GGUF names); ``exclude``: HF names quantized another way."""
    need = tensors_needing_imatrix(plan, info, exclude=exclude)
    missing = tuple(
        n for n in need if not imatrix or (imatrix.get(n[0]) is None and imatrix.get(n[1]) is None)
    )
    if not missing:
        return
    given = "none was given" if not imatrix else "the importance matrix given has none for them"
    raise ImatrixRequiredError(
        f"{requirement_text(plan, missing)}, and {given}: calibrate to make one, or choose a preset "
        "that does not need one.",
        tuple(g for _, g, _ in missing),
        hint="quant-studio-cli export --method imatrix calibrates on the built-in text (or --imatrix FILE "
        "uses llama-imatrix's); in the window, choose a calibrated method in the Export dialog.",
    )
