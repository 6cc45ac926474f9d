"""Methods: how the codes and scales of a tensor's qtype are chosen, registered by name.

A method is a plain function ``(weights, stats, qtype, ctx) -> Encoded`` (``weights``: a torch tensor,
rows × columns as in the GGUF file; ``stats``: what calibration saw entering that linear), plus
whether the decoder layer is first rescaled by AWQ. The plan names one per tensor the way it names a
qtype; every method writes a standard GGUF tensor of that qtype:

==========  =====================================================================================
rtn         llama.cpp's own search, no calibration (what llama-quantize does without an imatrix)
imatrix     llama.cpp's search weighted by the importance matrix of the calibration text
gptq        scales from the imatrix-weighted search, codes by GPTQ's error-compensating sweep
awq         AWQ's per-channel scales (folded into the preceding norm or linear), then ``imatrix``
awq+gptq    AWQ's scales, then ``gptq`` on the rescaled layer
==========  =====================================================================================

This module stays light (no torch, no numba) so plans can check method names; the functions import
what they need when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.quant import gptq as gptq_module  # the gptq method below shadows the name

DEFAULT_METHOD = "rtn"


@dataclass(frozen=True, eq=False)
class SiteStats:
    """What calibration saw entering one linear: imatrix (mean x² per column), Hessian, token count."""

    name: str
    tokens: int
    imatrix: np.ndarray | None = None  # float32 (n,)
    hessian: Any = None  # torch (n, n) float32, 2XᵀX/n, on the layer's device
    options: Any = None  # GptqOptions for gptq
    factors: Any = None  # gptq.FactorCache shared by the linears that read the same input


@dataclass(frozen=True)
class Encoded:
    """A tensor in its qtype's GGUF bytes (rows × row bytes, rows in the order of the weights given)."""

    data: np.ndarray
    qtype: str
    error: float | None = None  # tr((W − Ŵ) H (W − Ŵ)ᵀ) when a Hessian was known
    rtn_error: float | None = None  # the same for llama.cpp's codes
    notes: tuple[str, ...] = field(default=())


RoundingFn = Callable[[Any, SiteStats, str, Any], Encoded]


@dataclass(frozen=True)
class Method:
    """A registered method."""

    name: str
    rounding: RoundingFn
    awq: bool  # the layer is rescaled by AWQ before ``rounding`` runs
    calibrated: bool  # needs a calibration run
    hessian: bool  # needs the Hessian of its inputs
    description: str


def _to_numpy(w: Any) -> Any:
    return w.detach().cpu().numpy() if w.device.type == "cpu" else w.detach()


def rtn(weights: Any, stats: SiteStats, qtype: str, ctx: Any = None) -> Encoded:
    """llama.cpp's search without an importance matrix."""
    from studio.core.quant.blocks import quantize

    return Encoded(quantize(_to_numpy(weights), qtype), qtype)


def imatrix(weights: Any, stats: SiteStats, qtype: str, ctx: Any = None) -> Encoded:
    """llama.cpp's search weighted by the calibration's importance matrix."""
    from studio.core.quant.blocks import quantize

    return Encoded(quantize(_to_numpy(weights), qtype, stats.imatrix), qtype)


def gptq(weights: Any, stats: SiteStats, qtype: str, ctx: Any = None) -> Encoded:
    """GPTQ onto ``qtype``'s grid (``studio.core.quant.gptq``); raises HessianError when it cannot run."""
    if stats.hessian is None:
        raise QuantizationError(f"GPTQ of {stats.name} needs the Hessian of its inputs; none was collected.")
    from studio.core.quant.iquants import IQ_TYPES

    if qtype in IQ_TYPES:  # the lattice types: vector GPTQ over groups of 8 columns
        from studio.core.quant.gptq_lattice import gptq_lattice as sweep
    else:
        sweep = gptq_module.gptq_quantize
    r = sweep(
        weights,
        stats.hessian,
        qtype,
        imatrix=stats.imatrix,
        options=stats.options,
        ctx=ctx,
        factors=stats.factors,
    )
    return Encoded(r.data, qtype, r.error, r.rtn_error, r.notes)


METHODS: Mapping[str, Method] = MappingProxyType(
    {
        m.name: m
        for m in (
            Method("rtn", rtn, False, False, False, "llama.cpp's search, no calibration"),
            Method("imatrix", imatrix, False, True, False, "llama.cpp's search weighted by an imatrix"),
            Method("gptq", gptq, False, True, True, "GPTQ codes under llama.cpp's imatrix-weighted scales"),
            Method("awq", imatrix, True, True, True, "AWQ channel scales, then the imatrix-weighted search"),
            Method("awq+gptq", gptq, True, True, True, "AWQ channel scales, then GPTQ"),
        )
    }
)
"""Every method by name, in menu order."""


ALIASES: Mapping[str, str] = MappingProxyType({"best": "awq+gptq"})
"""Other names of methods: ``best`` is the rounding that measured best (AWQ scales, then GPTQ)."""


def method_info(name: str) -> Method:
    """The registered method ``name`` (any case, or an alias such as ``best``); QuantizationError naming
    the known ones otherwise."""
    key = str(name).lower()
    m = METHODS.get(ALIASES.get(key, key))
    if m is None:
        raise QuantizationError(
            f"Unknown method {name!r}.", hint="Known: " + ", ".join([*METHODS, *ALIASES]) + "."
        )
    return m


def check_method(name: str) -> str:
    """The canonical name of method ``name`` (QuantizationError if unknown)."""
    return method_info(name).name


__all__ = [
    "ALIASES",
    "DEFAULT_METHOD",
    "METHODS",
    "Encoded",
    "Method",
    "RoundingFn",
    "SiteStats",
    "check_method",
    "gptq",
    "imatrix",
    "method_info",
    "rtn",
]
