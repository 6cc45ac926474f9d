"""The GGUF tensor types the studio quantizes to: one registry of their facts.

In the spirit of gguf-py's ``GGML_QUANT_SIZES`` and optimum-quanto's ``qtypes``: a ``QTypeInfo`` per
type holds its ggml type number and block geometry (taken from gguf-py, which states them for ggml,
or for a type it cannot name yet, Q2_0, from ``studio.core.ggml_types``), what llama.cpp uses instead
when a row does not fit (``tensor_type_fallback`` in llama-quant.cpp), whether it is a K-quant,
whether a plan may ask for it, and the ``general.file_type`` number (llama.h's ``LLAMA_FTYPE_*``,
taken from gguf-py's ``LlamaFileType`` or that table) a file gets whose main type it is.
Kernels, plans, presets, estimates and the Hub badges read these facts from here; the constants
every kernel of ggml's reference quantizers shares (``QK_K``, ``GROUP_MAX_EPS``, the IQ4 levels)
live here too. Importing this module costs gguf-py and numpy, never numba or torch.

``ftype`` always means that llama_ftype number; a named mixture such as ``Q4_K_M`` is a preset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import gguf
import numpy as np

from studio.core.errors import QuantizationError
from studio.core.ggml_types import NEWER_THAN_GGUF_PY, ggml_type_id, ggml_types

__all__ = [
    "FLOAT_TYPES",
    "GROUP_MAX_EPS",
    "IQ4NL_LEVELS",
    "NEWER_THAN_GGUF_PY",
    "PLAN_TYPES",
    "QK_K",
    "QTYPES",
    "QTypeInfo",
    "TypeFallback",
    "check_type",
    "fallback_type",
    "ftype_name",
    "ftype_of",
    "k4_scales",
    "qtype_info",
    "row_bytes",
    "tensor_bytes",
]


@dataclass(frozen=True)
class QTypeInfo:
    """Facts about one GGUF tensor type (a "qtype", e.g. ``Q4_K``)."""

    name: str
    block_size: int  # weights per block (ggml's blck_size)
    type_size: int  # bytes per block
    fallback: str | None  # llama.cpp's type for rows the block does not divide; None: F16 directly
    kquant: bool  # a 256-weight K-quant super-block type (Q2_K..Q6_K)
    plannable: bool  # a plan (and so the exporter) may give it to a tensor
    ftype: int | None  # general.file_type of a file whose main type this is
    needs_imatrix: bool = False  # ggml refuses to quantize it without an importance matrix
    type_id: int = -1  # ggml's type number, as GGUF tensor infos store it (12 is Q4_K)

    @property
    def bits_per_weight(self) -> float:
        """Storage cost of one weight in bits, block scales included (4.5 for Q4_0)."""
        return 8.0 * self.type_size / self.block_size

    @property
    def is_float(self) -> bool:
        """Whether values are stored as plain floats (F32, F16, BF16): nothing is quantized."""
        return self.block_size == 1

    @property
    def ggml_type(self) -> gguf.GGMLQuantizationType | int:
        """gguf-py's enum member, whose value is the type id stored in GGUF tensor infos (the bare
        ``type_id`` for a type the installed gguf-py cannot name)."""
        return gguf.GGMLQuantizationType.__members__.get(self.name, self.type_id)


def _ftype(name: str) -> int:
    """llama_ftype number of a file type named as llama.cpp names it (``Q4_K_M``, ``F32``)."""
    member = "ALL_F32" if name == "F32" else f"MOSTLY_{name}"
    if member not in gguf.LlamaFileType.__members__ and name in NEWER_THAN_GGUF_PY:
        return NEWER_THAN_GGUF_PY[name].ftype
    return int(gguf.LlamaFileType[member])


_GGML_TYPES = ggml_types()  # id -> (name, block, bytes): gguf-py's table and NEWER_THAN_GGUF_PY


def _geometry(name: str) -> tuple[int, int, int]:
    """(type id, weights per block, bytes per block) of a type, from gguf-py or ``NEWER_THAN_GGUF_PY``."""
    tid = ggml_type_id(name)
    return tid, _GGML_TYPES[tid][1], _GGML_TYPES[tid][2]


def _new(
    name: str, fallback: str | None, file_type: str | None, *, needs_imatrix: bool = False
) -> list[QTypeInfo]:
    """A low-bit type as a one-item list, or none when neither the installed gguf-py nor
    ``NEWER_THAN_GGUF_PY`` can name it."""
    members = gguf.LlamaFileType.__members__
    if name not in NEWER_THAN_GGUF_PY and (
        name not in gguf.GGMLQuantizationType.__members__
        or (file_type and f"MOSTLY_{file_type}" not in members)
    ):
        return []
    return [_info(name, fallback, file_type, needs_imatrix=needs_imatrix)]


def _info(
    name: str,
    fallback: str | None,
    file_type: str | None,
    *,
    plannable: bool = True,
    needs_imatrix: bool = False,
) -> QTypeInfo:
    tid, block, size = _geometry(name)
    return QTypeInfo(
        name=name,
        block_size=block,
        type_size=size,
        fallback=fallback,
        kquant=name.endswith("_K"),
        plannable=plannable,
        ftype=None if file_type is None else _ftype(file_type),
        needs_imatrix=needs_imatrix,
        type_id=tid,
    )


# Menu order: floats, the 32-weight types, then the 256-weight ones. A K-quant's file type is the
# _M mixture, the one llama.cpp names after it. MXFP4 has no file type of its own (MXFP4_MOE is a preset).
QTYPES: Mapping[str, QTypeInfo] = MappingProxyType(
    {
        i.name: i
        for i in (
            _info("F32", None, "F32"),
            _info("F16", None, "F16"),
            _info("BF16", None, "BF16"),
            _info("Q8_0", None, "Q8_0"),
            _info("Q4_0", None, "Q4_0"),
            _info("Q4_1", None, "Q4_1"),
            _info("Q5_0", None, "Q5_0"),
            _info("Q5_1", None, "Q5_1"),
            _info("IQ4_NL", None, "IQ4_NL"),
            _info("Q2_K", "Q4_0", "Q2_K"),
            _info("Q3_K", "Q4_0", "Q3_K_M"),
            _info("Q4_K", "Q5_0", "Q4_K_M"),
            _info("Q5_K", "Q5_1", "Q5_K_M"),
            _info("Q6_K", "Q8_0", "Q6_K"),
            _info("IQ4_XS", "IQ4_NL", "IQ4_XS"),
            # The low-bit types llama-quantize writes (issue 24), plannable as the rest. The fallbacks
            # are tensor_type_fallback's; Q1_0 has none there (llama.cpp throws), F16 here.
            # Q2_0, which gguf 0.19 cannot name, comes from NEWER_THAN_GGUF_PY.
            *_new("MXFP4", None, None),
            *_new("Q1_0", None, "Q1_0"),
            *_new("Q2_0", "Q4_0", "Q2_0"),
            *_new("TQ1_0", "Q4_0", "TQ1_0"),
            *_new("TQ2_0", "Q4_0", "TQ2_0"),
            *_new("IQ1_S", "IQ4_NL", "IQ1_S", needs_imatrix=True),
            *_new("IQ1_M", "IQ4_NL", "IQ1_M"),
            *_new("IQ2_XXS", "IQ4_NL", "IQ2_XXS", needs_imatrix=True),
            *_new("IQ2_XS", "IQ4_NL", "IQ2_XS", needs_imatrix=True),
            *_new("IQ2_S", "IQ4_NL", "IQ2_S"),
            *_new("IQ3_XXS", "IQ4_NL", "IQ3_XXS"),
            *_new("IQ3_S", "IQ4_NL", "IQ3_S"),
        )
    }
)
"""Every type the block kernels quantize and decode, in menu order."""

PLAN_TYPES: tuple[str, ...] = tuple(n for n, i in QTYPES.items() if i.plannable)
"""The types a plan may give a tensor, in menu order."""

_BY_ID: Mapping[int, QTypeInfo] = MappingProxyType({i.type_id: i for i in QTYPES.values()})

FLOAT_TYPES: frozenset[str] = frozenset(n for n, i in QTYPES.items() if i.is_float)

QK_K = QTYPES["Q4_K"].block_size  # weights per K-quant super-block (256)

GROUP_MAX_EPS = np.float32(1e-15)  # ggml: a group whose max |x| is below this quantizes to zeros

IQ4NL_LEVELS = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.int8)
"""The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml-common.h ``kvalues_iq4nl``)."""


def qtype_info(qtype: Any) -> QTypeInfo:
    """The facts of a type given by name (``"Q4_K"``, any case), gguf.GGMLQuantizationType or type id."""
    if isinstance(qtype, (int, np.integer)) and not isinstance(qtype, bool):
        tid = int(qtype)
        try:  # a GGML type id as stored in GGUF tensor infos (12 is Q4_K)
            qtype = _BY_ID[tid] if tid in _BY_ID else gguf.GGMLQuantizationType(tid)
        except ValueError:
            pass
    name = getattr(qtype, "name", qtype)
    info = QTYPES.get(name.upper()) if isinstance(name, str) else None
    if info is None:
        raise QuantizationError(f"Unknown quantization type {qtype!r}; supported: {', '.join(QTYPES)}.")
    return info


def check_type(qtype: str, message: str | None = None) -> str:
    """``qtype`` itself if a plan may use that type; otherwise a QuantizationError (``message``, or
    "Unknown GGUF type ...") whose hint lists the types plans know."""
    if qtype not in PLAN_TYPES:
        raise QuantizationError(
            message or f"Unknown GGUF type {qtype!r}.", hint="Known: " + ", ".join(PLAN_TYPES) + "."
        )
    return qtype


def row_bytes(qtype: Any, n_per_row: int) -> int:
    """Bytes of one quantized row of ``n_per_row`` weights."""
    info = qtype_info(qtype)
    return n_per_row // info.block_size * info.type_size


def tensor_bytes(qtype: Any, shape: Iterable[int]) -> int:
    """Bytes of a whole tensor of ``shape`` stored as ``qtype``."""
    info = qtype_info(qtype)
    return math.prod(int(s) for s in shape) // info.block_size * info.type_size


class TypeFallback(NamedTuple):
    """The type a row really gets, and why it is not the one asked for (None when it is)."""

    qtype: str
    reason: str | None


def fallback_type(qtype: Any, n_per_row: int) -> TypeFallback:
    """The type rows of ``n_per_row`` weights get when ``qtype`` is asked, and why.

    Mirrors llama.cpp's tensor_type_fallback: a 256-weight type falls back to its 32-weight
    counterpart, and a row that even 32 does not divide becomes F16.
    """
    info = qtype_info(qtype)
    if n_per_row % info.block_size == 0:
        return TypeFallback(info.name, None)
    why = f"rows of {n_per_row} are not a multiple of {info.block_size}"
    got = QTYPES[info.fallback] if info.fallback else info
    if n_per_row % got.block_size == 0:
        return TypeFallback(got.name, why)
    if got is not info:
        why += f" nor of {got.block_size}"
    return TypeFallback("F16", why)


def ftype_of(name: str) -> int:
    """The llama_ftype number of a file type or preset named as llama.cpp names it (``Q4_K_M`` -> 15)."""
    try:
        return _ftype(name.upper())
    except KeyError:
        raise QuantizationError(f"llama.cpp has no file type named {name!r}.") from None


def ftype_name(ftype: int) -> str | None:
    """The name of a ``general.file_type`` value (15 -> ``Q4_K_M``); None for a number neither gguf-py
    nor ``NEWER_THAN_GGUF_PY`` knows."""
    try:
        name = gguf.LlamaFileType(ftype).name
    except ValueError:
        newer = [n for n, t in NEWER_THAN_GGUF_PY.items() if t.ftype == ftype]
        return newer[0] if newer else None
    for prefix in ("MOSTLY_", "ALL_"):
        name = name.removeprefix(prefix)
    return name.removesuffix("_MOE")


def k4_scales(s: Any, cat: Callable[..., Any] = np.concatenate) -> tuple[Any, Any]:
    """Q4_K's and Q5_K's 12 bytes of 6-bit scales and mins, unpacked: (B, 12) -> (B, 8) scales, (B, 8) mins.

    ``s`` is int32: a numpy array, or a torch tensor with ``cat=torch.cat``.
    """
    sc = cat([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], 1)
    mn = cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], 1)
    return sc, mn
