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

from studio.core.gguf.arch import Layout, TensorMap
from studio.core.gguf.layout import layout
from studio.core.gguf.metadata import add_arch_metadata, add_general_metadata, extra_tensors
from studio.core.gguf.vocab import TokenizerSummary, add_tokenizer
from studio.core.gguf.writer import PlannedTensor, llama_order
from studio.core.model import hub_repo_id
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
    return tok


def export_file_bytes(
    info: Any, plan: Plan, *, imatrix: Mapping[str, Any] | None = None, source_repo: str | None = None
) -> int:
    """The exact size of the file ``export_gguf`` writes for ``plan`` (studio back end, or a calibrated
    export): the same metadata and tensor infos serialized in memory, plus the aligned tensor data."""
    check_plan(plan, info)
    lay = layout(info)
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


__all__ = ["PlannedItem", "export_file_bytes", "planned_items", "write_metadata"]
