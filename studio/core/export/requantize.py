"""Export a GGUF original to another plan: ``llama-quantize --allow-requantize`` semantics.

What llama.cpp's quantizer does with a GGUF input, the studio back end does too: every metadata key
is copied in file order with its stored type (tokenizer and chat template included), then
``general.quantization_version`` and ``general.file_type`` are set and moved last, and the split keys
dropped; tensors keep llama.cpp's order (block number, then name); a tensor whose planned type is its
stored type is copied byte for byte; any other is decoded to float32 (``gguf_source``) and quantized
with ``quant.blocks``, so from an F32/F16/BF16 source the tensors equal ``llama_model_quantize``'s.
The "llama.cpp" back end runs ``llama_model_quantize`` itself (``allow_requantize``) in the child
process with one override per tensor. Plans for a GGUF are keyed by its own tensor names.
"""

from __future__ import annotations

import errno
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import ExportError
from studio.core.export.imatrix import imatrix_for
from studio.core.gguf import writer
from studio.core.gguf.read import read_gguf
from studio.core.gguf.writer import (
    PARTIAL_SUFFIX,
    AtomicGGUFWriter,
    PlannedTensor,
    disk_full_error,
    llama_order,
    validate_written,
)
from studio.core.jobs import JobContext, null_context
from studio.core.llamacpp import LlamaWorker
from studio.core.model.gguf_source import check_decodable, source_summary
from studio.core.plan.gguf_file import requantize_metadata, requantized_types
from studio.core.plan.presets import allows_quantization
from studio.core.quant.nonfinite import count_nonfinite, nonfinite_error
from studio.core.quant.types import tensor_bytes

FLOAT_TARGETS = ("F32", "F16", "BF16")


def _source_notes(ckpt: Any) -> list[str]:
    s = source_summary(ckpt.gguf)
    notes = [f"Source {ckpt.info.path.name}: {s.describe()}."]
    if s.warning:
        notes.append(s.warning)
    return notes


def requantize_gguf(
    ckpt: Any,
    out: Path,
    plan: Any,
    *,
    backend: str = "studio",
    device: str = "cpu",
    imatrix: Mapping[str, Any] | None = None,
    ctx: JobContext | None = None,
    validate: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Write ``out`` from the opened GGUF checkpoint ``ckpt`` following ``plan``.

    Returns what ``export.export_gguf`` reports: ``types`` (name → type written), ``tensor_bytes``,
    ``tokenizer`` (None: the source's is copied as is) and ``notes`` (source type, requantization
    warning, metadata that could not be copied).
    """
    ctx = ctx or null_context()
    if backend == "llama.cpp":
        return _requantize_llamacpp(ckpt, out, plan, imatrix, ctx, validate)
    return _requantize_studio(ckpt, out, plan, device, imatrix, ctx, validate)


def _bytes_of(qtype: str, t: Any) -> int:
    return t.nbytes if qtype == t.type_name else tensor_bytes(qtype, tuple(t.shape))


def _requantize_studio(
    ckpt: Any,
    out: Path,
    plan: Any,
    device: str,
    imatrix: Mapping[str, Any] | None,
    ctx: JobContext,
    validate: Callable[[Path], None] | None,
) -> dict[str, Any]:
    g = ckpt.gguf
    src = Path(g.path)
    tensors = sorted(g.tensors, key=lambda t: llama_order(t.name))
    targets = requantized_types(g, plan)
    check_decodable([t for t in tensors if targets[t.name] != t.type_name], src)
    sizes = {t.name: _bytes_of(targets[t.name], t) for t in tensors}
    total = sum(sizes.values())
    writer.check_output_path(out, inputs=(src,), need_bytes=total)
    notes = _source_notes(ckpt)
    arch = str(g.metadata.get("general.architecture", ckpt.info.model_type))
    done = 0
    ctx.report(0, total, "Writing metadata")
    with AtomicGGUFWriter(out, arch) as w:
        lost = requantize_metadata(w.kv, g, plan)  # the same header requantized_file_bytes counts
        if lost:
            notes.append(f"{len(lost)} metadata keys could not be copied (e.g. {lost[0]}).")
        for t in tensors:
            w.add_tensor_info(t.name, tuple(t.shape), targets[t.name], sizes[t.name])
        w.begin()
        for t in tensors:
            ctx.check_cancelled()
            qtype = targets[t.name]
            if qtype == t.type_name:  # llama.cpp: "nothing to do", the stored bytes are copied
                w.write_tensor_chunks(t.name, _copy_chunks(src, t))
            else:
                w.write_tensor_chunks(t.name, [_convert(ckpt, t, qtype, device, imatrix)])
            done += sizes[t.name]
            ctx.report(done, total, f"Wrote {t.name} ({qtype})")
        ctx.check_cancelled()
        ctx.report(total, total, "Validating")
        w.commit(validate=validate)
    kept = sum(1 for t in tensors if targets[t.name] == t.type_name and t.type_name not in FLOAT_TARGETS)
    if kept:
        notes.append(f"{kept} quantized tensor(s) already had their planned type and were copied unchanged.")
    return {"types": targets, "tensor_bytes": total, "tokenizer": None, "notes": notes}


def _copy_chunks(src: Path, t: Any, chunk: int = 16 << 20):
    with open(src, "rb") as f:
        f.seek(t.offset)
        left = t.nbytes
        while left > 0:
            b = f.read(min(chunk, left))
            if not b:
                raise ExportError(f"{src.name} ends inside tensor {t.name!r}; the file is incomplete.")
            left -= len(b)
            yield np.frombuffer(b, dtype=np.uint8)


def _convert(ckpt: Any, t: Any, qtype: str, device: str, imatrix: Mapping[str, Any] | None) -> np.ndarray:
    x = ckpt.read(t.name)  # float32, decoded from the stored type
    nan, inf = count_nonfinite(x)
    if nan or inf:
        raise nonfinite_error(t.name, nan, inf, ckpt.info.path)
    n = int(t.ne[0]) if t.ne else 1
    x2 = x.reshape(-1, n) if n else x.reshape(0, 0)  # a zero-size dimension: nothing to convert
    if qtype == "F32":
        return np.ascontiguousarray(x2, dtype=np.float32)
    if qtype == "F16":
        return x2.astype(np.float16)
    from studio.core.quant import blocks

    qw = imatrix_for(imatrix, (t.name,), n)
    if device != "cpu":
        import torch

        return blocks.quantize(torch.from_numpy(np.ascontiguousarray(x2)).to(device), qtype, qw)
    return blocks.quantize(x2, qtype, qw)


def _requantize_llamacpp(
    ckpt: Any,
    out: Path,
    plan: Any,
    imatrix: Mapping[str, Any] | None,
    ctx: JobContext,
    validate: Callable[[Path], None] | None,
) -> dict[str, Any]:
    g = ckpt.gguf
    src = Path(g.path)
    tensors = sorted(g.tensors, key=lambda t: llama_order(t.name))
    targets = requantized_types(g, plan)
    total = sum(_bytes_of(targets[t.name], t) for t in tensors)
    writer.check_output_path(out, inputs=(src,), need_bytes=total)
    overrides = [
        ("^" + re.escape(t.name) + "$", targets[t.name])
        for t in tensors
        if allows_quantization(t.name, len(t.ne))
    ]
    imx = {k: np.asarray(v, dtype=np.float32).reshape(-1) for k, v in (imatrix or {}).items()} or None
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    ctx.report(0, total, "Quantizing with llama.cpp")
    try:
        with LlamaWorker(label="llama.cpp quantize") as wk:
            wk.request(
                "quantize",
                src=str(src),
                dst=str(partial),
                ftype=7,  # any quantized base type makes llama.cpp apply the overrides
                overrides=overrides,
                imatrix=imx,
                nthread=os.cpu_count() or 1,
                file_type=int(plan.ftype),
                allow_requantize=True,
            )
        ctx.check_cancelled()
        written = read_gguf(partial)
        got = {t.name: t.type_name for t in written.tensors}
        for name, want in targets.items():
            if got.get(name) != want:
                raise ExportError(f"llama.cpp wrote tensor {name} as {got.get(name)}, the plan says {want}.")
        planned = [PlannedTensor(t.name, tuple(t.shape), t.type_name, t.nbytes) for t in written.tensors]
        validate_written(partial, planned, None)
        if validate is not None:
            validate(partial)
        os.replace(partial, out)
        ctx.report(total, total, f"Wrote {out.name}")
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise disk_full_error(out, total) from err
        raise ExportError(f"Exporting {out} failed: {err.strerror or err}.") from err
    finally:
        if partial.exists():
            try:
                partial.unlink()
            except OSError:
                pass
    return {"types": targets, "tensor_bytes": total, "tokenizer": None, "notes": _source_notes(ckpt)}


def n_weights(info: Any) -> int:
    """Weights of every tensor of a GGUF original (what bits per weight are counted over)."""
    return sum(math.prod(t.shape) for t in info.tensors)


__all__ = ["n_weights", "requantize_gguf"]
