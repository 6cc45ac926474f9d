"""Export a Hugging Face checkpoint to GGUF following a plan: streamed, atomic, validated.

``export_gguf`` reads one tensor at a time (in row chunks) from the memory-mapped checkpoint,
quantizes it with ``studio.core.quant.blocks`` (on the chosen torch device) and appends it to
``OUT.partial``; peak memory is about one tensor's stored bytes plus a few chunk buffers. The
"llama.cpp" back end writes our F32 export to a temporary file and runs llama.cpp's own
``llama_model_quantize`` on it in a child process with one override per tensor, so both back ends
produce the same tensor types (and, without an imatrix, the same bytes).
"""

from __future__ import annotations

import errno
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from studio.core.errors import ExportError, QuantizationError
from studio.core.export.converter import export_converted
from studio.core.export.imatrix import imatrix_for
from studio.core.export.requantize import requantize_gguf
from studio.core.export.source_copy import copied_note, stored_source
from studio.core.gguf.arch import Layout, Transform, apply_transform, head_counts
from studio.core.gguf.layout import layout
from studio.core.gguf.metadata import extra_tensors
from studio.core.gguf.read import read_gguf
from studio.core.gguf.vocab import TokenizerSummary
from studio.core.gguf.writer import (
    PARTIAL_SUFFIX,
    AtomicGGUFWriter,
    PlannedTensor,
    check_output_path,
    disk_full_error,
    llama_order,
    validate_written,
)
from studio.core.jobs import JobCancelled, JobContext, null_context
from studio.core.llamacpp import LlamaRunner, LlamaWorker, LoadOptions
from studio.core.model import hub_repo_id, open_model
from studio.core.model.rotate import RotatedCheckpoint, Rotation, RotationError, rotated
from studio.core.model.rotate_check import check_rotation
from studio.core.plan.gguf_file import PlannedItem as _Item
from studio.core.plan.gguf_file import export_file_bytes
from studio.core.plan.gguf_file import planned_items as _items
from studio.core.plan.gguf_file import write_metadata as _write_metadata
from studio.core.plan.imatrix_need import check_imatrix
from studio.core.plan.plan import Plan, check_plan, plan_from_preset
from studio.core.plan.presets import Fallback, allows_quantization
from studio.core.quant.nonfinite import count_nonfinite, nonfinite_error

# Rows are converted and quantized in chunks of about this many float32 bytes.
CHUNK_BYTES = 16 << 20
BACKENDS = ("studio", "llama.cpp")


class Precomputed(Protocol):
    """Tensors already in their GGUF form, keyed by HF name (``studio.core.calib.spool.TensorSpool``)."""

    def __contains__(self, name: object) -> bool: ...
    def __len__(self) -> int: ...
    def qtype_of(self, name: str) -> str: ...
    def get(self, name: str) -> np.ndarray: ...


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote."""

    path: Path
    backend: str
    device: str
    plan_name: str
    file_bytes: int
    tensor_bytes: int
    n_tensors: int
    seconds: float
    tensor_types: Mapping[str, str]  # GGUF tensor name → type, as written
    fallbacks: tuple[Fallback, ...]
    tokenizer: TokenizerSummary | None
    notes: tuple[str, ...] = ()

    n_weights: int = 0  # weights in the checkpoint's exported tensors
    rotation_notes: tuple[str, ...] = ()  # what a rotation could not fold, and why (also in ``notes``)

    @property
    def bpw(self) -> float:
        """Bits per weight of the tensor data."""
        return 8.0 * self.tensor_bytes / self.n_weights if self.n_weights else 0.0


def _resolve_plan(plan: Plan | str, info: Any, imatrix: bool = False) -> Plan:
    if isinstance(plan, Plan):
        check_plan(plan, info)
        return plan
    if isinstance(plan, str):
        # with an importance matrix a preset chooses as llama-quantize --imatrix does (IQ3_XXS, Q4_0 ...)
        return plan_from_preset(info, plan, imatrix=imatrix)
    raise QuantizationError(f"An export needs a Plan or a preset name, not {type(plan).__name__}.")


def _imatrix_for(imatrix: Mapping[str, Any] | None, it: _Item) -> np.ndarray | None:
    if it.tm is None:
        return None
    return imatrix_for(imatrix, (it.tm.hf_name, it.name), it.tm.n_per_row, max(1, it.tm.n_experts))


# ------------------------------------------------------------------------------------------ reading


def _row_chunks(ckpt: Any, it: _Item, config: dict[str, Any]) -> Iterator[np.ndarray]:
    """The GGUF float32 values of one tensor, as consecutive blocks of rows (2-D arrays)."""
    tm = it.tm
    assert tm is not None
    ti = ckpt.info.tensor(tm.hf_name)
    n = tm.n_per_row
    rows = math.prod(tm.shape) // n if n else 0
    if rows == 0 or n == 0:
        yield np.zeros((rows, n), dtype=np.float32)
        return
    raw = None
    if ti.dtype in ("F32", "F16", "BF16"):
        try:
            raw = ckpt.read_raw(tm.hf_name)
            if tuple(raw.shape) != tuple(ti.shape):
                raw = None
        except Exception:
            raw = None
    if raw is None:
        # other dtypes (or non-mmapped formats): read the tensor whole
        x = apply_transform(np.asarray(ckpt.read(tm.hf_name), dtype=np.float32), tm, config)
        x2 = x.reshape(rows, n)
        step = max(1, CHUNK_BYTES // (4 * n))
        for a in range(0, rows, step):
            yield x2[a : a + step]
        return

    def to_f32(block: np.ndarray) -> np.ndarray:
        if ti.dtype == "BF16":
            return (block.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(block, dtype=np.float32)

    step = max(1, CHUNK_BYTES // (4 * n))
    if tm.transform is Transform.TRANSPOSE:
        src = raw.reshape(raw.shape[0], -1)  # (in, out): GGUF row j is HF column j
        for a in range(0, rows, step):
            yield np.ascontiguousarray(to_f32(src[:, a : a + step]).T)
        return
    src = raw.reshape(-1, n)
    if tm.transform in (Transform.PERMUTE_Q, Transform.PERMUTE_K):
        n_head, n_kv = head_counts(config)
        heads = n_head if tm.transform is Transform.PERMUTE_Q else n_kv
        per_head = src.shape[0] // heads  # whole heads per chunk: the permutation stays inside a head
        hstep = max(1, step // per_head)
        for h in range(0, heads, hstep):
            hb = min(hstep, heads - h)
            block = to_f32(src[h * per_head : (h + hb) * per_head])
            yield np.ascontiguousarray(
                block.reshape(hb, 2, per_head // 2, n).swapaxes(1, 2).reshape(hb * per_head, n)
            )
        return
    plus_one = tm.transform is Transform.PLUS_ONE
    for a in range(0, rows, step):
        block = to_f32(src[a : a + step])
        if plus_one:
            block = block + np.float32(1.0)
        yield block


def _encode(x: np.ndarray, qtype: str, device: str, qw: np.ndarray | None) -> np.ndarray:
    """One block of rows in the GGUF encoding of ``qtype`` (raw bytes or a float array)."""
    if qtype == "F32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if qtype == "F16":
        return x.astype(np.float16)
    from studio.core.quant import blocks

    if device != "cpu":
        import torch

        return blocks.quantize(torch.from_numpy(np.ascontiguousarray(x)).to(device), qtype, qw)
    return blocks.quantize(x, qtype, qw)


# ------------------------------------------------------------------------------------------ export


def export_gguf(
    checkpoint_path: str | Path,
    out_path: str | Path,
    plan: Plan | str,
    *,
    device: str = "cpu",
    backend: str = "studio",
    imatrix: Mapping[str, Any] | None = None,
    ctx: JobContext | None = None,
    source_repo: str | None = None,
    validate: Callable[[Path], None] | None = None,
    allow_pickle: bool = False,
    precomputed: Precomputed | None = None,
    rotation: Rotation | None = None,
) -> ExportResult:
    """Export ``checkpoint_path`` to the GGUF file ``out_path`` following ``plan`` (or a preset name).

    ``backend``: "studio" (our quantizers, streamed) or "llama.cpp" (llama_model_quantize on our F32
    export, in a child process). ``imatrix`` maps tensor names (HF or GGUF) to one importance value
    per input column. ``validate`` is called on the finished partial file before the rename.
    ``allow_pickle`` opts in to a pickle ``pytorch_model.bin`` (converted in a child, as ``open_model`` does).
    ``precomputed`` holds tensors already in their GGUF form (a calibrated run's ``TensorSpool``, keyed
    by HF name): they are written as they are instead of being read and quantized (studio back end).
    ``rotation`` folds R1/R2 into the weights (``studio.core.model.rotate``), checked against the
    unrotated model's float32 logits before anything is written.
    """
    ctx = ctx or null_context()
    if backend not in BACKENDS:
        raise ExportError(f"Unknown export back end {backend!r}; use one of {', '.join(BACKENDS)}.")
    device = _check_device(device)
    t0 = time.monotonic()
    out = Path(out_path).expanduser()
    ckpt = open_model(checkpoint_path, allow_pickle=allow_pickle)
    try:
        # same-as-input, missing or read-only folder: refused now, before a rotation is even checked (a
        # rotated view reads the same files)
        inputs = tuple({t.file for t in ckpt.info.tensors}) + (ckpt.info.path,)
        check_output_path(out, inputs=inputs)
        if out.suffix.lower() != ".gguf":
            raise ExportError(f"The output name {out.name} should end in .gguf.")
        if rotation is not None:
            ckpt = _rotate(ckpt, rotation, ctx)
        rotation_notes = ckpt.notes if isinstance(ckpt, RotatedCheckpoint) else ()  # R2 alone: why
        info = ckpt.info
        check_exportable(info)
        if source_repo is None:
            source_repo = hub_repo_id(info.path)  # a Hub download records where it came from
        plan = _resolve_plan(plan, info, bool(imatrix))
        # a type that needs an importance matrix and has none: refused before anything is written
        check_imatrix(plan, info, imatrix, exclude=precomputed if precomputed is not None else ())
        lay = layout(info)
        if precomputed is not None and len(precomputed):
            if info.format.value == "gguf":
                raise ExportError(
                    "Calibrated methods need the Hugging Face model folder; a GGUF original is requantized "
                    "with rtn or imatrix."
                )
            if backend == "llama.cpp":
                raise ExportError("Calibrated tensors are written by the studio back end, not by llama.cpp.")
            if lay.converted:
                raise ExportError(
                    f"Calibrated methods do not cover {info.architecture} yet (it is "
                    "written through llama.cpp's converter); use rtn or imatrix."
                )
        if info.format.value == "gguf":  # a GGUF original: llama-quantize --allow-requantize semantics
            result = requantize_gguf(
                ckpt, out, plan, backend=backend, device=device, imatrix=imatrix, ctx=ctx, validate=validate
            )
        elif backend == "llama.cpp":
            result = _export_llamacpp(ckpt, lay, out, plan, inputs, imatrix, ctx, source_repo, validate)
        elif lay.converted:
            values = ckpt if isinstance(ckpt, RotatedCheckpoint) else None  # the converter reads the view
            result = _export_converted(info, lay, out, plan, device, imatrix, ctx, validate, values=values)
        else:
            result = _export_studio(
                ckpt, lay, out, plan, inputs, device, imatrix, ctx, source_repo, validate, pre=precomputed
            )
    finally:
        ckpt.close()
    n_weights = sum(math.prod(tm.shape) for tm in lay.tensors)
    return ExportResult(
        path=out,
        backend=backend,
        device=device,
        plan_name=plan.name,
        file_bytes=out.stat().st_size,
        tensor_bytes=result["tensor_bytes"],
        n_tensors=len(result["types"]),
        seconds=time.monotonic() - t0,
        tensor_types=result["types"],
        fallbacks=plan.fallbacks,
        tokenizer=result.get("tokenizer"),
        notes=rotation_notes
        + plan.notes
        + tuple(f"{n} is not written: llama.cpp does not use it." for n in lay.skipped)
        + tuple(result.get("notes", ())),
        n_weights=n_weights,
        rotation_notes=rotation_notes,
    )


def _rotate(ckpt: Any, rotation: Rotation, ctx: JobContext) -> Any:
    """``ckpt`` seen rotated, once its logits match the original's (one sentence otherwise)."""
    try:
        view = rotated(ckpt, rotation)
    except RotationError:
        ckpt.close()
        raise
    try:
        check_rotation(view, seed=rotation.seed, ctx=ctx.span(0.0, 0.05))
    except BaseException:
        view.close()
        raise
    return view


def check_exportable(info: Any) -> None:
    """Raise an ExportError when ``info`` cannot be exported at all (every format we open can be:
    a GGUF original is requantized, see ``studio.core.export.requantize``)."""
    if not info.tensors:
        raise ExportError(f"{info.path} contains no tensors to export.")


def _check_device(device: str) -> str:
    device = (device or "cpu").lower()
    if device == "cpu":
        return device
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise ExportError(f"Device {device!r} needs torch, which is not installed.") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ExportError("CUDA was chosen but no CUDA device is available.", hint="Use --device cpu.")
    if device == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ExportError(
            "MPS was chosen but Metal is not available on this machine.", hint="Use --device cpu."
        )
    if not (device.startswith("cuda") or device == "mps"):
        raise ExportError(f"Unknown device {device!r}; use cpu, cuda or mps.")
    return device


def _export_studio(
    ckpt: Any,
    lay: Layout,
    out: Path,
    plan: Plan,
    inputs: tuple[Path, ...],
    device: str,
    imatrix: Mapping[str, Any] | None,
    ctx: JobContext,
    source_repo: str | None,
    validate: Callable[[Path], None] | None,
    *,
    float_only: bool = False,
    pre: Precomputed | None = None,
) -> dict[str, Any]:
    info = ckpt.info
    extras = extra_tensors(info)
    meta_plan = plan
    if float_only:
        # the F32 intermediate of the llama.cpp back end still records the real plan
        plan = Plan({tm.hf_name: "F32" for tm in lay.tensors}, name="F32", ftype=0)
    items = _items(plan, lay, extras)
    total = sum(it.nbytes for it in items)
    check_output_path(out, inputs=inputs, need_bytes=total)
    done = copied = 0
    # a folder converted from a GGUF: tensors stored in their planned type are copied (llama-quantize's rule)
    stored = None if float_only else stored_source(info.path)
    ctx.report(0, total, "Writing metadata")
    with AtomicGGUFWriter(out, lay.arch) as w:
        n_params = sum(math.prod(it.shape) for it in items)
        tok = _write_metadata(w, info, meta_plan, plan.ftype, source_repo, n_params, imatrix)
        for it in items:
            w.add_tensor_info(it.name, it.shape, it.qtype, it.nbytes)
        w.begin()
        for it in items:
            ctx.check_cancelled()
            if it.tm is None:
                w.write_tensor_chunks(it.name, [np.asarray(it.data, dtype=np.float32)])
            elif pre is not None and it.tm.hf_name in pre:
                w.write_tensor_chunks(it.name, [_precomputed(pre, it)])
            elif (
                stored is not None
                and (raw := stored.copy_of(it.name, it.qtype, it.shape, _row_chunks(ckpt, it, info.config)))
                is not None
            ):
                w.write_tensor_chunks(it.name, [raw])
                copied += 1
            else:
                qw = _imatrix_for(imatrix, it)
                w.write_tensor_chunks(it.name, _encoded_chunks(ckpt, it, info, device, qw, ctx))
            done += it.nbytes
            ctx.report(done, total, f"Wrote {it.name} ({it.qtype})")
        ctx.check_cancelled()
        ctx.report(total, total, "Validating")
        w.commit(validate=validate)
    notes = [copied_note(copied, stored)] if copied and stored is not None else []
    return {
        "types": {it.name: it.qtype for it in items},
        "tensor_bytes": total,
        "tokenizer": tok,
        "notes": notes,
    }


def _export_converted(
    info: Any,
    lay: Layout,
    out: Path,
    plan: Plan,
    device: str,
    imatrix: Mapping[str, Any] | None,
    ctx: JobContext,
    validate: Callable[[Path], None] | None,
    *,
    float_only: bool = False,
    values: Any = None,
) -> dict[str, Any]:
    # architectures llama.cpp's converter maps: its metadata, vocabulary and values, our plan,
    # quantizers and writer (studio.core.gguf.llama_converter); a rotated view's values from the view
    return export_converted(
        info, lay, out, plan, device=device, imatrix=imatrix, ctx=ctx, validate=validate,
        encode=_encode, float_only=float_only, values=values,
    )  # fmt: skip


def _precomputed(pre: Precomputed, it: _Item) -> np.ndarray:
    assert it.tm is not None
    got = pre.qtype_of(it.tm.hf_name)
    data = pre.get(it.tm.hf_name)
    if got != it.qtype or data.nbytes != it.nbytes:
        raise ExportError(
            f"The calibrated {it.tm.hf_name} is {got} of {data.nbytes} bytes; the plan says {it.qtype} "
            f"of {it.nbytes}."
        )
    return data


def _encoded_chunks(
    ckpt: Any, it: _Item, info: Any, device: str, qw: np.ndarray | None, ctx: JobContext
) -> Iterator[np.ndarray]:
    assert it.tm is not None
    for block in _row_chunks(ckpt, it, info.config):
        nan, inf = count_nonfinite(block)
        if nan or inf:
            raise nonfinite_error(it.tm.hf_name, nan, inf, info.path)
        yield _encode(block, it.qtype, device, qw)
        ctx.check_cancelled()


# ------------------------------------------------------------------------------------------ llama.cpp


def llamacpp_overrides(plan: Plan, lay: Layout) -> list[tuple[str, str]]:
    """One exact-name regex override per quantizable tensor, so llama.cpp follows the plan."""
    out = []
    for tm in lay.tensors:
        if allows_quantization(tm.gguf_name, len(tm.shape)):
            out.append(("^" + tm.gguf_name.replace(".", r"\.") + "$", plan.type_of(tm.hf_name)))
    return out


def _export_llamacpp(
    ckpt: Any,
    lay: Layout,
    out: Path,
    plan: Plan,
    inputs: tuple[Path, ...],
    imatrix: Mapping[str, Any] | None,
    ctx: JobContext,
    source_repo: str | None,
    validate: Callable[[Path], None] | None,
) -> dict[str, Any]:
    info = ckpt.info
    items = _items(plan, lay, [] if lay.converted else extra_tensors(info))
    total = sum(it.nbytes for it in items)
    f32_total = sum(4 * math.prod(it.shape) for it in items)
    check_output_path(out, inputs=inputs, need_bytes=total + f32_total)
    # the F32 intermediate lives next to the output (same file system) and is named *.partial so a
    # killed export leaves only partial files that the stale-file cleaner recognises
    tmp_final = out.with_name(f".{out.stem}.f32-{os.getpid()}{PARTIAL_SUFFIX}")
    tmp = tmp_final.with_name(tmp_final.name + PARTIAL_SUFFIX)
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    lock = None
    sub = ctx.span(0.0, 0.5)
    try:
        # the F32 intermediate carries the imatrix's quantize.imatrix.* keys; llama.cpp copies them over
        if lay.converted:
            values = ckpt if isinstance(ckpt, RotatedCheckpoint) else None
            _export_converted(
                info, lay, tmp_final, plan, "cpu", imatrix, sub, None, float_only=True, values=values
            )
        else:
            _export_studio(
                ckpt, lay, tmp_final, plan, inputs, "cpu", imatrix, sub, source_repo, None, float_only=True
            )
        lock = _hold_lock(tmp_final)
        ctx.check_cancelled()
        ctx.report(total // 2, total, "Quantizing with llama.cpp")
        imx = None
        if imatrix:
            imx = {}
            for it in items:
                v = _imatrix_for(imatrix, it)
                if v is not None:
                    imx[it.name] = v
        overrides = llamacpp_overrides(plan, lay)
        with LlamaWorker(label="llama.cpp quantize") as wk:
            # any quantized base type makes llama.cpp apply the overrides; general.file_type is
            # then set to the plan's own through a metadata override
            wk.request(
                "quantize",
                src=str(tmp_final),
                dst=str(partial),
                ftype=7,
                overrides=overrides,
                imatrix=imx,
                nthread=os.cpu_count() or 1,
                file_type=plan.ftype,
            )
        ctx.check_cancelled()
        g = read_gguf(partial)
        got = {t.name: t.type_name for t in g.tensors}
        want = {it.name: it.qtype for it in items}
        for name, t in want.items():
            if got.get(name) != t:
                raise ExportError(f"llama.cpp wrote tensor {name} as {got.get(name)}, the plan says {t}.")
        if set(got) != set(want):
            raise ExportError(
                f"llama.cpp wrote a different set of tensors than planned ({len(got)} vs {len(want)})."
            )
        planned = [PlannedTensor(t.name, tuple(t.shape), t.type_name, t.nbytes) for t in g.tensors]
        validate_written(partial, planned, None)
        if validate is not None:
            validate(partial)
        _fsync_file(partial)
        os.replace(partial, out)
        ctx.report(total, total, f"Wrote {out.name}")
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise disk_full_error(out, total + f32_total) from err
        raise ExportError(f"Exporting {out} failed: {err.strerror or err}.") from err
    finally:
        if lock is not None:
            os.close(lock)
        for p in (tmp, tmp_final, partial):
            if p.exists() and p != out:
                try:
                    p.unlink()
                except OSError:
                    pass
    return {"types": {it.name: it.qtype for it in items}, "tensor_bytes": total, "tokenizer": None}


def _hold_lock(p: Path) -> int | None:
    # an advisory lock tells remove_stale_partials that this file is in use
    try:
        import fcntl  # POSIX only (absent on Windows): tried where used
    except ImportError:  # pragma: no cover - Windows
        return None
    fd = os.open(p, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
    return fd


def llamacpp_validator(path: Path) -> None:
    """Post-write check: llama.cpp loads the file's vocabulary in a child process
    (test_llamacpp_validation_rejects_unloadable_file in tests/core/export/test_export_faults.py)."""
    with LlamaRunner(label="llama.cpp (validation)") as wk:
        try:
            wk.load(path, LoadOptions(vocab_only=True), timeout=120)
        except Exception as err:
            raise ExportError(f"llama.cpp cannot load the written file {path.name}: {err}") from err


def _fsync_file(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "BACKENDS",
    "ExportResult",
    "JobCancelled",
    "check_exportable",
    "export_file_bytes",
    "export_gguf",
    "llama_order",
    "llamacpp_overrides",
    "llamacpp_validator",
]
