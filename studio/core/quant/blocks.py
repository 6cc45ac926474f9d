"""Quantize and dequantize tensors in every GGUF weight format, byte-identical to llama.cpp.

``quantize`` takes a numpy array or a torch tensor (CPU, CUDA, MPS); the last dimension is the row
that blocks run along (ggml's ``ne[0]``) and leading dimensions are flattened into rows. Large inputs
are cut into row chunks written into one preallocated output, so memory stays bounded; on the CPU the
chunks run on a thread pool (the numba kernels release the GIL), on a GPU one after the other.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.quant import iquants, kquants, legacy, lowbit
from studio.core.quant.types import FLOAT_TYPES, QTYPES, QTypeInfo, fallback_type, qtype_info, row_bytes

if TYPE_CHECKING:
    from studio.core.jobs import JobContext

__all__ = [
    "QTYPES",
    "QTypeInfo",
    "dequantize",
    "fallback_type",
    "qtype_info",
    "quantize",
    "row_bytes",
]


# Elements per CPU chunk: ~1 MiB of float32 stays in L2 while a kernel walks it.
_CPU_CHUNK = 1 << 18
_GPU_CHUNK = 1 << 22  # temporaries stay well under 1 GiB on small GPUs


def _name(qtype: Any) -> str:
    return qtype_info(qtype).name


def _is_torch(x: Any) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "device") and hasattr(x, "dtype")


def _shape_error(name: str, shape: tuple[int, ...], bs: int) -> QuantizationError:
    fb = fallback_type(name, shape[-1]).qtype
    return QuantizationError(
        f"A tensor of shape {shape} cannot be quantized to {name}: its rows of {shape[-1]} values are not "
        f"a multiple of the {bs}-value block; llama.cpp would use {fb} for it.",
        hint=f"Choose {fb} for this tensor.",
    )


def _nonfinite_error(
    count: int, index: tuple[int, ...], shape: tuple[int, ...], wide: bool = False
) -> QuantizationError:
    # float64 values beyond float32's range turn infinite on the way in: say so, they looked finite
    what = (
        "NaN or infinite value(s) (or values beyond float32's range)" if wide else "NaN or infinite value(s)"
    )
    return QuantizationError(
        f"A tensor of shape {shape} contains {count} {what}, the first at index {index}; "
        "llama.cpp would write garbage for it.",
        hint="Fix or exclude the tensor before quantizing.",
    )


def _check_dtype(x: Any, is_t: bool) -> None:
    """Only real numbers convert to float32 meaningfully; complex would silently lose its imaginary part."""
    if is_t:
        ok = not x.is_complex()
        kind = str(x.dtype).replace("torch.", "")
    else:
        ok = x.dtype.kind in "biuf"
        kind = str(x.dtype)
    if not ok:
        raise QuantizationError(
            f"A tensor of shape {tuple(x.shape)} has dtype {kind}; only real numbers can be quantized.",
            hint="Convert it to a float array first.",
        )


def _validate(shape: tuple[int, ...], name: str) -> tuple[int, int]:
    if len(shape) == 0:
        if name not in FLOAT_TYPES:
            raise QuantizationError(
                f"A 0-d scalar cannot be quantized to {name}; keep it in F32 or F16.",
            )
        return 1, 1
    n = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    bs = QTYPES[name].block_size
    if n % bs:
        raise _shape_error(name, shape, bs)
    return rows, n


def _check_imatrix(imatrix: Any, n: int, name: str) -> np.ndarray | None:
    if imatrix is None:
        return None
    if _is_torch(imatrix):
        imatrix = imatrix.detach().to("cpu").numpy()
    qw = np.ascontiguousarray(np.asarray(imatrix, dtype=np.float32).reshape(-1))
    if qw.size != n:
        raise QuantizationError(
            f"The importance matrix has {qw.size} values but the rows have {n}; {name} needs one per input column.",
        )
    if not np.isfinite(qw).all():
        raise QuantizationError("The importance matrix contains NaN or infinite values; recompute it.")
    return qw


def _first_bad(chunk: np.ndarray, r0: int, lead: tuple[int, ...], n: int) -> tuple[int, tuple[int, ...]]:
    bad = ~np.isfinite(chunk)
    flat = int(np.argmax(bad.reshape(-1)))
    r, c = divmod(flat, n)
    idx = np.unravel_index(r0 + r, lead) if lead else ()
    return int(bad.sum()), (*(int(i) for i in idx), int(c))


def _cpu_rows(x2: np.ndarray, name: str, qw: np.ndarray | None, out: np.ndarray) -> None:
    if QTYPES[name].kquant:
        kquants.quantize_rows(x2, name, qw, out=out)
    elif name in iquants.IQ_TYPES:
        iquants.quantize_rows(x2, name, qw, out=out)
    elif name in lowbit.LOWBIT_TYPES:
        lowbit.quantize_rows(x2, name, qw, out=out)
    else:
        legacy.quantize_rows(x2, name, qw, out)


def quantize(
    x: Any,
    qtype: Any,
    imatrix: Any = None,
    *,
    ctx: JobContext | None = None,
    threads: int | None = None,
    backend: str = "auto",
) -> np.ndarray:
    """Quantize ``x`` to ``qtype``; returns uint8 ``(rows, bytes per row)`` identical to llama.cpp.

    ``backend="auto"`` runs numpy arrays and CPU tensors on the CPU kernels and CUDA/MPS tensors on
    their device; ``"torch"`` forces the torch implementation on the tensor's device (CPU for numpy).
    """
    name = _name(qtype)
    if backend not in ("auto", "torch", "numpy"):
        raise QuantizationError(f"Unknown quantization backend {backend!r}; use auto, numpy or torch.")
    is_t = _is_torch(x)
    if not is_t and not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError) as err:
            raise QuantizationError(
                f"A {type(x).__name__} cannot be quantized: it is not an array of numbers ({err})."
            ) from None
    _check_dtype(x, is_t)
    shape = tuple(int(s) for s in x.shape)
    rows, n = _validate(shape, name)
    qw = _check_imatrix(imatrix, n, name)
    if qw is None and QTYPES[name].needs_imatrix and rows * n:
        raise iquants.imatrix_required_error(name)  # before any work (an empty tensor has none)
    out = np.empty((rows, row_bytes(name, n)), dtype=np.uint8)
    if rows == 0 or n == 0:
        return out
    use_torch = backend == "torch" or (backend == "auto" and is_t and x.device.type != "cpu")
    if use_torch and name in iquants.IQ_TYPES:
        use_torch = False  # no torch path for these: the CPU kernels run (a GPU tensor is copied over)
    if use_torch:
        _quantize_torch(x, shape, rows, n, name, qw, out, ctx)
        return out
    _quantize_cpu(_row_source(x, is_t, rows, n), rows, n, shape, name, qw, out, ctx, threads, _wide(x))
    return out


def _wide(x: Any) -> bool:
    """Whether ``x`` holds values float32 may not represent (float64 and wider)."""
    if _is_torch(x):
        return bool(x.is_floating_point()) and x.dtype.itemsize > 4
    return x.dtype.kind == "f" and x.dtype.itemsize > 4


def _row_source(x: Any, is_t: bool, rows: int, n: int):
    """A function giving rows [r0, r1) as C-contiguous float32; converts per chunk to bound memory."""
    if is_t:
        import torch

        xt = x.detach().reshape(rows, n)
        if xt.device.type != "cpu":
            xt = xt.to("cpu")
        return lambda r0, r1: xt[r0:r1].to(torch.float32).contiguous().numpy()
    xa = np.asarray(x).reshape(rows, n)

    def rows_of(r0: int, r1: int) -> np.ndarray:
        with np.errstate(over="ignore"):  # float64 overflow becomes inf, reported as such by the caller
            return np.ascontiguousarray(xa[r0:r1], dtype=np.float32)

    return rows_of


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours container CPU limits
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _quantize_cpu(src, rows, n, shape, name, qw, out, ctx, threads, wide=False) -> None:
    step = max(1, _CPU_CHUNK // n)
    starts = list(range(0, rows, step))
    lead = shape[:-1]
    bad: dict[int, tuple[int, tuple[int, ...]]] = {}

    def work(r0: int) -> None:
        if ctx is not None:
            ctx.check_cancelled()
        r1 = min(rows, r0 + step)
        chunk = src(r0, r1)
        if not legacy.all_finite(chunk):
            bad[r0] = _first_bad(chunk, r0, lead, n)
            return
        if bad:  # the call will fail; only keep counting
            return
        _cpu_rows(chunk, name, qw, out[r0:r1])

    nthreads = max(1, min(threads or _cpu_count(), len(starts)))
    if nthreads == 1:
        for r0 in starts:
            work(r0)
            if ctx is not None:
                ctx.report(min(rows, r0 + step), rows, f"{name}")
    else:
        with ThreadPoolExecutor(max_workers=nthreads) as pool:
            futures = {pool.submit(work, r0): r0 for r0 in starts}
            pending = set(futures)
            done_rows = 0
            try:
                while pending:
                    finished, pending = wait(pending, return_when="FIRST_COMPLETED")
                    for f in finished:
                        f.result()
                        done_rows += min(rows, futures[f] + step) - futures[f]
                    if ctx is not None:
                        ctx.report(done_rows, rows, f"{name}")
                        ctx.check_cancelled()
            except BaseException:
                for f in pending:
                    f.cancel()
                raise
    if bad:
        # Chunks skipped once the call was known to fail were not all counted: count every row now.
        count = sum(int(np.count_nonzero(~np.isfinite(src(r0, min(rows, r0 + step))))) for r0 in starts)
        raise _nonfinite_error(count, bad[min(bad)][1], shape, wide)


def _quantize_torch(x, shape, rows, n, name, qw, out, ctx) -> None:
    import torch

    wide = _wide(x)
    if not _is_torch(x):
        with np.errstate(over="ignore"):  # checked against float32's range below
            x = torch.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=np.float32)))
    x2 = x.detach().reshape(rows, n)
    dev = x2.device
    finite = torch.isfinite(x2)
    if wide:  # float64 beyond float32's range becomes inf in the kernels' float32
        finite &= x2.abs() <= float(np.finfo(np.float32).max)
    if not bool(finite.all()):
        bad = ~finite
        count = int(bad.sum())
        flat = int(bad.reshape(-1).to(torch.uint8).argmax())
        r, c = divmod(flat, n)
        lead = shape[:-1]
        idx = (*(int(i) for i in np.unravel_index(r, lead)), c) if lead else (c,)
        raise _nonfinite_error(count, idx, shape, wide)
    qwt = None if qw is None else torch.from_numpy(qw).to(dev)
    if QTYPES[name].kquant:
        from studio.core.quant.kquants_torch import quantize_rows_torch as fn
    elif name in lowbit.LOWBIT_TYPES:
        from studio.core.quant.lowbit_torch import quantize_rows_torch as fn
    else:
        from studio.core.quant.legacy_torch import quantize_rows_torch as fn
    # ~1M values per CPU chunk: a torch chunk takes ~0.5 s there, so Stop stays prompt
    step = max(1, (_CPU_CHUNK * 4 if dev.type == "cpu" else _GPU_CHUNK) // n)
    for r0 in range(0, rows, step):
        if ctx is not None:
            ctx.check_cancelled()
        r1 = min(rows, r0 + step)
        q = fn(x2[r0:r1].to(torch.float32), name, qwt)
        out[r0:r1] = q.to("cpu").numpy()
        if ctx is not None:
            ctx.report(r1, rows, name)


def dequantize(data: Any, qtype: Any, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """Decode bytes of ``qtype`` (any array of uint8 of the right size) into float32 of ``shape``."""
    name = _name(qtype)
    shape = tuple(int(s) for s in shape)
    rows, n = _validate(shape, name)
    if _is_torch(data):  # np.asarray cannot read a CUDA/MPS tensor
        data = data.detach().to("cpu").numpy()
    raw = np.ascontiguousarray(np.asarray(data)).view(np.uint8).reshape(-1)
    rb = row_bytes(name, n)
    if raw.size != rows * rb:
        raise QuantizationError(
            f"{name} data of {raw.size} bytes does not match shape {shape} ({rows * rb} bytes expected).",
        )
    if rows * n == 0:
        return np.zeros(shape, dtype=np.float32)
    d2 = raw.reshape(rows, rb)
    if QTYPES[name].kquant:
        y = kquants.dequantize_rows(d2, name, n)
    elif name in iquants.IQ_TYPES:
        y = iquants.dequantize_rows(d2, name, n)
    elif name in lowbit.LOWBIT_TYPES:
        y = lowbit.dequantize_rows(d2, name, n)
    else:
        y = legacy.dequantize_rows(d2, name, n)
    return np.asarray(y, dtype=np.float32).reshape(shape)
