"""Open a checkpoint lazily: headers and config only; tensor data is read when asked for.

Inputs: a Hugging Face folder (one safetensors file, or shards with ``model.safetensors.index.json``),
a Hub cache repo or snapshot folder, a single ``.safetensors`` file, a pickle ``pytorch_model.bin``
(only when the caller opts in: unpickled with ``torch.load(weights_only=True)`` in a memory-limited child
process and converted to a cached safetensors file, see ``pickle_loader``), or a ``.gguf`` file
(read-only, through the bounded reader in ``studio.core.gguf.read``).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

from studio.core import safejson
from studio.core.errors import (
    CorruptFileError,
    ModelOpenError,
    RemoteCodeError,
    StudioError,
    UnsafeFileError,
)
from studio.core.gguf.read import read_gguf
from studio.core.jobs import JobContext
from studio.core.model import adapters
from studio.core.model.config_bounds import check_config_numbers, check_gguf_numbers
from studio.core.model.gguf_source import dequantize_tensor
from studio.core.model.pickle_loader import PickleOptions, convert_pickles, skipped_tensors
from studio.core.model.st_header import StEntry, read_header
from studio.core.modelinfo import CheckpointFormat, ModelInfo, Role, TensorInfo

MAX_CONFIG_BYTES = 16_000_000
MAX_INDEX_BYTES = 100_000_000
PICKLE_NAMES = ("pytorch_model.bin",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")

# safetensors dtypes numpy holds natively (read as they are stored).
_NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F64": np.dtype("<f8"),
}
# safetensors' dtypes by torch's names: read_torch reads them into a buffer of its own.
_TORCH_DTYPES: dict[str, str] = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
    "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64", "U64": "uint64",
    "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}  # fmt: skip
# Stored bit patterns for dtypes numpy lacks.
_RAW_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
}


# ----------------------------------------------------------------------------------------- dtypes


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Convert bfloat16 bit patterns (uint16) to float32: bf16 is the top half of an f32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f8_e4m3_table() -> np.ndarray:
    v = np.arange(256, dtype=np.int32)
    sign = np.where(v & 0x80, -1.0, 1.0)
    exp = (v >> 3) & 0xF
    man = v & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    val = sign * val
    val[(v & 0x7F) == 0x7F] = np.nan  # E4M3FN has no infinities, one NaN pattern per sign
    return val.astype(np.float32)


def _f8_to_f32(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F8_E5M2":  # the top byte of an IEEE half
        return (bits.astype(np.uint16) << 8).view(np.float16).astype(np.float32)
    if dtype == "F8_E4M3":
        return _f8_e4m3_table()[bits]
    # F8_E8M0: a bare exponent, 0xFF is NaN
    out = np.ldexp(np.float32(1.0), bits.astype(np.int32) - 127).astype(np.float32)
    out[bits == 0xFF] = np.nan
    return out


# ------------------------------------------------------------------------------------ checkpoint


class Checkpoint:
    """An opened checkpoint: ``info`` is known from headers; tensors are read on demand.

    Use as a context manager or call ``close()``; reads are safe from several threads.
    """

    def __init__(self, info: ModelInfo) -> None:
        self.info = info
        self._by_name = {t.name: t for t in info.tensors}
        self._lock = threading.Lock()
        self._closed = False

    # -- public API
    @property
    def tensor_names(self) -> tuple[str, ...]:
        """Every tensor name, in inventory order."""
        return tuple(t.name for t in self.info.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.info.tensors)

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a new float32 numpy array in its stored shape."""
        return self._read_f32(self._get(name))

    def read_raw(self, name: str) -> np.ndarray:
        """The stored data of ``name`` without conversion (bf16/f8 as unsigned ints, GGUF blocks as bytes)."""
        return self._read_raw(self._get(name))

    def read_torch(self, name: str) -> Any:
        """The tensor ``name`` as a CPU ``torch.Tensor`` in its stored dtype (imports torch)."""
        return self._read_torch(self._get(name))

    def map_raw(self, name: str) -> np.ndarray:
        """Like ``read_raw`` but a writable private copy, read rather than mapped (writes stay in this
        process, never in the file; a file that shrinks while it is read is a ``CorruptFileError``,
        never SIGBUS)."""
        return self._map_raw(self._get(name))

    def close(self) -> None:
        """Release file handles and memory maps; later reads raise."""
        self._closed = True

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for subclasses
    def _get(self, name: str) -> TensorInfo:
        if self._closed:
            raise ModelOpenError(f"{self.info.path.name} is closed; open it again to read {name!r}.")
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.info.path.name} has no tensor named {name!r}") from None

    def _read_f32(self, t: TensorInfo) -> np.ndarray:
        raise NotImplementedError

    def _read_raw(self, t: TensorInfo) -> np.ndarray:
        raise NotImplementedError

    def _read_torch(self, t: TensorInfo) -> Any:
        raise NotImplementedError

    def _map_raw(self, t: TensorInfo) -> np.ndarray:
        return np.array(self._read_raw(t))


def _memmap(file: Path, offset: int, nbytes: int, private: bool = False) -> np.ndarray:
    """A view of ``nbytes`` bytes at ``offset``, memory-mapped with its own lifetime: read-only, or
    ``private`` (copy-on-write: writable, and writes never reach the file)."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    try:
        return np.memmap(file, dtype=np.uint8, mode="c" if private else "r", offset=offset, shape=(nbytes,))
    except (OSError, ValueError) as err:
        raise CorruptFileError(f"Cannot map {file.name} for reading: {err}.") from err


def _read_copy(file: Path, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes at ``offset`` read into a new array (not mapped): a file that shrinks meanwhile
    gives a short read and one sentence, where a memory map would end the process with SIGBUS."""
    buf = np.empty(nbytes, dtype=np.uint8)
    got = 0
    try:
        with open(file, "rb", buffering=0) as f:
            f.seek(offset)
            view = memoryview(buf)
            while got < nbytes:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
    except OSError as err:
        raise CorruptFileError(f"Cannot read {file.name}: {err.strerror or err}.") from None
    if got < nbytes:
        raise CorruptFileError(
            f"{file.name} ended {nbytes - got:,} bytes early while it was being read (was it truncated or "
            "replaced meanwhile?).",
            hint="Re-download it or verify its checksum, then run again.",
        )
    return buf


class SafetensorsCheckpoint(Checkpoint):
    """Safetensors shards read through ``safe_open`` memory maps (one handle per shard)."""

    def __init__(self, info: ModelInfo, entries: dict[str, StEntry]) -> None:
        super().__init__(info)
        self._entries = entries
        self._handles: dict[tuple[Path, str], Any] = {}

    def _handle(self, file: Path, framework: str) -> Any:
        with self._lock:
            h = self._handles.get((file, framework))
            if h is None:
                try:
                    h = safetensors.safe_open(str(file), framework=framework)
                except Exception as err:  # SafetensorError is not importable by name everywhere
                    raise CorruptFileError(
                        f"{file.name} cannot be opened by safetensors: {err}.",
                        hint="Re-download it or verify its checksum.",
                    ) from err
                self._handles[(file, framework)] = h
            return h

    def _read_raw(self, t: TensorInfo, private: bool = False) -> np.ndarray:
        e = self._entries[t.name]
        # private (map_raw: what calibration computes from): a copy, so a file truncated during the
        # long run is a sentence, not SIGBUS; writes to it never reach the file either way.
        raw = _read_copy(t.file, e.begin, e.nbytes) if private else _memmap(t.file, e.begin, e.nbytes)
        dt = _NUMPY_DTYPES.get(t.dtype) or _RAW_DTYPES.get(t.dtype)
        if dt is None:  # sub-byte types: return the packed bytes
            return raw
        return raw.view(dt).reshape(t.shape)

    def _read_f32(self, t: TensorInfo) -> np.ndarray:
        if t.dtype in _NUMPY_DTYPES:
            # read into a buffer of its own, not through safetensors' handle: that handle maps the whole
            # file once, so every tensor read so far stayed in the process's resident memory (a rotated
            # export of the 1.5B's 7.1 GB float32 folder, read whole, peaked at 14.56 GB RSS)
            return self._read_raw(t, private=True).astype(np.float32, copy=False)
        if t.dtype == "BF16":
            return bf16_to_f32(self._read_raw(t))
        if t.dtype.startswith("F8_"):
            return _f8_to_f32(self._read_raw(t), t.dtype)
        raise ModelOpenError(
            f"Tensor {t.name!r} in {t.file.name} uses dtype {t.dtype}, which Quant Studio cannot read yet."
        )

    def _read_torch(self, t: TensorInfo) -> Any:
        import torch

        dt = getattr(torch, _TORCH_DTYPES.get(t.dtype, ""), None)
        if dt is None:  # a dtype this torch lacks a name for: safetensors knows what to do or says why
            return self._handle(t.file, "pt").get_tensor(t.name)
        # its own buffer, as _read_f32: the handle's one map of the whole file kept every tensor read
        # through it resident (an FP8 checkpoint's layers, read by the calibration runner this way)
        e = self._entries[t.name]
        if e.nbytes == 0:
            return torch.empty(t.shape, dtype=dt)
        return torch.from_numpy(_read_copy(t.file, e.begin, e.nbytes)).view(dt).reshape(t.shape)

    def _map_raw(self, t: TensorInfo) -> np.ndarray:
        return self._read_raw(t, private=True)

    def close(self) -> None:
        """Drop the safe_open handles (their memory maps close when the last tensor view is freed)."""
        with self._lock:
            self._handles.clear()
        super().close()


class PickleCheckpoint(Checkpoint):
    """A pickle ``pytorch_model.bin`` read through its safetensors conversion (made in a child process).

    ``info`` describes the pickle files (``TensorInfo.file`` is the ``.bin`` shard); the data comes
    from the converted safetensors files in the cache, memory-mapped like any safetensors checkpoint.
    """

    def __init__(self, info: ModelInfo, entries: dict[str, StEntry], stores: dict[str, Path]) -> None:
        super().__init__(info)
        self.stores = dict(stores)  # tensor name -> converted safetensors file holding it
        store_tensors = tuple(dataclasses.replace(t, file=stores[t.name]) for t in info.tensors)
        self._store = SafetensorsCheckpoint(dataclasses.replace(info, tensors=store_tensors), entries)

    def _in_store(self, t: TensorInfo) -> TensorInfo:
        return self._store._get(t.name)

    def _read_raw(self, t: TensorInfo) -> np.ndarray:
        return self._store._read_raw(self._in_store(t))

    def _read_f32(self, t: TensorInfo) -> np.ndarray:
        return self._store._read_f32(self._in_store(t))

    def _read_torch(self, t: TensorInfo) -> Any:
        return self._store._read_torch(self._in_store(t))

    def _map_raw(self, t: TensorInfo) -> np.ndarray:
        return self._store._map_raw(self._in_store(t))

    def close(self) -> None:
        """Drop the converted files' handles."""
        self._store.close()
        super().close()


class GGUFCheckpoint(Checkpoint):
    """A GGUF file opened read-only; quantized tensors are dequantized by gguf-py on read."""

    def __init__(self, info: ModelInfo, gguf_file: Any) -> None:
        super().__init__(info)
        self.gguf = gguf_file  # the GGUFFile from studio.core.gguf.read: metadata, versions, offsets
        self._t = {t.name: t for t in gguf_file.tensors}

    def _read_raw(self, t: TensorInfo) -> np.ndarray:
        g = self._t[t.name]
        raw = _memmap(t.file, g.offset, g.nbytes)
        if g.type_name == "F32":
            return raw.view("<f4").reshape(t.shape)
        if g.type_name == "F16":
            return raw.view("<f2").reshape(t.shape)
        if g.type_name == "BF16":
            return raw.view("<u2").reshape(t.shape)
        rows = g.n_elements // g.ne[0] if g.ne and g.ne[0] else 0
        return raw.reshape(rows, -1) if rows else raw

    def _read_f32(self, t: TensorInfo) -> np.ndarray:
        g = self._t[t.name]
        return dequantize_tensor(self._read_raw(t), g.type_name, t.shape, tensor=t.name, file=t.file.name)

    def _read_torch(self, t: TensorInfo) -> Any:
        import torch

        g = self._t[t.name]
        if g.type_name == "BF16":
            return torch.from_numpy(np.array(self._read_raw(t))).view(torch.bfloat16)
        if g.type_name == "F16":
            return torch.from_numpy(np.array(self._read_raw(t)))
        return torch.from_numpy(self._read_f32(t))


# ------------------------------------------------------------------------------------ open_model


def _unique_keys(path: Path):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise CorruptFileError(
                    f"{path} names {k!r} twice, so it is ambiguous.", hint="Re-download it or fix the file."
                )
            out[k] = v
        return out

    return hook


def _read_json(path: Path, limit: int, what: str) -> Any:
    try:
        size = path.stat().st_size
        if size > limit:
            raise CorruptFileError(f"{path.name} is {size} bytes, too large for {what} (limit {limit}).")
        text = path.read_bytes().decode("utf-8")
        return safejson.loads(text, str(path), ValueError, object_pairs_hook=_unique_keys(path))
    except StudioError:
        raise
    except OSError as err:
        raise ModelOpenError(f"Cannot read {path}: {err.strerror or err}.") from err
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CorruptFileError(
            f"{path.name} in {path.parent} is not valid JSON ({err}).",
            hint="Re-download it or fix the file.",
        ) from err


def _hub_repo_of(folder: Path) -> str | None:
    """``org/name`` when ``folder`` is a Hub cache snapshot (``models--org--name/snapshots/<hash>``)."""
    parts = folder.resolve().parts if folder.exists() else folder.parts
    for i in range(len(parts) - 1, 0, -1):
        if parts[i].startswith("models--") and i + 1 < len(parts) and parts[i + 1] == "snapshots":
            return parts[i][len("models--") :].replace("--", "/")
    return None


def _resolve_cache_repo(folder: Path) -> tuple[Path, list[str]]:
    """A Hub cache repo folder (``models--org--name``) resolves to its ``main`` (or only) snapshot."""
    snaps = folder / "snapshots"
    if not (folder.name.startswith("models--") and snaps.is_dir()):
        return folder, []
    ref = folder / "refs" / "main"
    if ref.is_file() and ref.stat().st_size < 256:
        commit = ref.read_text(encoding="utf-8", errors="replace").strip()
        if re.fullmatch(r"[0-9a-f]{40}", commit) and (snaps / commit).is_dir():
            return snaps / commit, []
    candidates = sorted((p for p in snaps.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise ModelOpenError(f"The Hub cache folder {folder} has no downloaded snapshot.")
    warn = []
    if len(candidates) > 1:
        warn.append(
            f"{folder.name} has {len(candidates)} snapshots; opened the newest, {candidates[-1].name}."
        )
    return candidates[-1], warn


def _needs_remote_code(config: dict[str, Any]) -> bool:
    """Whether the config's model class only exists as custom code in its repository."""
    auto_map = config.get("auto_map")
    if not auto_map:
        return False
    if config.get("model_type") not in adapters.KNOWN_MODEL_TYPES:
        return True
    # A known model_type whose architecture class is provided by the repo's code still needs it.
    archs = set(config.get("architectures") or ())
    targets = auto_map.values() if isinstance(auto_map, dict) else ()
    for target in targets:
        for ref in target if isinstance(target, list) else [target]:
            if isinstance(ref, str) and ref.rsplit(".", 1)[-1] in archs:
                return True
    return False


def resolve_model_path(spec: str | Path) -> Path:
    """A local path for ``spec``: an existing path, or a Hub id (``org/name``) already in the local cache."""
    p = Path(spec).expanduser()
    if p.exists():
        return p
    s = str(spec)
    if re.fullmatch(r"[\w.\-]+/[\w.\-]+", s) and not s.startswith((".", "/")):
        try:
            from huggingface_hub.constants import HF_HUB_CACHE

            cache = Path(HF_HUB_CACHE)
        except ImportError:  # pragma: no cover - huggingface_hub is a dependency
            cache = Path.home() / ".cache" / "huggingface" / "hub"
        repo = cache / ("models--" + s.replace("/", "--"))
        if repo.is_dir():
            return repo
        raise ModelOpenError(
            f"{s} is not a local folder and is not in the Hugging Face cache; download it first "
            f"(quant-studio-cli hub download {s})."
        )
    raise ModelOpenError(f"{p} does not exist.")


def hub_repo_id(path: str | Path) -> str | None:
    """``org/name`` when ``path`` lies in a Hugging Face cache repo (``models--org--name/...``), else None."""
    for part in reversed(Path(path).expanduser().resolve().parts):
        m = re.fullmatch(r"models--([\w.\-]+?)--([\w.\-]+)", part)
        if m:
            return f"{m.group(1)}/{m.group(2)}"
    return None


def open_model(
    path: str | Path,
    ctx: JobContext | None = None,
    *,
    allow_pickle: bool = False,
    pickle_options: PickleOptions | None = None,
) -> Checkpoint:
    """Open a checkpoint reading only headers and config.json; see the module docstring for inputs."""
    ctx = ctx or JobContext()
    p = resolve_model_path(path)
    if p.is_file():
        suffix = p.suffix.lower()
        if suffix == ".gguf":
            return _open_gguf(p, ctx)
        if suffix == ".safetensors":
            config, warnings = _load_config(p.parent)
            return _open_safetensors(p.parent, [p], None, config, warnings, ctx, info_path=p)
        if suffix in PICKLE_SUFFIXES:
            config, warnings = _load_config(p.parent)
            return _open_pickle(
                p.parent, [p], config, warnings, ctx, allow_pickle, info_path=p, options=pickle_options
            )
        if suffix == ".json" and p.name == "config.json":
            return open_model(p.parent, ctx, allow_pickle=allow_pickle, pickle_options=pickle_options)
        raise ModelOpenError(
            f"{p.name} is not a model file Quant Studio can open; choose a model folder, "
            "a .safetensors file or a .gguf file."
        )
    if not p.is_dir():
        raise ModelOpenError(f"{p} is neither a file nor a folder.")

    folder, warnings = _resolve_cache_repo(p)
    config, more = _load_config(folder)
    warnings += more
    if config is not None and not any((folder / n).exists() for n in TOKENIZER_FILES):
        warnings.append(f"{folder.name} has no tokenizer files; exporting or chatting will need one.")
    files = sorted(f for f in folder.iterdir() if f.is_file())
    names = {f.name for f in files}
    # Dangling symlinks in a Hub snapshot are files whose blob never finished downloading.
    dangling = sorted(f.name for f in folder.iterdir() if f.is_symlink() and not f.exists())

    if "model.safetensors.index.json" in names:
        return _open_index(folder, config, warnings, ctx)
    st = [f for f in files if f.suffix == ".safetensors"]
    model_st = [f for f in st if f.name.startswith("model")] or st
    if model_st:
        return _open_safetensors(folder, model_st, None, config, warnings, ctx)
    if "pytorch_model.bin.index.json" in names:
        index = _read_json(folder / "pytorch_model.bin.index.json", MAX_INDEX_BYTES, "a shard index")
        shards = _index_shards(folder, index, "pytorch_model.bin.index.json")
        return _open_pickle(
            folder, [folder / s for s in shards], config, warnings, ctx, allow_pickle, options=pickle_options
        )
    pickles = [f for f in files if f.name in PICKLE_NAMES] or [
        f for f in files if f.suffix in PICKLE_SUFFIXES and f.name.startswith("pytorch_model")
    ]
    if pickles:
        return _open_pickle(folder, pickles, config, warnings, ctx, allow_pickle, options=pickle_options)
    ggufs = [f for f in files if f.suffix.lower() == ".gguf"]
    if len(ggufs) == 1:
        return _open_gguf(ggufs[0], ctx)
    if len(ggufs) > 1:
        listed = ", ".join(f.name for f in ggufs[:5])
        raise ModelOpenError(f"{folder} holds several GGUF files ({listed}); open one of them directly.")
    if dangling:
        raise CorruptFileError(
            f"{folder} is an incomplete download: {dangling[0]} points to a missing file.",
            hint="Download the model again.",
        )
    if config is not None:
        raise ModelOpenError(
            f"{folder} has config.json but no weights (no .safetensors, pytorch_model.bin or .gguf file)."
        )
    if not files:
        raise ModelOpenError(f"{folder} is empty; choose a folder with a model in Hugging Face layout.")
    raise ModelOpenError(
        f"{folder} contains no model: no config.json and no .safetensors, pytorch_model.bin or .gguf file."
    )


def _load_config(folder: Path) -> tuple[dict[str, Any] | None, list[str]]:
    path = folder / "config.json"
    if not path.exists():
        return None, [
            f"{folder.name} has no config.json; architecture and layer count are guessed from names."
        ]
    config = _read_json(path, MAX_CONFIG_BYTES, "a model config")
    if not isinstance(config, dict):
        raise CorruptFileError(
            f"config.json in {folder} is not a JSON object.", hint="Fix or re-download it."
        )
    warnings: list[str] = []
    if config.get("auto_map"):
        if _needs_remote_code(config):
            repo = _hub_repo_of(folder)
            where = f"https://huggingface.co/{repo}" if repo else str(folder)
            raise RemoteCodeError(
                f"This model needs custom Python code from its repository, which Quant Studio does not run; "
                f"inspect it at {where}."
            )
        warnings.append(
            "config.json names custom code (auto_map); it is ignored and the built-in "
            f"{config.get('model_type')} architecture is used."
        )
    return config, warnings


def _index_shards(folder: Path, index: Any, index_name: str) -> dict[str, list[str]]:
    """shard file -> tensor names from a shard index, validated (shards exist, inside the folder)."""
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise CorruptFileError(f"{index_name} in {folder} has no weight_map.", hint="Re-download it.")
    shards: dict[str, list[str]] = {}
    for tensor, shard in index["weight_map"].items():
        if not isinstance(shard, str) or not shard:
            raise CorruptFileError(f"{index_name} gives tensor {tensor!r} an invalid shard {shard!r}.")
        shards.setdefault(shard, []).append(tensor)
    for shard in shards:
        # Lexical check: Hub snapshots are symlinks into ../../blobs, so resolving would mislead.
        if Path(shard).is_absolute() or ".." in Path(shard).parts or "\\" in shard or ":" in shard:
            raise CorruptFileError(f"{index_name} names shard {shard!r}, which lies outside {folder}.")
        if not (folder / shard).is_file():
            raise ModelOpenError(
                f"Shard {shard} listed in {index_name} is missing from {folder}.",
                hint="Download the missing file or the whole model again.",
            )
    return shards


def _open_index(
    folder: Path, config: dict[str, Any] | None, warnings: list[str], ctx: JobContext
) -> Checkpoint:
    name = "model.safetensors.index.json"
    index = _read_json(folder / name, MAX_INDEX_BYTES, "a shard index")
    shards = _index_shards(folder, index, name)
    return _open_safetensors(folder, [folder / s for s in shards], shards, config, warnings, ctx)


def _open_safetensors(
    folder: Path,
    files: list[Path],
    index: dict[str, list[str]] | None,
    config: dict[str, Any] | None,
    warnings: list[str],
    ctx: JobContext,
    info_path: Path | None = None,
) -> Checkpoint:
    config = config or {}
    model_type, arch = _arch(config)
    adapter = adapters.adapter_for(model_type, arch)
    entries: dict[str, StEntry] = {}
    owner: dict[str, Path] = {}
    tensors: list[TensorInfo] = []
    for i, file in enumerate(files):
        ctx.check_cancelled()
        ctx.report(i, len(files), f"reading header of {file.name}")
        header = read_header(file)
        for e in sorted(header.entries, key=lambda e: e.begin):
            if e.name in owner:
                raise CorruptFileError(
                    f"Tensor {e.name!r} is stored in two shards, {owner[e.name].name} and {file.name}.",
                    hint="Re-download the model.",
                )
            owner[e.name] = file
            entries[e.name] = e
            tensors.append(_tensor_info(e.name, e.shape, e.dtype, e.nbytes, file, adapter))
    ctx.report(len(files), len(files), "headers read")
    if index is not None:
        by_shard = {shard: next(f for f in files if f == folder / shard) for shard in index}
        for shard, names in index.items():
            path = by_shard[shard]  # the very object stored in `owner`, so `is` suffices
            for n in names:
                got = owner.get(n)
                if got is not path:
                    where = got.name if got else "no shard"
                    raise CorruptFileError(
                        f"model.safetensors.index.json puts tensor {n!r} in {shard}, but it is in {where}.",
                        hint="Re-download the model.",
                    )
        listed = {n for names in index.values() for n in names}
        extra = [n for n in owner if n not in listed]
        if extra:
            warnings.append(
                f"{len(extra)} tensors (e.g. {extra[0]!r}) are in the shards but not in the index."
            )
    info = _model_info(info_path or folder, CheckpointFormat.SAFETENSORS, config, tensors, adapter, warnings)
    return SafetensorsCheckpoint(info, entries)


def _arch(config: dict[str, Any]) -> tuple[str, str]:
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "unknown"
    model_type = config.get("model_type")
    return (model_type if isinstance(model_type, str) else "unknown"), arch


def _tensor_info(
    name: str, shape: tuple[int, ...], dtype: str, nbytes: int, file: Path, adapter: adapters.Adapter
) -> TensorInfo:
    return TensorInfo(
        name=name,
        shape=shape,
        dtype=dtype,
        nbytes=nbytes,
        file=file,
        role=adapter.role(name),
        layer=adapters.parse_layer(name),
        transposed=len(shape) == 2 and adapter.is_transposed(name),
    )


def _n_layers(config: dict[str, Any], tensors: list[TensorInfo]) -> int:
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    layers = [t.layer for t in tensors if t.layer is not None]
    return max(layers) + 1 if layers else 0


def _model_info(
    path: Path,
    fmt: CheckpointFormat,
    config: dict[str, Any],
    tensors: list[TensorInfo],
    adapter: adapters.Adapter,
    warnings: list[str],
) -> ModelInfo:
    model_type, arch = _arch(config)
    if not adapter.known and config:
        warnings.append(
            f"Architecture {arch} (model_type {model_type}) is not one Quant Studio knows; "
            "most tensor roles are marked unknown."
        )
    if not tensors:
        warnings.append(f"{path.name} contains no tensors.")
    check_config_numbers(config, tensors, path.name)
    return ModelInfo(
        path=path,
        format=fmt,
        architecture=arch,
        model_type=model_type,
        config=config,
        tensors=tuple(tensors),
        n_layers=_n_layers(config, tensors),
        warnings=tuple(warnings),
    )


def _open_pickle(
    folder: Path,
    files: list[Path],
    config: dict[str, Any] | None,
    warnings: list[str],
    ctx: JobContext,
    allow_pickle: bool,
    info_path: Path | None = None,
    options: PickleOptions | None = None,
) -> Checkpoint:
    if not allow_pickle:
        raise UnsafeFileError(
            f"{files[0].name} is a pickle checkpoint, which can run code when loaded, so it is not opened "
            "by default; prefer a safetensors version of this model, or opt in with --allow-pickle "
            "(allow_pickle=True), which loads it with torch.load(weights_only=True).",
        )
    for f in files:
        if not f.is_file():
            raise ModelOpenError(f"Shard {f.name} is missing from {folder}.")
    options = options or PickleOptions()
    config = config or {}
    model_type, arch = _arch(config)
    adapter = adapters.adapter_for(model_type, arch)
    ctx.check_cancelled()
    # Unpickling happens only in a memory-limited child; here we read the safetensors it wrote.
    converted = convert_pickles(files, cache_dir=options.cache_dir, memory_cap=options.memory_cap, ctx=ctx)
    tensors: list[TensorInfo] = []
    entries: dict[str, StEntry] = {}
    stores: dict[str, Path] = {}
    skipped: list[str] = []
    for file, store in zip(files, converted, strict=True):
        header = read_header(store)
        skipped += skipped_tensors(header.metadata)
        for e in header.entries:  # header order is the state dict's order
            if e.name in stores:
                raise CorruptFileError(
                    f"Tensor {e.name!r} is stored in two shards, the second is {file.name}."
                )
            stores[e.name] = store
            entries[e.name] = e
            tensors.append(_tensor_info(e.name, e.shape, e.dtype, e.nbytes, file, adapter))
    ctx.report(len(files), len(files), "loaded")
    warnings = [
        f"{files[0].name} is a pickle checkpoint, opened with torch.load(weights_only=True) in a separate "
        "process; prefer safetensors when the model offers it.",
        *warnings,
    ]
    if skipped:
        warnings.append(
            f"{len(skipped)} tensors (e.g. {skipped[0]!r}) have types Quant Studio cannot store and were left out."
        )
    info = _model_info(info_path or folder, CheckpointFormat.PYTORCH, config, tensors, adapter, warnings)
    return PickleCheckpoint(info, entries, stores)


def gguf_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """A config.json-like dict from GGUF metadata (keys the estimators use), plus the scalar metadata."""
    arch = metadata.get("general.architecture")
    arch = arch if isinstance(arch, str) else "unknown"

    def get(key: str) -> Any:
        v = metadata.get(f"{arch}.{key}")
        return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None

    cfg: dict[str, Any] = {"model_type": arch, "architectures": [arch]}
    mapping = {
        "num_hidden_layers": "block_count",
        "hidden_size": "embedding_length",
        "intermediate_size": "feed_forward_length",
        "num_attention_heads": "attention.head_count",
        "num_key_value_heads": "attention.head_count_kv",
        "head_dim": "attention.key_length",
        "max_position_embeddings": "context_length",
        "vocab_size": "vocab_size",
    }
    for hf, key in mapping.items():
        v = get(key)
        if v is not None:
            cfg[hf] = v
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in cfg and isinstance(tokens, list):
        cfg["vocab_size"] = len(tokens)
    cfg["gguf_metadata"] = {
        k: v for k, v in metadata.items() if isinstance(v, (str, int, float, bool)) and len(str(v)) < 4096
    }
    return cfg


def _open_gguf(file: Path, ctx: JobContext) -> Checkpoint:
    ctx.report(0, 1, f"reading header of {file.name}")
    g = read_gguf(file)
    ctx.report(1, 1, "header read")
    adapter = adapters.gguf_adapter()
    tensors = [
        TensorInfo(
            name=t.name,
            shape=t.shape,
            dtype=t.type_name,
            nbytes=t.nbytes,
            file=file,
            role=adapter.role(t.name),
            layer=adapters.parse_layer(t.name),
        )
        for t in g.tensors
    ]
    config = gguf_config(g.metadata)
    check_config_numbers(config, tensors, file.name, "The metadata")
    check_gguf_numbers(g.metadata, g.tensors, file.name)
    info = ModelInfo(
        path=file,
        format=CheckpointFormat.GGUF,
        architecture=config["architectures"][0],
        model_type=config["model_type"],
        config=config,
        tensors=tuple(tensors),
        n_layers=_n_layers(config, tensors),
        warnings=g.warnings,
    )
    return GGUFCheckpoint(info, g)


__all__ = [
    "Checkpoint",
    "GGUFCheckpoint",
    "PickleCheckpoint",
    "PickleOptions",
    "SafetensorsCheckpoint",
    "Role",
    "bf16_to_f32",
    "gguf_config",
    "open_model",
    "resolve_model_path",
]
