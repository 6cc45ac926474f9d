"""Convert opted-in pickle checkpoints to safetensors in a spawned, memory-limited child process.

Unpickling is the dangerous step, so it never happens in the application's process: a fresh
``multiprocessing`` spawn child (no inherited state, ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` removed)
calls ``torch.load(weights_only=True)`` under an address-space limit (``RLIMIT_AS``, Linux) and
streams every tensor into a safetensors file in a private cache folder. Windows has no rlimits and
macOS does not enforce ``RLIMIT_AS``: there the child only isolates crashes and memory exhaustion.
The parent validates that file's header and renames it into place; from then on the checkpoint is
read lazily like any other safetensors file. A failed, refused or killed load leaves no file under
its final name.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pickle
import re
import secrets
import struct
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core import hardware, safejson
from studio.core.errors import ChildProcessError_, CorruptFileError, ModelOpenError, UnsafeFileError
from studio.core.jobs import JobContext, null_context
from studio.core.model.st_header import read_header
from studio.core.paths import user_cache_dir

CACHE_FORMAT = 1
"""Bump when the converted files' layout changes so stale conversions are not reused."""

DEFAULT_MEMORY_CAP = 64 * 2**30
"""Upper bound on the child's memory budget, whatever the free RAM."""

RAM_FRACTION = 0.8
"""Share of the currently available RAM the child may use (capped by ``DEFAULT_MEMORY_CAP``)."""

KEY_SAMPLE_BYTES = 1 << 20
MIN_TORCH = (2, 10)
_POLL_S = 0.1
_CHUNK = 64 << 20  # bytes written per call, so huge tensors do not need one giant buffer view

TORCH_TO_ST: dict[str, str] = {
    "torch.float32": "F32",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float64": "F64",
    "torch.complex64": "C64",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.uint16": "U16",
    "torch.uint32": "U32",
    "torch.uint64": "U64",
    "torch.bool": "BOOL",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e8m0fnu": "F8_E8M0",
}
"""torch dtype (as ``str(dtype)``) to its safetensors spelling."""


@dataclass(frozen=True)
class PickleOptions:
    """Where converted pickles are cached and how much memory their loader child may use."""

    cache_dir: Path | None = None  # None: ``pickle_cache_dir()`` under the user cache
    memory_cap: int | None = None  # None: ``DEFAULT_MEMORY_CAP``


# ------------------------------------------------------------------------------------- cache


def pickle_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding converted pickle checkpoints (under the user cache unless given)."""
    if cache_dir is not None:
        return Path(cache_dir)

    return user_cache_dir() / "pickle-safetensors"


def cache_key(file: Path) -> str:
    """A key for ``file``'s current contents: size, mtime and sha256 of its first and last MB."""
    st = file.stat()
    h = hashlib.sha256()
    with open(file, "rb") as f:
        h.update(f.read(KEY_SAMPLE_BYTES))
        if st.st_size > KEY_SAMPLE_BYTES:
            # The tail is cheap to add and catches files that differ only after the first MB.
            f.seek(max(KEY_SAMPLE_BYTES, st.st_size - KEY_SAMPLE_BYTES))
            h.update(f.read(KEY_SAMPLE_BYTES))
    ident = f"v{CACHE_FORMAT}|{st.st_size}|{st.st_mtime_ns}|{h.hexdigest()}"
    return hashlib.sha256(ident.encode()).hexdigest()[:40]


def memory_budget(cap: int | None = None) -> int:
    """Bytes the child may allocate: ``RAM_FRACTION`` of available RAM, at most ``cap``."""

    cap = DEFAULT_MEMORY_CAP if cap is None else cap
    avail = hardware.ram()[1]
    return min(int(avail * RAM_FRACTION), cap) if avail > 0 else cap


def _private_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.name == "posix":
            os.chmod(path, 0o700)  # other users must not plant or read converted weights
    except OSError as err:
        raise ModelOpenError(
            f"Cannot create the conversion cache {path}: {err.strerror or err}.",
            hint="Check the folder's permissions or free space.",
        ) from err
    return path


def _cached(target: Path) -> bool:
    """Whether ``target`` exists with a valid header; a damaged cache entry is removed."""
    if not target.is_file():
        return False
    try:
        read_header(target)
        return True
    except CorruptFileError:
        target.unlink(missing_ok=True)
        return False


def skipped_tensors(metadata: dict[str, str]) -> list[str]:
    """Names of tensors the conversion left out (dtypes safetensors cannot hold), from its metadata."""
    try:
        got = safejson.loads(metadata.get("quant_studio.skipped", "[]"), "metadata", ValueError)
    except ValueError:
        return []
    return [str(s) for s in got] if isinstance(got, list) else []


# ------------------------------------------------------------------------------------- parent


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _error_for(msg: dict[str, Any], file: Path, budget: int) -> Exception:
    kind, text = msg.get("kind"), str(msg.get("message", ""))[:300]
    if kind == "unsafe":
        # Name what it tried to load, never torch's advice to retry with weights_only=False.
        m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        what = f" (it asks for {m.group(1)})" if m else ""
        return UnsafeFileError(
            f"{file.name} was refused: it contains Python objects other than tensors, which could run code "
            f"on this machine{what}.",
            hint="Use a safetensors version of this model.",
        )
    if kind == "oom":
        return ChildProcessError_(
            f"The pickle loader ran out of memory (limit {_gb(budget)}) loading {file.name}; the file "
            "declares more data than this machine allows (it may be a pickle bomb).",
            hint="Use a safetensors version of this model, or free memory and try again.",
        )
    if kind == "torch":
        return UnsafeFileError(f"{file.name} was not loaded: {text}", hint="Update PyTorch to 2.10 or newer.")
    if kind == "write":
        return ModelOpenError(
            f"Converting {file.name} failed while writing the cache: {text}.",
            hint="Free disk space in the cache folder and try again.",
        )
    return CorruptFileError(
        f"{file.name} is not a readable PyTorch checkpoint ({text}).", hint="Re-download it."
    )


def _died(exitcode: int | None, file: Path, budget: int) -> Exception:
    if exitcode is not None and exitcode == -9:
        return ChildProcessError_(
            f"The pickle loader ran out of memory (limit {_gb(budget)}) loading {file.name}: the system "
            "killed it.",
            hint="Use a safetensors version of this model, or free memory and try again.",
        )
    how = f"signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
    return ChildProcessError_(
        f"The pickle loader crashed ({how}) loading {file.name}; the file may be malicious or damaged.",
        hint="Use a safetensors version of this model.",
    )


def _finish(partial: Path, target: Path) -> None:
    """Validate the child's output and move it under its final name."""
    read_header(partial)  # the child handled hostile data: check its output like any input
    if os.name == "posix":
        os.chmod(partial, 0o600)
    os.replace(partial, target)
    if os.name == "posix":
        try:
            fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass  # some filesystems refuse to fsync a directory; the rename itself is atomic


def _kill(proc: Any) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(5)


def _run_child(
    jobs: Sequence[tuple[Path, Path, Path]],
    budget: int,
    ctx: JobContext,
    target_fn: Callable[..., None] | None = None,
) -> None:
    """Convert ``(source, partial, target)`` jobs in one spawned child, renaming each when it is done."""
    mp = multiprocessing.get_context("spawn")
    recv, send = mp.Pipe(duplex=False)
    args = ([(str(s), str(p)) for s, p, _ in jobs], budget)
    proc = mp.Process(target=target_fn or _child_main, args=(send, *args), daemon=True)
    proc.start()
    send.close()  # so recv sees EOF when the child is gone
    done = 0
    try:
        while done < len(jobs):
            ctx.check_cancelled()
            src = jobs[done][0]
            if recv.poll(_POLL_S):
                try:
                    msg = recv.recv()
                except (EOFError, OSError):
                    proc.join(10)
                    raise _died(proc.exitcode, src, budget) from None
                if not isinstance(msg, dict):
                    raise _died(proc.exitcode, src, budget)
                if msg.get("kind") == "done":
                    _finish(jobs[done][1], jobs[done][2])
                    done += 1
                    ctx.report(done, len(jobs), f"converted {src.name}")
                elif msg.get("kind") == "progress":
                    ctx.report(done, len(jobs), f"loading {src.name} (weights only, in a child process)")
                else:
                    raise _error_for(msg, src, budget)
            elif not proc.is_alive() and not recv.poll(0):
                raise _died(proc.exitcode, src, budget)
    except BaseException:  # an error, JobCancelled or Ctrl-C: the child must not outlive us
        _kill(proc)
        raise
    finally:
        recv.close()
        for _, partial, _ in jobs:
            partial.unlink(missing_ok=True)
    proc.join(10)
    if proc.is_alive():
        _kill(proc)


def convert_pickles(
    files: Sequence[Path],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    memory_cap: int | None = None,
    ctx: JobContext | None = None,
) -> list[Path]:
    """Safetensors copies of the pickle ``files`` (converted in a child process unless cached), in order."""
    ctx = ctx or null_context()
    cache = _private_dir(pickle_cache_dir(cache_dir))
    targets = [cache / f"{cache_key(f)}.safetensors" for f in files]
    todo = []
    for src, target in zip(files, targets, strict=True):
        if not _cached(target) and all(t[2] != target for t in todo):
            partial = target.with_name(f"{target.name}.partial-{secrets.token_hex(4)}")
            todo.append((src, partial, target))
    if todo:
        ctx.report(0, len(todo), f"loading {todo[0][0].name} (weights only, in a child process)")
        _run_child(todo, memory_budget(memory_cap), ctx)
    return targets


# -------------------------------------------------------------------------------------- child


def _address_space_used() -> int:
    """This process's virtual memory size in bytes (0 when the OS will not say)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _limit_memory(budget: int, mapped: int) -> None:
    """Cap the address space at what is mapped now + the files torch will mmap + ``budget``."""
    try:
        import resource  # child side, and POSIX only (absent on Windows)
    except ImportError:  # Windows: no rlimits; the child still isolates crashes
        return
    used = _address_space_used()
    if used == 0:
        # Without /proc (macOS) we cannot tell what torch already mapped, and macOS does not enforce
        # RLIMIT_AS anyway: rely on the child's isolation and on reporting how it died.
        return
    limit = used + mapped + budget
    try:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass  # a stricter hard limit or an odd kernel: the load still runs isolated in this child


def _is_zip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def torch_load_weights_only(file: str | os.PathLike[str]) -> Any:
    """``torch.load`` with ``weights_only=True`` passed explicitly (memory-mapped when the file allows)."""
    import torch

    with warnings.catch_warnings():  # torch warns about pickle protocols; our error says enough
        warnings.simplefilter("ignore", UserWarning)
        if _is_zip(str(file)):
            return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        # Legacy (non-zip) pickles cannot be memory-mapped; still weights-only.
        return torch.load(file, map_location="cpu", weights_only=True)


def state_dict_of(obj: Any) -> dict[str, Any] | None:
    """The ``name -> tensor`` dict inside a loaded checkpoint (unwrapping ``state_dict``/``model``)."""
    import torch

    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
                obj = obj[key]
                break
    if not isinstance(obj, dict):
        return None
    return {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def write_safetensors(tensors: dict[str, Any], out: str, source_name: str) -> None:
    """Stream ``tensors`` into a safetensors file one tensor at a time, then fsync it.

    ``safetensors.torch.save_file`` builds every tensor's bytes in memory at once and refuses shared
    storage (tied weights), so a memory-mapped multi-GB state dict would need twice its size in RAM.
    """
    import torch

    header: dict[str, Any] = {}
    keep: list[tuple[str, Any]] = []
    skipped: list[str] = []
    pos = 0
    for name, t in tensors.items():
        dtype = TORCH_TO_ST.get(str(t.dtype))
        # "__metadata__" is the header's own key in safetensors, so no tensor may take that name.
        if dtype is None or t.layout != torch.strided or t.device.type != "cpu" or name == "__metadata__":
            skipped.append(name)
            continue
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [pos, pos + nbytes]}
        keep.append((name, t))
        pos += nbytes
    header["__metadata__"] = {
        "format": "pt",
        "quant_studio.source": source_name,
        "quant_studio.skipped": json.dumps(skipped),
    }
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _name, t in keep:
            flat = t.detach().contiguous().reshape(-1)
            if flat.numel() == 0:
                continue
            data = flat.view(torch.uint8).numpy()  # little-endian on every platform we ship
            for i in range(0, data.size, _CHUNK):
                f.write(memoryview(np.ascontiguousarray(data[i : i + _CHUNK])))
        f.flush()
        os.fsync(f.fileno())


def _child_main(conn: Any, jobs: list[tuple[str, str]], budget: int) -> None:
    """Entry point of the spawned child: load each source weights-only and write its partial file."""
    # An environment override must not turn weights_only off (we also pass it explicitly).
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)

    def send(kind: str, message: str = "") -> None:
        conn.send({"kind": kind, "message": message})

    try:
        import torch
    except ImportError:
        send("torch", "PyTorch is not installed, so pickle checkpoints cannot be opened.")
        return
    version = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if version < MIN_TORCH:
        send(
            "torch", f"PyTorch {torch.__version__} is older than 2.10, whose weights-only loader we require."
        )
        return
    torch.set_num_threads(1)  # no thread pools: fewer mappings under the limit, nothing to gain here

    _limit_memory(budget, sum(os.path.getsize(s) for s, _ in jobs if _is_zip(s)))
    for src, partial in jobs:
        send("progress")
        try:
            sd = state_dict_of(torch_load_weights_only(src))
        except pickle.UnpicklingError as err:
            # Keep torch's diagnosis, drop its advice to retry with weights_only=False.
            send("unsafe", str(err).rpartition("WeightsUnpickler error:")[2].strip()[:300])
            return
        except MemoryError:
            send("oom")
            return
        except Exception as err:  # torch reports allocation failures as RuntimeError
            text = str(err)
            if "can't allocate memory" in text or "bad_alloc" in text or "Cannot allocate memory" in text:
                send("oom", text[:200])
            else:
                send("corrupt", f"{type(err).__name__}: {text[:200]}")
            return
        if sd is None:
            send("corrupt", "it does not hold a state dict of tensors")
            return
        try:
            write_safetensors(sd, partial, os.path.basename(src))
        except MemoryError:
            send("oom")
            return
        except OSError as err:
            send("write", err.strerror or str(err))
            return
        except Exception as err:  # e.g. a tensor subclass numpy cannot view
            send("corrupt", f"{type(err).__name__}: {str(err)[:200]}")
            return
        del sd
        send("done")
    conn.close()


__all__ = [
    "CACHE_FORMAT",
    "DEFAULT_MEMORY_CAP",
    "PickleOptions",
    "RAM_FRACTION",
    "TORCH_TO_ST",
    "cache_key",
    "convert_pickles",
    "memory_budget",
    "pickle_cache_dir",
    "skipped_tensors",
    "state_dict_of",
    "torch_load_weights_only",
    "write_safetensors",
]
