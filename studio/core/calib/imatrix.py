"""The importance matrix in llama.cpp's formats: computed from activation statistics, written, read, checked.

Semantics follow llama-imatrix (``tools/imatrix/imatrix.cpp``): one entry per matrix product whose
weight is named ``blk.*`` (``output.weight`` only when asked for, and only when the model has one:
a head tied to the embeddings is ``token_embd.weight`` there and is never collected); an entry holds
Σx² per input column and the number of tokens, one row of each per expert for MoE tensors.

Files:

* GGUF (default): ``general.type`` = "imatrix", ``imatrix.datasets`` (strings), ``imatrix.chunk_count``
  and ``imatrix.chunk_size`` (u32); per entry ``<name>.in_sum2`` (F32, ne = [n_cols, n_experts]) and
  ``<name>.counts`` (F32, ne = [1, n_experts]); entries in byte order of their names.
* Legacy ``.dat``: int32 entry count; per entry int32 name length, the name, int32 ncall, int32 nval
  and nval float32 holding (Σx² / count) × ncall; then int32 chunk count, int32 length and the
  dataset name.

``Imatrix.vector(name)`` (or ``imatrix[name]``) is what llama-quantize hands its quantizer: Σx² / count per expert (1 where
an expert saw no token) for GGUF files, stored / ncall for legacy files, in float32 as the C code
computes it, so an export with our imatrix is byte-identical to llama-quantize's.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.atomic import write_atomic
from studio.core.errors import CalibrationError, CorruptFileError, ExportError
from studio.core.gguf import writer
from studio.core.gguf.layout import layout
from studio.core.gguf.read import read_gguf
from studio.core.gguf.writer import AtomicGGUFWriter
from studio.core.safejson import bounded_int

GGUF_MAGIC = b"GGUF"
KV_DATASETS = "imatrix.datasets"
KV_CHUNK_COUNT = "imatrix.chunk_count"
KV_CHUNK_SIZE = "imatrix.chunk_size"
# What llama-quantize records in the quantized model (tools/quantize/quantize.cpp).
QUANTIZE_KV_FILE = "quantize.imatrix.file"
QUANTIZE_KV_DATASET = "quantize.imatrix.dataset"
QUANTIZE_KV_ENTRIES = "quantize.imatrix.entries_count"
QUANTIZE_KV_CHUNKS = "quantize.imatrix.chunks_count"
_KV_STR_BYTES = 127  # llama_model_kv_override.val_str holds 128 bytes with the NUL
_MAX_NAME = 4096
_SUFFIX_SUMS = ".in_sum2"
_SUFFIX_COUNTS = ".counts"
_BLK = re.compile(r"^blk\.\d+\.")
# Σx²/count is a mean squared activation; beyond this no float32 quantizer weighted by it stays
# finite (llama-quantize then fails "quantized data validation"), so such a file is refused on reading.
MAX_IMATRIX_VALUE = 1e30
_U32 = (1 << 32) - 1


@dataclass(frozen=True, eq=False)
class ImatrixEntry:
    """One weight's data as stored: GGUF files hold Σx² and token counts; legacy files hold
    (Σx²/count)·ncall in ``sums`` and ``[ncall]`` in ``counts``."""

    name: str
    sums: np.ndarray  # float32 (n_experts, n_cols); legacy: (1, nval)
    counts: np.ndarray  # float32 (n_experts,); legacy: (1,) = ncall

    def __post_init__(self) -> None:
        self.sums.flags.writeable = False
        self.counts.flags.writeable = False

    @property
    def n_experts(self) -> int:
        """Rows of sums (experts)."""
        return int(self.counts.shape[0])

    @property
    def size(self) -> int:
        """Values in the entry (n_cols × n_experts)."""
        return int(self.sums.size)


@dataclass(frozen=True, eq=False)
class Imatrix(Mapping[str, np.ndarray]):
    """An importance matrix: GGUF weight name → the float32 values llama-quantize would use.

    ``path`` is the file it was read from or written to, as the user named it (recorded by export
    as ``quantize.imatrix.file``).
    """

    entries: Mapping[str, ImatrixEntry]
    datasets: tuple[str, ...] = ()
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False
    path: str | None = None
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    # -- Mapping
    def __getitem__(self, name: str) -> np.ndarray:
        return self.vector(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.entries))

    def __len__(self) -> int:
        return len(self.entries)

    def vector(self, name: str) -> np.ndarray:
        """float32 (n_experts × n_cols,) values for weight ``name``, divided as llama-quantize divides."""
        got = self._cache.get(name)
        if got is not None:
            return got
        e = self.entries[name]
        sums = np.asarray(e.sums, dtype=np.float32)
        if self.legacy:
            ncall = int(e.counts[0]) if e.counts.size else 0
            v = sums / np.float32(ncall) if ncall > 0 else sums.copy()
        else:
            counts = np.array([float(_lround(c)) for c in e.counts], dtype=np.float32)
            v = np.where(counts[:, None] > 0, sums / np.where(counts > 0, counts, 1)[:, None], np.float32(1))
        v = np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
        v.flags.writeable = False
        self._cache[name] = v
        return v

    def with_path(self, path: str | os.PathLike[str]) -> Imatrix:
        """The same matrix, recorded as coming from ``path``."""
        return Imatrix(self.entries, self.datasets, self.chunk_count, self.chunk_size, self.legacy, str(path))

    def quantize_metadata(self) -> list[tuple[str, str | int]]:
        """The ``quantize.imatrix.*`` keys llama-quantize writes into a model quantized with this matrix.

        Strings are cut to 127 bytes as llama.cpp's metadata override does; a matrix that was never
        saved has no file to record.
        """
        out: list[tuple[str, str | int]] = []
        if self.path:
            out.append((QUANTIZE_KV_FILE, _cut(self.path)))
        if self.datasets:
            out.append((QUANTIZE_KV_DATASET, _cut(self.datasets[0])))
        out.append((QUANTIZE_KV_ENTRIES, len(self.entries)))
        if self.chunk_count > 0:
            out.append((QUANTIZE_KV_CHUNKS, int(self.chunk_count)))
        return out

    @property
    def nbytes(self) -> int:
        """Memory held."""
        return sum(e.sums.nbytes + e.counts.nbytes for e in self.entries.values()) + 256


def _lround(x: float) -> int:
    # C's lround: half away from zero
    return int(np.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def _cut(s: str) -> str:
    b = s.encode("utf-8")
    return s if len(b) <= _KV_STR_BYTES else b[:_KV_STR_BYTES].decode("utf-8", errors="ignore")


# ------------------------------------------------------------------------------------------ compute


def _expert_gguf_names(site_name: str, layer: int) -> list[str]:
    # transformers ≥ 5 fuses MoE experts into 3-D parameters: experts.gate_up_proj, experts.down_proj
    tail = site_name.rsplit(".", 1)[-1]
    names = {
        "gate_up_proj": ["ffn_gate_exps", "ffn_up_exps"],
        "gate_proj": ["ffn_gate_exps"],
        "up_proj": ["ffn_up_exps"],
        "down_proj": ["ffn_down_exps"],
    }.get(tail, [])
    return [f"blk.{layer}.{n}.weight" for n in names]


def gguf_names(stats: Any, info: Any) -> dict[str, list[str]]:
    """For each site of ``stats``: the GGUF weight names its input feeds (empty when llama.cpp has none)."""
    try:
        by_hf = {t.hf_name: t.gguf_name for t in layout(info).tensors}
    except ExportError as err:
        raise CalibrationError(
            f"An imatrix names GGUF tensors, and {Path(str(info.path)).name} has no GGUF layout: {err.message}"
        ) from None
    out: dict[str, list[str]] = {}
    for s in stats.sites:
        if s.kind == "experts" and s.layer is not None:
            out[s.name] = _expert_gguf_names(s.name, s.layer)
        else:
            g = by_hf.get(s.name)
            if g is None and s.kind == "router" and s.layer is not None:
                # the module path (mlp.gate) may differ from the checkpoint's (block_sparse_moe.gate)
                g = f"blk.{s.layer}.ffn_gate_inp.weight"
            out[s.name] = [g] if g else []
    return out


def imatrix_from_stats(stats: Any, info: Any, *, process_output: bool = False) -> Imatrix:
    """The imatrix of a calibration run (``ActivationStats``) with llama-imatrix's semantics."""
    names = gguf_names(stats, info)
    entries: dict[str, ImatrixEntry] = {}
    for s in stats.sites:
        st = stats.inputs.get(s.name)
        if st is None:
            continue
        for g in names.get(s.name, ()):
            if not (_BLK.match(g) or (process_output and g == "output.weight")):
                continue
            entries[g] = ImatrixEntry(
                g,
                np.ascontiguousarray(st.sum_sq, dtype=np.float32),
                np.ascontiguousarray(st.count, dtype=np.float32),
            )
    if not entries:
        raise CalibrationError(
            f"The calibration of {Path(str(info.path)).name} saw no blk.* matrix products."
        )
    return Imatrix(
        dict(sorted(entries.items())), (stats.dataset,) if stats.dataset else (), stats.n_chunks, stats.n_ctx
    )


# ------------------------------------------------------------------------------------------ writing


def write_gguf(imatrix: Imatrix, out: str | os.PathLike[str]) -> Path:
    """Write ``imatrix`` as llama.cpp's GGUF imatrix (atomically: ``OUT.partial`` then rename)."""

    p = Path(out).expanduser()
    if imatrix.legacy:
        imatrix = to_gguf_form(imatrix)
    writer.check_output_path(
        p, need_bytes=sum(e.sums.nbytes + e.counts.nbytes for e in imatrix.entries.values())
    )
    with AtomicGGUFWriter(p, "") as w:
        # llama-imatrix writes no architecture: its file is not a model
        for kv in w.kv.kv_data:
            kv.pop("general.architecture", None)
        w.kv.add_string("general.type", "imatrix")
        w.kv.add_array(KV_DATASETS, list(imatrix.datasets))
        w.kv.add_uint32(KV_CHUNK_COUNT, int(imatrix.chunk_count))
        w.kv.add_uint32(KV_CHUNK_SIZE, int(imatrix.chunk_size))
        arrays = []
        for name in sorted(imatrix.entries, key=lambda n: n.encode("utf-8")):
            e = imatrix.entries[name]
            sums = np.ascontiguousarray(e.sums, dtype=np.float32).reshape(e.n_experts, -1)
            counts = np.ascontiguousarray(e.counts, dtype=np.float32).reshape(e.n_experts, 1)
            for suffix, a in ((_SUFFIX_SUMS, sums), (_SUFFIX_COUNTS, counts)):
                w.add_tensor_info(name + suffix, a.shape, "F32", a.nbytes)
                arrays.append((name + suffix, a))
        w.begin()
        for name, a in arrays:
            w.write_tensor(name, a)
        w.commit()
    return p


def to_gguf_form(imatrix: Imatrix) -> Imatrix:
    """A legacy matrix as GGUF data, as llama-imatrix reloads a .dat: sums = stored × chunk size, count = ncall × chunk size."""
    if not imatrix.legacy:
        return imatrix
    size = imatrix.chunk_size or 512  # llama-imatrix multiplies by its own --ctx when it merges .dat files
    entries = {}
    for name, e in imatrix.entries.items():
        ncall = float(e.counts[0]) if e.counts.size else 0.0
        entries[name] = ImatrixEntry(
            name,
            (np.asarray(e.sums, dtype=np.float32) * np.float32(size)).reshape(1, -1),
            np.array([ncall * size], dtype=np.float32),
        )
    return Imatrix(entries, imatrix.datasets, imatrix.chunk_count, size, False, imatrix.path)


def write_dat(imatrix: Imatrix, out: str | os.PathLike[str]) -> Path:
    """Write ``imatrix`` in llama-imatrix's legacy ``.dat`` format (atomically)."""

    p = Path(out).expanduser()
    writer.check_output_path(p)
    chunk = int(imatrix.chunk_size) or 1
    parts: list[bytes] = []
    stored = []
    for name in sorted(imatrix.entries, key=lambda n: n.encode("utf-8")):
        e = imatrix.entries[name]
        if imatrix.legacy:
            stored.append(
                (name, int(e.counts[0]) if e.counts.size else 0, np.asarray(e.sums, np.float32).reshape(-1))
            )
            continue
        counts = np.asarray(e.counts, dtype=np.float32)
        if counts.size == 0 or not (counts > 0).any():
            continue  # llama-imatrix skips entries without data
        ncall = (int(counts.max()) + chunk - 1) // chunk
        sums = np.asarray(e.sums, dtype=np.float32).reshape(e.n_experts, -1)
        c = np.where(counts > 0, counts, np.float32(1))[:, None]
        v = np.where(counts[:, None] > 0, sums, np.float32(1))
        stored.append((name, ncall, ((v / c) * np.float32(ncall)).astype(np.float32).reshape(-1)))
    parts.append(struct.pack("<i", len(stored)))
    for name, ncall, vals in stored:
        b = name.encode("utf-8")
        parts.append(struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, vals.size))
        parts.append(vals.astype("<f4").tobytes())
    ds = (imatrix.datasets[-1] if imatrix.datasets else "").encode("utf-8")
    parts.append(struct.pack("<i", int(imatrix.chunk_count)) + struct.pack("<i", len(ds)) + ds)
    try:
        write_atomic(p, b"".join(parts))
    except OSError as err:
        raise CalibrationError(f"Cannot write the imatrix {p}: {err.strerror or err}.") from None
    return p


def write_imatrix(imatrix: Imatrix, out: str | os.PathLike[str], fmt: str | None = None) -> Imatrix:
    """Write as ``fmt`` ("gguf" or "dat"; default from the suffix, ``.dat`` → legacy); returns it with its path."""
    fmt = (fmt or ("dat" if str(out).lower().endswith(".dat") else "gguf")).lower()
    if fmt == "gguf":
        write_gguf(imatrix, out)
    elif fmt == "dat":
        write_dat(imatrix, out)
    else:
        raise CalibrationError(f"Unknown imatrix format {fmt!r}; use gguf or dat.")
    return imatrix.with_path(out)


# ------------------------------------------------------------------------------------------ reading


def read_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    """Read an imatrix in GGUF or legacy ``.dat`` format (told apart by the GGUF magic), bounds-checked."""
    p = Path(path).expanduser()
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise CalibrationError(f"The imatrix {p} cannot be read ({err.strerror or err}).") from None
    im = _read_gguf(p) if magic == GGUF_MAGIC else _read_dat(p)
    return im.with_path(path)


def _read_gguf(p: Path) -> Imatrix:
    try:
        g = read_gguf(p)
    except CorruptFileError as err:
        raise CalibrationError(f"The imatrix {p} is not a valid GGUF file: {err}") from None
    meta = g.metadata
    if not all(k in meta for k in (KV_DATASETS, KV_CHUNK_COUNT, KV_CHUNK_SIZE)):
        what = meta.get("general.type", "model" if "general.architecture" in meta else "unknown")
        raise CalibrationError(
            f"{p.name} is a GGUF file without imatrix metadata (its general.type is {what!r}); "
            "it is not an importance matrix."
        )
    pairs: dict[str, dict[str, Any]] = {}
    for t in g.tensors:
        for suffix, key in ((_SUFFIX_SUMS, "sums"), (_SUFFIX_COUNTS, "counts")):
            if t.name.endswith(suffix):
                pairs.setdefault(t.name[: -len(suffix)], {})[key] = t
    if not pairs:
        raise CalibrationError(f"The imatrix {p.name} has no entries.")
    entries = {}
    with open(p, "rb") as f:
        for name, tp in sorted(pairs.items()):
            if "sums" not in tp or "counts" not in tp:
                raise CalibrationError(
                    f"The imatrix {p.name} has sums without counts (or counts without sums) for {name}."
                )
            ts, tc = tp["sums"], tp["counts"]
            if ts.type_name != "F32" or tc.type_name != "F32":
                raise CalibrationError(
                    f"The imatrix {p.name} stores {name} as {ts.type_name}; llama.cpp needs F32."
                )
            sums = _read_f32(f, ts.offset, ts.n_elements)
            counts = _read_f32(f, tc.offset, tc.n_elements)
            if counts.size == 0 or sums.size % counts.size:
                raise CalibrationError(
                    f"The imatrix {p.name} has {sums.size} sums for {counts.size} counts in {name}."
                )
            if not (np.isfinite(sums).all() and np.isfinite(counts).all()) or (counts < 0).any():
                raise CalibrationError(f"The imatrix {p.name} has NaN, Inf or negative values in {name}.")
            entries[name] = ImatrixEntry(name, sums.reshape(counts.size, -1), counts)
    ds = meta.get(KV_DATASETS) or ()
    im = Imatrix(
        entries,
        tuple(str(d) for d in (ds if isinstance(ds, (list, tuple)) else [ds])),
        _meta_u32(meta.get(KV_CHUNK_COUNT), KV_CHUNK_COUNT, p),
        _meta_u32(meta.get(KV_CHUNK_SIZE), KV_CHUNK_SIZE, p),
    )
    check_values(im, p.name)
    return im


def _meta_u32(value: Any, key: str, p: Path) -> int:
    return bounded_int(value or 0, f"the {key} of the imatrix {p.name}", 0, _U32, CalibrationError)


def check_values(imatrix: Imatrix, label: str) -> None:
    """Refuse an imatrix whose values llama-quantize could not quantize with: NaN, Inf, negative, or
    a mean over ``MAX_IMATRIX_VALUE`` (its quantizers would write Inf/NaN scales)."""
    for name in sorted(imatrix.entries):
        v = imatrix.vector(name)
        if v.size and not np.isfinite(v).all():
            raise CalibrationError(f"The imatrix {label} has NaN or Inf values in {name}.")
        top = float(np.abs(v).max()) if v.size else 0.0
        if top > MAX_IMATRIX_VALUE or (v.size and float(v.min()) < 0):
            what = f"a value of {top:.3g}" if top > MAX_IMATRIX_VALUE else "negative values"
            raise CalibrationError(
                f"The imatrix {label} has {what} in {name}; a quantizer weighted by it would write "
                "NaN or Inf, so it is refused.",
                hint="Recompute the importance matrix.",
            )


def _read_f32(f: Any, offset: int, n: int) -> np.ndarray:
    f.seek(offset)
    return np.frombuffer(f.read(4 * n), dtype="<f4").astype(np.float32)


class _Bytes:
    def __init__(self, data: bytes, p: Path) -> None:
        self.data, self.pos, self.p = data, 0, p

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise CalibrationError(
                f"{self.p.name} is neither a GGUF imatrix nor a complete legacy .dat imatrix ({what} is cut off)."
            )
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def i32(self, what: str) -> int:
        return int(struct.unpack("<i", self.take(4, what))[0])


def _read_dat(p: Path) -> Imatrix:
    try:
        size = p.stat().st_size
        if size > (4 << 30):
            raise CalibrationError(f"{p.name} is {size / 1e9:.1f} GB, too large for an imatrix.")
        data = p.read_bytes()
    except OSError as err:
        raise CalibrationError(f"The imatrix {p} cannot be read ({err.strerror or err}).") from None
    r = _Bytes(data, p)
    n = r.i32("the entry count")
    if n < 1 or n * 12 > len(data):
        raise CalibrationError(
            f"{p.name} is neither a GGUF imatrix nor a legacy .dat imatrix (it claims {n} entries)."
        )
    entries = {}
    for i in range(n):
        ln = r.i32(f"entry {i + 1}")
        if not 0 < ln <= _MAX_NAME:
            raise CalibrationError(
                f"{p.name}: entry {i + 1} has a name of {ln} bytes; the file is not an imatrix."
            )
        name = r.take(ln, f"the name of entry {i + 1}").decode("utf-8", errors="replace")
        ncall = r.i32(f"entry {name}")
        nval = r.i32(f"entry {name}")
        if nval < 1:
            raise CalibrationError(f"{p.name}: entry {name} has {nval} values.")
        vals = np.frombuffer(r.take(4 * nval, f"the values of {name}"), dtype="<f4").astype(np.float32)
        if not np.isfinite(vals).all():
            raise CalibrationError(f"The imatrix {p.name} has NaN or Inf values in {name}.")
        entries[name] = ImatrixEntry(name, vals.reshape(1, -1), np.array([ncall], dtype=np.float32))
    chunks, datasets = 0, ()
    if r.pos + 4 <= len(data):
        chunks = r.i32("the chunk count")
        if r.pos + 4 <= len(data):
            ln = r.i32("the dataset name")
            if 0 < ln <= len(data) - r.pos:
                datasets = (r.take(ln, "the dataset name").decode("utf-8", errors="replace"),)
    im = Imatrix(entries, datasets, max(0, chunks), 0, legacy=True)
    check_values(im, p.name)
    return im


# ------------------------------------------------------------------------------------------ checks


def check_for_model(imatrix: Imatrix, info: Any, *, label: str | None = None) -> None:
    """Refuse, in one sentence, an imatrix whose names or sizes do not fit the model ``info``."""
    label = label or (Path(imatrix.path).name if imatrix.path else "The imatrix")
    model = Path(str(info.path)).name
    try:
        tensors = {t.gguf_name: t for t in layout(info).tensors}
    except ExportError as err:
        raise CalibrationError(f"{label} cannot be checked against {model}: {err.message}") from None
    if not imatrix.entries:
        raise CalibrationError(f"{label} has no entries.")
    for name, e in sorted(imatrix.entries.items()):
        tm = tensors.get(name)
        if tm is None:
            raise CalibrationError(
                f"{label} was made for another model: it has an entry for {name}, which {model} does not have."
            )
        experts = int(tm.shape[0]) if len(tm.shape) == 3 else 1
        want = tm.n_per_row * experts
        if e.size != want:
            raise CalibrationError(
                f"{label} was made for another model: its {name} has {e.size} values, "
                f"{model}'s {name} needs {want} (one per input column{' and expert' if experts > 1 else ''})."
            )


__all__ = [
    "Imatrix",
    "ImatrixEntry",
    "QUANTIZE_KV_CHUNKS",
    "QUANTIZE_KV_DATASET",
    "QUANTIZE_KV_ENTRIES",
    "QUANTIZE_KV_FILE",
    "check_for_model",
    "check_values",
    "gguf_names",
    "imatrix_from_stats",
    "read_imatrix",
    "to_gguf_form",
    "write_dat",
    "write_gguf",
    "write_imatrix",
]
