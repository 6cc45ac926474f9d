"""Atomic, streaming GGUF writing over gguf-py's GGUFWriter.

The file is written as ``OUT.partial`` in the target directory (same file system, so the final
``os.replace`` is atomic), one tensor at a time, fsynced, validated by re-reading its header with
our bounded reader (and the tensor bytes against checksums taken while writing), and only then
renamed. Any error or cancellation removes the partial file; an existing OUT is never touched
before the new file is complete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from studio.core.errors import CorruptFileError, ExportError
from studio.core.ggml_types import ggml_type_id
from studio.core.gguf.read import read_gguf
from studio.core.gguf.rowcheck import RowCheck
from studio.core.units import format_bytes

PARTIAL_SUFFIX = ".partial"

try:  # POSIX advisory lock: tells the stale-file cleaner that a partial file is still being written
    import fcntl
except ImportError:  # pragma: no cover - Windows: an open file cannot be deleted anyway
    fcntl = None  # type: ignore[assignment]


def llama_order(name: str) -> tuple[int, str]:
    """The sort key of the tensor ``name`` in llama.cpp's files: block number, then name; others first."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1]), name
    return -1, name


def partial_path(out: Path) -> Path:
    """Where ``out`` is written before the final rename."""
    return out.with_name(out.name + PARTIAL_SUFFIX)


def disk_full_error(out: Path, need_bytes: int) -> ExportError:
    """The error for ENOSPC while writing ``out``.

    Tested by tests/core/export/test_export_faults.py::test_full_disk_is_a_clear_error.
    """
    return ExportError(
        f"Out of disk space writing {out} (need about {format_bytes(need_bytes)}).",
        hint="Free some space or choose another folder; the partial file was deleted.",
    )


def check_output_path(out: Path, *, inputs: tuple[Path, ...] = (), need_bytes: int = 0) -> Path:
    """Refuse up front an output that equals an input, sits in a missing or read-only folder,
    or is a folder; warn-free when fine. Returns the resolved path."""
    out = Path(out).expanduser()
    if out.exists() and out.is_dir():
        raise ExportError(f"The output {out} is a folder; give a file name ending in .gguf.")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        raise ExportError(
            f"The output folder {parent} does not exist.", hint="Create it or choose another one."
        )
    if not parent.is_dir():
        raise ExportError(f"The output folder {parent} is not a folder.")
    resolved = out.resolve()
    for inp in inputs:
        ip = Path(inp).resolve()
        if resolved == ip or (ip.is_dir() and resolved.parent == ip and resolved.suffix != ".gguf"):
            raise ExportError(
                f"The output {out} is the input model file itself.", hint="Choose another output name."
            )
        if ip.is_file() and out.exists() and os.path.samefile(out, ip):
            raise ExportError(
                f"The output {out} is the input model file itself.", hint="Choose another output name."
            )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(
            f"Cannot write to the folder {parent}: permission denied.",
            hint="Choose a folder you can write to.",
        )
    if out.exists() and not os.access(out, os.W_OK) and not os.access(parent, os.W_OK):
        raise ExportError(f"Cannot replace {out}: permission denied.")
    if need_bytes:
        with contextlib.suppress(OSError):
            free = (
                os.statvfs(parent).f_bavail * os.statvfs(parent).f_frsize if hasattr(os, "statvfs") else None
            )
            if free is not None and free < need_bytes:
                raise disk_full_error(out, need_bytes)
    return resolved


def stale_partials(folder: Path) -> list[Path]:
    """``*.partial`` GGUF files in ``folder`` that no process is writing any more."""
    out = []
    for p in Path(folder).glob("*" + PARTIAL_SUFFIX):
        if not p.is_file():
            continue
        if fcntl is not None:
            try:
                with open(p, "rb") as f:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            except OSError:
                continue  # locked: an export is writing it right now
        out.append(p)
    return out


def remove_stale_partials(
    folder: Path, *, min_age_s: float = 0.0, older_than: float | None = None
) -> list[Path]:
    """Delete partial files left by killed exports; returns what was removed.

    ``older_than`` (a time stamp): only files last written before it. Tested by
    tests/core/export/test_export_faults.py::test_stale_partials_are_cleaned.
    """
    removed = []
    now = time.time()
    for p in stale_partials(folder):
        with contextlib.suppress(OSError):
            mtime = p.stat().st_mtime
            if now - mtime >= min_age_s and (older_than is None or mtime < older_than):
                p.unlink()
                removed.append(p)
    return removed


_LOADED_AT = time.time()  # a bound for process_start_time where /proc is missing (not Linux)


def process_start_time() -> float:
    """When this process started (seconds since the epoch; at worst one clock tick, 10 ms, early on Linux,
    elsewhere when this module was loaded)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: start time in clock ticks
        # The start is counted in ticks since boot on the boot-time clock. /proc/stat's btime is whole
        # seconds, so btime + ticks was up to a second early, and a partial file that a killed export had
        # written in that second looked newer than this run and was kept. The same clock read now does not
        # round.
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_start
    except (OSError, ValueError, IndexError, AttributeError):
        return _LOADED_AT


def clean_stale_partials(folder: Path) -> list[Path]:
    """At the start of a run that writes into ``folder``: remove the ``*.partial`` files and hidden
    ``.NAME.spool-PID.partial`` spools that killed runs left there, that is the unlocked ones last
    written before this process started (a concurrent run's files are locked or newer). Never raises.

    Tested by tests/cli/test_stale_partials.py (kill -9 in export, GPTQ export and calibration).
    """
    try:
        return remove_stale_partials(Path(folder), older_than=process_start_time())
    except Exception:  # cleaning up is a courtesy; it must never stop the run itself
        return []


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor to be written: GGUF name, numpy shape, GGML type name and byte count."""

    name: str
    shape: tuple[int, ...]
    qtype: str
    nbytes: int


class AtomicGGUFWriter:
    """Write one GGUF file atomically, streaming tensor data.

    Use::

        with AtomicGGUFWriter(out, arch) as w:
            w.kv.add_uint32(...)           # metadata through gguf-py's GGUFWriter
            w.add_tensor_info(name, shape, "Q4_K", nbytes)
            w.begin()                      # header, metadata and tensor infos hit the disk
            for ...: w.write_tensor(name, data)
            w.commit(validate=...)         # fsync, validate, rename
        # leaving the block without commit (error, cancel) removes the partial file
    """

    def __init__(self, out: Path, arch: str) -> None:
        self.out = Path(out)
        self.partial = partial_path(self.out)
        self._gguf = gguf
        # path=None: gguf-py must not open (or print about) anything until begin()
        self.kv = gguf.GGUFWriter(None, arch)
        self.planned: list[PlannedTensor] = []
        self._crc: dict[str, int] = {}
        self._next = 0
        self._file: Any = None
        self._committed = False
        self._lock_fd: int | None = None

    # -- context management: always clean up unless committed
    def __enter__(self) -> AtomicGGUFWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._committed:
            self.abort()

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data planned so far."""
        return sum(t.nbytes for t in self.planned)

    def add_tensor_info(self, name: str, shape: tuple[int, ...], qtype: str, nbytes: int) -> None:
        """Declare the next tensor (order of declaration = order of writing)."""
        # gguf-py's writer packs raw_dtype as a u32: a bare id serves a type it cannot name (Q2_0)
        members = self._gguf.GGMLQuantizationType.__members__
        gq = members[qtype] if qtype in members else ggml_type_id(qtype)
        self.kv.add_tensor_info(
            name, tuple(int(s) for s in shape), np.dtype(np.float32), int(nbytes), raw_dtype=gq
        )
        self.planned.append(PlannedTensor(name, tuple(int(s) for s in shape), qtype, int(nbytes)))

    def begin(self) -> None:
        """Create the partial file and write the header, metadata and tensor infos."""
        clean_stale_partials(self.partial.parent)
        try:
            self.kv.write_header_to_file(self.partial)
            self._file = self.kv.fout[0]
            if fcntl is not None:
                self._lock_fd = os.dup(self._file.fileno())
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.kv.write_kv_data_to_file()
            self.kv.write_ti_data_to_file()
        except OSError as err:
            self._raise_os(err, "creating")

    def write_tensor(self, name: str, data: np.ndarray) -> None:
        """Write the data of the next declared tensor (raw bytes or float array)."""
        if self._next >= len(self.planned):
            raise ExportError(f"Internal error: tensor {name!r} was not declared before writing.")
        pt = self.planned[self._next]
        if pt.name != name:
            raise ExportError(f"Internal error: expected tensor {pt.name!r} next, got {name!r}.")
        arr = np.ascontiguousarray(data)
        if arr.nbytes != pt.nbytes:
            raise ExportError(
                f"Internal error: tensor {name!r} has {arr.nbytes} bytes, {pt.nbytes} were declared for {pt.qtype}."
            )
        self._crc[name] = zlib.crc32(memoryview(arr).cast("B"))
        try:
            self.kv.write_tensor_data(arr)
        except OSError as err:
            self._raise_os(err, f"writing tensor {name} to")
        self._next += 1

    def write_tensor_chunks(self, name: str, chunks: Iterator[np.ndarray] | list[np.ndarray]) -> None:
        """Write the next declared tensor from consecutive pieces of its data (streaming)."""
        if self._next >= len(self.planned):
            raise ExportError(f"Internal error: tensor {name!r} was not declared before writing.")
        pt = self.planned[self._next]
        if pt.name != name:
            raise ExportError(f"Internal error: expected tensor {pt.name!r} next, got {name!r}.")
        f = self._file
        align = self.kv.data_alignment
        written = 0
        crc = 0
        try:
            pad = (-f.tell()) % align
            if pad:
                f.write(b"\0" * pad)
            check = RowCheck(pt.qtype)
            for c in chunks:
                c = np.ascontiguousarray(c)
                if c.size == 0:  # a tensor with a zero-size dimension: no bytes (memoryview refuses it)
                    continue
                bad = check.feed(c)
                if bad is not None:
                    # llama-quantize's "quantized data validation failed", as a sentence
                    self.abort()
                    raise ExportError(
                        f"Tensor {name!r} as {pt.qtype} holds NaN or Inf (block {bad:,}); the export was "
                        "stopped and the partial file deleted.",
                        hint="An importance matrix with huge values or damaged weights causes this.",
                    )
                b = memoryview(c).cast("B")
                crc = zlib.crc32(b, crc)
                f.write(b)
                written += len(b)
                if written > pt.nbytes:
                    break
            if written != pt.nbytes:
                raise ExportError(
                    f"Internal error: tensor {name!r} produced {written} bytes, {pt.nbytes} were declared for {pt.qtype}."
                )
            pad = (-pt.nbytes) % align
            if pad:
                f.write(b"\0" * pad)
        except OSError as err:
            self._raise_os(err, f"writing tensor {name} to")
        self._crc[name] = crc
        self._next += 1

    def _raise_os(self, err: OSError, what: str) -> None:
        self.abort()
        if err.errno in (errno.ENOSPC, errno.EDQUOT if hasattr(errno, "EDQUOT") else errno.ENOSPC):
            raise disk_full_error(self.out, self.total_bytes + 1_000_000) from err
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ExportError(
                f"Permission denied {what} {self.partial}.", hint="Choose a folder you can write to."
            ) from err
        raise ExportError(f"Error {what} {self.partial}: {err.strerror or err}.") from err

    def commit(self, validate: Callable[[Path], None] | None = None) -> Path:
        """Flush, fsync, validate and rename the file to its final name; returns it."""
        if self._next != len(self.planned):
            raise ExportError(
                f"Internal error: {len(self.planned) - self._next} declared tensors were not written to {self.out}."
            )
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self.kv.close()
            self._file = None
        except OSError as err:
            self._raise_os(err, "finishing")
        try:
            validate_written(self.partial, self.planned, self._crc)
            if validate is not None:
                validate(self.partial)
        except CorruptFileError as err:
            self.abort()
            raise ExportError(
                f"The written file failed validation and was deleted: {err.message}",
                hint="This is a bug in the exporter; please report it.",
            ) from err
        except BaseException:
            self.abort()
            raise
        try:
            os.replace(self.partial, self.out)
            self._release_lock()
            _fsync_dir(self.out.parent)
        except OSError as err:
            self.abort()
            if getattr(err, "winerror", None) == 1224 or isinstance(err, PermissionError):
                raise ExportError(
                    f"Cannot replace {self.out}: it is in use or read-only.",
                    hint="Close any chat using that file, or choose another name.",
                ) from err
            raise ExportError(
                f"Cannot rename the finished file to {self.out}: {err.strerror or err}."
            ) from err
        self._committed = True
        return self.out

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    def abort(self) -> None:
        """Close and delete the partial file (idempotent)."""
        with contextlib.suppress(Exception):
            self.kv.close()
        self._file = None
        self._release_lock()
        with contextlib.suppress(FileNotFoundError, OSError):
            self.partial.unlink()


def _fsync_dir(folder: Path) -> None:
    # make the rename itself durable; not possible (nor needed) on Windows
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _iter_file_chunks(f: Any, n: int, chunk: int = 16 << 20) -> Iterator[bytes]:
    while n > 0:
        b = f.read(min(chunk, n))
        if not b:
            return
        n -= len(b)
        yield b


def validate_written(path: Path, planned: list[PlannedTensor], crcs: dict[str, int] | None = None) -> None:
    """Re-read ``path``'s header with the bounded reader and check it declares exactly the planned
    tensors (name, shape, type, size, inside the file); with ``crcs``, re-read each tensor's bytes
    and compare checksums. CorruptFileError on any mismatch
    (tests/core/export/test_export_faults.py::test_writer_bug_fails_validation_and_deletes)."""
    g = read_gguf(path)
    if len(g.tensors) != len(planned):
        raise CorruptFileError(f"{path.name} declares {len(g.tensors)} tensors, {len(planned)} were written.")
    for t, p in zip(g.tensors, planned, strict=True):
        if t.name != p.name or tuple(t.shape) != p.shape or t.type_name != p.qtype or t.nbytes != p.nbytes:
            raise CorruptFileError(
                f"{path.name}: tensor {p.name!r} reads back as {t.name!r} {t.type_name} {t.shape} "
                f"({t.nbytes} bytes), expected {p.qtype} {p.shape} ({p.nbytes} bytes)."
            )
        if t.offset + t.nbytes > g.file_size:
            raise CorruptFileError(f"{path.name}: tensor {p.name!r} runs past the end of the file.")
    if crcs:
        with open(path, "rb") as f:
            for t in g.tensors:
                f.seek(t.offset)
                crc = 0
                for b in _iter_file_chunks(f, t.nbytes):
                    crc = zlib.crc32(b, crc)
                if crcs.get(t.name) != crc:
                    raise CorruptFileError(
                        f"{path.name}: the bytes of tensor {t.name!r} differ from what was written."
                    )
