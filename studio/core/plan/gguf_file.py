"""What the GGUF file of a plan holds: its tensors in llama.cpp's order, its metadata, and its exact size.

The export (``studio.core.export.run``) writes these; the budget planner (``allocate``) counts them
without writing anything, so a file budget is met to the byte.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from studio.core.errors import ExportError
from studio.core.gguf.arch import Layout, TensorMap
from studio.core.gguf.layout import layout
from studio.core.gguf.metadata import _studio_version, add_arch_metadata, add_general_metadata, extra_tensors
from studio.core.gguf.read import GGUFFile, read_gguf
from studio.core.gguf.vocab import TokenizerSummary, add_tokenizer
from studio.core.gguf.writer import PlannedTensor, llama_order
from studio.core.model import hub_repo_id
from studio.core.model.gguf_source import copy_metadata
from studio.core.modelinfo import rotation_config
from studio.core.plan.plan import Plan, check_plan
from studio.core.quant.types import tensor_bytes


@dataclass(frozen=True)
class PlannedItem(PlannedTensor):
    """A tensor to write (GGUF name, numpy shape, type, bytes) and where its values come from."""

    tm: TensorMap | None  # None for generated tensors
    data: np.ndarray | None = None  # generated tensors only


def planned_items(plan: Plan, lay: Layout, extras: list[tuple[str, np.ndarray]]) -> list[PlannedItem]:
    """Every tensor the file of ``plan`` holds (generated ``extras`` first), in llama.cpp's order."""
    items = [PlannedItem(n, tuple(a.shape), "F32", a.nbytes, None, a) for n, a in extras]
    for tm in lay.tensors:
        t = plan.type_of(tm.hf_name)
        items.append(PlannedItem(tm.gguf_name, tm.shape, t, tensor_bytes(t, tm.shape), tm))
    items.sort(key=lambda it: llama_order(it.name))
    return items


def write_metadata(
    w: Any,
    info: Any,
    plan: Plan,
    ftype: int,
    source_repo: str | None,
    n_params: int,
    imatrix: Mapping[str, Any] | None = None,
) -> TokenizerSummary:
    """Write the general, architecture and tokenizer metadata of an export of ``plan`` into ``w.kv``."""
    add_general_metadata(
        w.kv, info, ftype=ftype, plan_json=plan.to_json(), source_repo=source_repo, n_params=n_params
    )
    add_arch_metadata(w.kv, info)
    tok = add_tokenizer(w.kv, info)
    # an imatrix that knows its origin (studio.core.calib.imatrix.Imatrix) is recorded as llama-quantize does
    for key, value in getattr(imatrix, "quantize_metadata", lambda: [])():
        if isinstance(value, str):
            w.kv.add_string(key, value)
        else:
            w.kv.add_uint32(key, int(value))
    add_rotation_metadata(w.kv, info)
    return tok


def add_rotation_metadata(kv: Any, info: Any) -> None:
    """Record a rotated view's ``quantize.rotation.*`` keys (``studio.core.model.rotate``) in ``kv``."""
    for key, value in rotation_config(info).items():
        if isinstance(value, bool):
            kv.add_bool(key, value)
        elif isinstance(value, int):
            kv.add_uint32(key, value)
        else:
            kv.add_string(key, str(value))


def export_file_bytes(
    info: Any, plan: Plan, *, imatrix: Mapping[str, Any] | None = None, source_repo: str | None = None
) -> int:
    """The exact size of the file ``export_gguf`` writes for ``plan`` (studio back end, or a calibrated
    export): the same metadata and tensor infos serialized in memory, plus the aligned tensor data."""
    check_plan(plan, info)
    if getattr(info.format, "value", info.format) == "gguf":  # a GGUF original is requantized: its own header
        return requantized_file_bytes(read_gguf(info.path), plan)
    lay = layout(info)
    if lay.converted:  # the converter's own metadata and vocabulary: not serialized here
        raise ExportError(
            f"Budget plans do not cover {info.model_type} yet: llama.cpp's converter writes it, and the planner "
            "cannot size its files exactly; export it with a preset or a plan file."
        )
    if source_repo is None:
        source_repo = hub_repo_id(info.path)
    kv = gguf.GGUFWriter(None, lay.arch)
    items = planned_items(plan, lay, extra_tensors(info))
    n_params = sum(math.prod(it.shape) for it in items)
    write_metadata(types.SimpleNamespace(kv=kv), info, plan, plan.ftype, source_repo, n_params, imatrix)
    align = kv.data_alignment
    n = 4 + 4 + 8 + 8  # magic, version, tensor count, key count
    for key, val in kv.kv_data[0].items():
        n += len(kv._pack_val(key, gguf.GGUFValueType.STRING, add_vtype=False))
        n += len(kv._pack_val(val.value, val.type, add_vtype=True, sub_type=val.sub_type))
    for it in items:
        n += len(kv._pack_val(it.name, gguf.GGUFValueType.STRING, add_vtype=False))
        n += 4 + 8 * len(it.shape) + 4 + 8
    n += -n % align
    return n + sum(it.nbytes + (-it.nbytes % align) for it in items)


# ------------------------------------------------------------------------ a GGUF original, requantized

# llama-quantize drops these (one output file, whatever the input's splits were) and sets these last.
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
SET_LAST = ("general.quantization_version", "general.file_type")
GGML_QNT_VERSION = 2


def _skipped_keys(g: GGUFFile) -> tuple[str, ...]:
    own = tuple(k for k in g.metadata if k.startswith("quant_studio."))  # an earlier export's: replaced
    return SPLIT_KEYS + SET_LAST + own


def _add_own_keys(kv: Any, g: GGUFFile, plan: Plan) -> None:
    kv.add_uint32("general.quantization_version", GGML_QNT_VERSION)
    kv.add_uint32("general.file_type", int(plan.ftype))
    kv.add_string("quant_studio.version", _studio_version())
    kv.add_string("quant_studio.plan", plan.to_json())
    align = g.metadata.get("general.alignment")
    if isinstance(align, int) and align > 0:
        kv.data_alignment = align


def requantize_metadata(kv: Any, g: GGUFFile, plan: Plan) -> list[str]:
    """Write into the gguf-py writer ``kv`` the metadata of ``g`` requantized to ``plan`` (what
    ``llama-quantize --allow-requantize`` copies, then the studio's keys); returns the keys not copied."""
    lost = copy_metadata(kv, g, skip=_skipped_keys(g))
    _add_own_keys(kv, g, plan)
    return lost


def copied_metadata_bytes(g: GGUFFile) -> int:
    """Bytes of the metadata ``requantize_metadata`` copies from ``g`` (the same keys as ``copy_metadata``
    keeps), counted from the values; the same for every plan, so a caller sizing many plans counts it once."""
    skipped = set(_skipped_keys(g))
    n = 0
    for key, value in g.metadata.items():
        vtype, etype = g.value_types.get(key, (None, None))
        if key in skipped or vtype is None:
            continue
        if vtype == gguf.GGUFValueType.ARRAY and len(value) == 0:
            continue  # copy_metadata cannot copy an empty array
        n += _string_bytes(key) + 4 + _value_bytes(value, vtype, etype)
    return n


def requantized_types(g: GGUFFile, plan: Plan) -> dict[str, str]:
    """Tensor name → the type the requantization of ``g`` writes (the stored type where the plan is silent)."""
    return {t.name: plan.types.get(t.name, t.type_name) for t in g.tensors}


def requantized_file_bytes(g: GGUFFile, plan: Plan, *, copied: int | None = None) -> int:
    """The exact size of the file the studio writes when it requantizes the GGUF ``g`` to ``plan``
    (``export.requantize``): the copied metadata (``copied``: ``copied_metadata_bytes(g)``, counted here
    when None), the studio's keys, the tensor infos and the aligned data. A tensor kept in its stored
    type keeps its stored bytes."""
    kv = gguf.GGUFWriter(None, str(g.metadata.get("general.architecture", "")))
    kv.kv_data[0].clear()
    _add_own_keys(kv, g, plan)
    n = 4 + 4 + 8 + 8  # magic, version, tensor count, key count
    n += copied_metadata_bytes(g) if copied is None else copied
    for key, val in kv.kv_data[0].items():
        n += _string_bytes(key) + 4 + _value_bytes(val.value, val.type, val.sub_type)
    align = kv.data_alignment
    targets = requantized_types(g, plan)
    data = 0
    for t in g.tensors:
        n += _string_bytes(t.name) + 4 + 8 * len(t.shape) + 4 + 8
        q = targets[t.name]
        b = t.nbytes if q == t.type_name else tensor_bytes(q, tuple(t.shape))
        data += b + (-b % align)
    return n + (-n % align) + data


_SCALAR_BYTES = {
    gguf.GGUFValueType.UINT8: 1,
    gguf.GGUFValueType.INT8: 1,
    gguf.GGUFValueType.BOOL: 1,
    gguf.GGUFValueType.UINT16: 2,
    gguf.GGUFValueType.INT16: 2,
    gguf.GGUFValueType.UINT32: 4,
    gguf.GGUFValueType.INT32: 4,
    gguf.GGUFValueType.FLOAT32: 4,
    gguf.GGUFValueType.UINT64: 8,
    gguf.GGUFValueType.INT64: 8,
    gguf.GGUFValueType.FLOAT64: 8,
}


def _string_bytes(s: Any) -> int:
    return 8 + len(s.encode("utf-8") if isinstance(s, str) else bytes(s))


def _value_bytes(value: Any, vtype: Any, sub_type: Any = None) -> int:
    """Bytes gguf-py packs for ``value`` of ``vtype`` (without the type tag): counted, not packed, so the
    150,000 tokens of a vocabulary cost milliseconds."""
    vtype = gguf.GGUFValueType(vtype)
    if vtype == gguf.GGUFValueType.STRING:
        return _string_bytes(value)
    if vtype == gguf.GGUFValueType.ARRAY:
        items = value.tolist() if isinstance(value, np.ndarray) else list(value)
        sub = gguf.GGUFValueType(sub_type) if sub_type is not None else gguf.GGUFValueType.get_type(items[0])
        if sub == gguf.GGUFValueType.STRING:
            return 4 + 8 + sum(_string_bytes(v) for v in items)
        if sub == gguf.GGUFValueType.ARRAY:
            return 4 + 8 + sum(_value_bytes(v, sub) for v in items)
        return 4 + 8 + _SCALAR_BYTES[sub] * len(items)
    return _SCALAR_BYTES[vtype]


__all__ = [
    "PlannedItem",
    "copied_metadata_bytes",
    "export_file_bytes",
    "planned_items",
    "requantize_metadata",
    "requantized_file_bytes",
    "requantized_types",
    "write_metadata",
]
