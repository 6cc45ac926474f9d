"""The converter route's export half: llama.cpp's converter supplies metadata, vocabulary and tensor
values (``gguf.llama_converter``), the studio's plan and quantizers choose what each tensor becomes,
and the studio's atomic writer writes the file."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from studio.core.errors import ExportError
from studio.core.export.imatrix import imatrix_for
from studio.core.gguf import writer
from studio.core.gguf.converter_run import ConvertedTensor, ConverterRun, start_run
from studio.core.gguf.metadata import _studio_version
from studio.core.gguf.writer import AtomicGGUFWriter
from studio.core.jobs import JobContext, null_context
from studio.core.modelinfo import ModelInfo
from studio.core.plan.gguf_file import add_rotation_metadata
from studio.core.quant.nonfinite import count_nonfinite, nonfinite_error
from studio.core.quant.types import tensor_bytes


def export_converted(
    info: ModelInfo,
    lay: Any,
    out: Path,
    plan: Any,
    *,
    device: str,
    imatrix: Mapping[str, Any] | None,
    ctx: JobContext | None,
    validate: Callable[[Path], None] | None,
    encode: Callable[[np.ndarray, str, str, np.ndarray | None], np.ndarray],
    float_only: bool = False,
    values: Any = None,
) -> dict[str, Any]:
    """Write ``out`` atomically: llama.cpp's converter metadata, vocabulary and tensor values, our
    plan's types and quantizers (``encode(rows, qtype, device, imatrix)``), one tensor at a time.

    ``float_only``: write every tensor as F32 (the llama.cpp back end's input), the plan still
    recorded in the metadata. ``values``: the rotated view ``info`` describes (its tensors are read
    from it, not from the folder)."""

    ctx = ctx or null_context()
    ctx.report(0, 1, "Running llama.cpp's converter")
    run = start_run(info, out_path=out, metadata=True, values=values)
    got = {n: t.shape for n, t in run.tensors.items()}
    want = {tm.gguf_name: tm.shape for tm in lay.tensors}
    if got != want:
        diff = sorted(set(got) ^ set(want)) or sorted(n for n in got if got[n] != want.get(n))
        raise ExportError(
            f"llama.cpp's converter produced other tensors for {info.path.name} than its layout said "
            f"(first: {diff[0]}); the checkpoint changed while exporting?"
        )
    by_gguf = {tm.gguf_name: tm for tm in lay.tensors}
    types = {n: ("F32" if float_only else plan.type_of(by_gguf[n].hf_name)) for n in run.tensors}
    sizes = {n: tensor_bytes(types[n], run.tensors[n].shape) for n in run.tensors}
    total = sum(sizes.values())
    writer.check_output_path(out, need_bytes=total)
    with AtomicGGUFWriter(out, run.gguf_arch) as w:
        for key, value, vtype, sub in run.key_values():
            if key == gguf.Keys.General.ARCHITECTURE:
                continue  # the writer starts with it
            if key == gguf.Keys.General.FILE_TYPE:
                value = int(plan.ftype)
            w.kv.add_key_value(
                key, value, gguf.GGUFValueType(vtype), gguf.GGUFValueType(sub) if sub is not None else None
            )
        if gguf.Keys.General.FILE_TYPE not in w.kv.kv_data[0]:
            w.kv.add_file_type(int(plan.ftype))
        w.kv.add_string("quant_studio.version", _studio_version())
        w.kv.add_string("quant_studio.plan", plan.to_json())
        add_rotation_metadata(w.kv, info)
        # an imatrix that knows its origin (studio.core.calib.imatrix.Imatrix): llama-quantize's keys
        for key, value in getattr(imatrix, "quantize_metadata", lambda: [])():
            if isinstance(value, str):
                w.kv.add_string(key, value)
            else:
                w.kv.add_uint32(key, int(value))
        for n, t in run.tensors.items():
            w.add_tensor_info(n, t.shape, types[n], sizes[n])
        w.begin()
        done = 0
        for n, t in run.tensors.items():
            ctx.check_cancelled()
            qw = _imatrix_rows(imatrix, by_gguf[n], t)
            w.write_tensor_chunks(n, _encoded(run, n, t, types[n], device, qw, encode, ctx, info))
            done += sizes[n]
            ctx.report(done, total, f"Wrote {n} ({types[n]})")
        ctx.check_cancelled()
        ctx.report(total, total, "Validating")
        w.commit(validate=validate)
    return {
        "types": types,
        "tensor_bytes": total,
        "tokenizer": None,
        "notes": tuple(run.notes) + tuple(f"llama.cpp's converter: {m}" for m in run.warnings),
    }


def _imatrix_rows(imatrix: Mapping[str, Any] | None, tm: Any, t: ConvertedTensor) -> np.ndarray | None:
    """The importance values of one tensor: (n_per_row,) or, for experts, (n_expert, n_per_row)."""
    n = t.shape[-1]
    n_exp = t.shape[0] if len(t.shape) == 3 else 1
    v = imatrix_for(imatrix, (tm.hf_name, t.name), n, n_exp)
    return v if v is None or v.size == n else v.reshape(n_exp, n)


def _encoded(
    run: ConverterRun,
    name: str,
    t: ConvertedTensor,
    qtype: str,
    device: str,
    qw: np.ndarray | None,
    encode: Callable[[np.ndarray, str, str, np.ndarray | None], np.ndarray],
    ctx: JobContext,
    info: ModelInfo,
) -> Iterator[np.ndarray]:
    per_expert = t.shape[1] if len(t.shape) == 3 else 0
    row = 0
    for block in run.rows(name):
        nan, inf = count_nonfinite(block)
        if nan or inf:
            raise nonfinite_error(name, nan, inf, info.path)
        w = qw
        if qw is not None and qw.ndim == 2:
            w = qw[row // per_expert]  # blocks never cross an expert
        yield encode(block, qtype, device, w)
        row += block.shape[0]
        ctx.check_cancelled()


__all__ = ["export_converted"]
