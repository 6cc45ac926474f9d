"""A GGUF file as the original model: its tensors as float32, what it is stored as, and the Hugging
Face folder the studio writes from it.

Decoding: the K-quants and IQ4 types go through our own numba decoders (``quant.blocks``: 2 to 8
times faster than gguf-py's numpy code on the same rows, and bit-identical to it, see the tests), as do
Q1_0 and Q2_0, which gguf-py 0.19 cannot decode; every other type gguf-py knows (legacy 32-blocks,
the IQ1/IQ2/IQ3 and ternary types, MXFP4) through ``gguf.quants.dequantize``, the reference
llama.cpp's own Python tools use; plain integer and float64 tensors are numpy views. A type neither
decodes is refused with the tensor's name before any work.

The Hugging Face folder (``write_hf_folder``) holds the tensors dequantized to float32 safetensors
under their transformers names (llama.cpp's Q/K row permutation, Conv1D transpose and Gemma's norm
offset undone, the inverse of ``gguf.arch.layout``), and the config, tokenizer and chat template
that transformers builds from the file's metadata (its public ``gguf_file=`` loaders). It is written
in a temporary folder beside the target and renamed into place, with a marker file written last.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from filelock import FileLock, Timeout

from studio.core.errors import ModelOpenError, StudioError
from studio.core.gguf.arch import Transform, head_counts
from studio.core.gguf.layout import layout
from studio.core.gguf.read import read_gguf
from studio.core.jobs import JobContext, null_context
from studio.core.model.config_bounds import check_gguf_numbers
from studio.core.model.hf_progress import no_hf_progress_bars
from studio.core.modelinfo import CheckpointFormat, ModelInfo, TensorInfo
from studio.core.paths import SOURCE_MARKER, user_cache_dir
from studio.core.units import format_bytes

HF_FORMAT_VERSION = 1
"""Bump when the folder written from a GGUF changes, so cached folders are rebuilt."""

# SOURCE_MARKER (studio.core.paths) is written last into every folder made from a GGUF: where it came
# from (its presence means "whole").

FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
# Our numba decoders: measurably faster than gguf-py's numpy ones for these (bench in the tests' note),
# and the only ones for Q1_0 and Q2_0, which gguf-py 0.19 cannot decode (Q2_0 it cannot even name).
_OWN_DECODERS = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q1_0", "Q2_0"})
_PLAIN = {"I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "F64": "<f8"}
# Tensors llama.cpp needs that a transformers model computes from its config instead.
_DERIVED_TENSORS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})
_ST_CHUNK = 16 << 20


class UnsupportedTensorTypeError(ModelOpenError):
    """A GGUF tensor is stored in a type that no decoder here can turn into floats."""


# ------------------------------------------------------------------------------------------ decoding


def can_decode(type_name: str) -> bool:
    """Whether tensors of GGML type ``type_name`` can be read as float32 here."""
    if type_name in _OWN_DECODERS or type_name in _PLAIN or type_name in ("F32", "F16", "BF16"):
        return True

    qt = getattr(gguf.GGMLQuantizationType, type_name, None)
    if qt is None:
        return False
    try:
        gguf.quants.dequantize(np.zeros((1, 0), dtype=np.uint8), qt)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - an empty probe may trip shape checks; the decoder exists
        return True
    return True


def _unsupported(tensor: str, type_name: str, file: str) -> UnsupportedTensorTypeError:
    where = f" of {file}" if file else ""
    return UnsupportedTensorTypeError(
        f"Tensor {tensor!r}{where} is stored as {type_name}, which Quant Studio cannot decode.",
        hint="Use a GGUF made with F32, F16, BF16, legacy, K-quant or IQ types.",
    )


def dequantize_tensor(
    raw: np.ndarray, type_name: str, shape: tuple[int, ...], *, tensor: str = "", file: str = ""
) -> np.ndarray:
    """The stored bytes (or float view) of one GGUF tensor as a new float32 array of numpy ``shape``."""
    shape = tuple(int(s) for s in shape)
    a = np.asarray(raw)
    plain = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", **_PLAIN}.get(type_name)
    if plain is not None:
        if a.dtype == np.uint8:  # raw bytes: view them as the stored element type
            a = np.ascontiguousarray(a).reshape(-1).view(plain)
        if type_name == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        return a.astype(np.float32).reshape(shape)  # astype copies, even for F32
    if type_name in _OWN_DECODERS:
        from studio.core.quant.blocks import dequantize

        return dequantize(np.asarray(raw), type_name, shape)

    qt = getattr(gguf.GGMLQuantizationType, type_name, None)
    if qt is None:
        raise _unsupported(tensor, type_name, file)
    try:
        out = gguf.quants.dequantize(np.asarray(raw), qt)
    except NotImplementedError:
        raise _unsupported(tensor, type_name, file) from None
    return np.asarray(out, dtype=np.float32).reshape(shape)


def check_decodable(tensors: Iterable[Any], file: str | os.PathLike[str] = "") -> None:
    """Raise UnsupportedTensorTypeError for the first tensor (``GGUFTensor``/``TensorInfo``) no decoder reads."""
    ok: dict[str, bool] = {}
    for t in tensors:
        type_name = getattr(t, "type_name", None) or t.dtype
        if type_name not in ok:
            ok[type_name] = can_decode(type_name)
        if not ok[type_name]:
            raise _unsupported(t.name, type_name, Path(file).name if file else "")


# ------------------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class SourceSummary:
    """What a GGUF original is stored as: tensors and weights per type, bits per weight."""

    path: Path
    tensors_by_type: Mapping[str, int]
    weights_by_type: Mapping[str, int]
    bpw: float
    main_type: str  # the type holding most weights of the matrices
    quantized: bool  # some matrices are stored at 8 bits or fewer per weight

    def describe(self) -> str:
        """One line: "Q4_1 (210 tensors), F32 (61 tensors), Q8_0 (1 tensor); 5.74 bits per weight"."""
        order = sorted(self.tensors_by_type, key=lambda k: -self.weights_by_type.get(k, 0))
        parts = [f"{k} ({n} tensor{'s' if n != 1 else ''})" for k in order for n in [self.tensors_by_type[k]]]
        return ", ".join(parts) + f"; {self.bpw:.2f} bits per weight"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``inspect --json`` prints as ``stored_as``)."""
        return {
            "types": dict(self.tensors_by_type),
            "weights": dict(self.weights_by_type),
            "bpw": round(self.bpw, 4),
            "main_type": self.main_type,
            "quantized": self.quantized,
            "warning": self.warning,
        }

    @property
    def warning(self) -> str | None:
        """The requantization warning, or None for an F32/F16/BF16 source."""
        if not self.quantized:
            return None
        return (
            f"{self.path.name} is already quantized (mostly {self.main_type}, {self.bpw:.2f} bits per "
            "weight): quantizing it again compounds the rounding errors, as llama.cpp warns for "
            "--allow-requantize; start from the F16/F32 model when you have it."
        )


def source_summary(gguf_file: Any) -> SourceSummary:
    """The summary of a ``GGUFFile`` from ``studio.core.gguf.read``."""
    tensors: dict[str, int] = {}
    weights: dict[str, int] = {}
    nbytes = n = 0
    matrix_weights: dict[str, int] = {}
    for t in gguf_file.tensors:
        tensors[t.type_name] = tensors.get(t.type_name, 0) + 1
        weights[t.type_name] = weights.get(t.type_name, 0) + t.n_elements
        nbytes += t.nbytes
        n += t.n_elements
        if len(t.ne) >= 2:
            matrix_weights[t.type_name] = matrix_weights.get(t.type_name, 0) + t.n_elements
    main = max(matrix_weights, key=lambda k: matrix_weights[k]) if matrix_weights else "F32"
    quantized = any(k not in FLOAT_TYPES for k in matrix_weights)
    return SourceSummary(
        Path(gguf_file.path), tensors, weights, 8.0 * nbytes / n if n else 0.0, main, quantized
    )


# ------------------------------------------------------------------------------------------ checks


def check_tokenizer(gguf_file: Any) -> None:
    """Raise ModelOpenError when the file carries no tokenizer (chat and evaluation need one)."""
    meta = gguf_file.metadata
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(model, str) or model == "none" or not isinstance(tokens, list) or not tokens:
        raise ModelOpenError(
            f"{Path(gguf_file.path).name} has no tokenizer in its metadata (tokenizer.ggml.*), so it "
            "cannot be chatted with or evaluated.",
            hint="Convert the model again with its tokenizer.",
        )


# ------------------------------------------------------------------------------------------ metadata


def copy_metadata(kv: Any, gguf_file: Any, *, skip: Iterable[str] = ()) -> list[str]:
    """Add every metadata key of ``gguf_file`` to the gguf-py writer ``kv``, in file order and with its
    stored value type (what llama-quantize's copy keeps); returns the keys that could not be copied."""
    skipped = set(skip)
    kv.kv_data[0].clear()  # general.architecture is written where the source has it
    lost = []
    for key, value in gguf_file.metadata.items():
        if key in skipped:
            continue
        vtype, etype = gguf_file.value_types.get(key, (None, None))
        if vtype is None:
            lost.append(key)
            continue
        vt = gguf.GGUFValueType(vtype)
        if vt == gguf.GGUFValueType.ARRAY:
            items = value.tolist() if isinstance(value, np.ndarray) else list(value)
            if not items:  # gguf-py refuses empty arrays
                lost.append(key)
                continue
            items = [v.tolist() if isinstance(v, np.ndarray) else v for v in items]
            kv.add_key_value(key, items, vt, sub_type=gguf.GGUFValueType(etype))
        else:
            kv.add_key_value(key, value, vt)
    return lost


_BIG_ARRAYS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
)


def _metadata_only_copy(gguf_file: Any, folder: Path) -> Path:
    """A tensor-less GGUF with the file's metadata minus the vocabulary arrays: transformers reads its
    config from that in milliseconds instead of parsing 100k token strings with gguf-py's reader."""
    out = folder / "metadata-only.gguf"
    arch = str(gguf_file.metadata.get("general.architecture", "llama"))
    w = gguf.GGUFWriter(str(out), arch)
    copy_metadata(w, gguf_file, skip=_BIG_ARRAYS)
    tokens = gguf_file.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and f"{arch}.vocab_size" not in gguf_file.metadata:
        w.add_uint32(f"{arch}.vocab_size", len(tokens))  # transformers falls back to len(tokens)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return out


# ------------------------------------------------------------------------------------------ HF folder


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo ``gguf.arch.permute_rows``: llama.cpp's interleaved rope pairs back to HF's rotate-half rows."""
    rows = w.shape[0]
    return np.ascontiguousarray(
        w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _undo_transform(x: np.ndarray, tm: Any, config: dict[str, Any]) -> np.ndarray:
    if tm.transform is Transform.NONE:
        return x
    if tm.transform is Transform.TRANSPOSE:
        return np.ascontiguousarray(x.T)
    if tm.transform is Transform.PLUS_ONE:
        return x - np.float32(1.0)
    n_head, n_kv = head_counts(config)
    return unpermute_rows(x, n_head if tm.transform is Transform.PERMUTE_Q else n_kv)


def _hf_layout(src: Path, config: Any, gguf_file: Any) -> tuple[Any, str]:
    """The exporter's HF→GGUF layout for the transformers model ``config`` describes, and its class name."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - one sentence, whatever transformers raised
        raise ModelOpenError(
            f"transformers has no causal language model for {src.name} (architecture "
            f"{config.model_type}): {str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__}"
        ) from None
    cls = type(model).__name__
    tensors = tuple(
        TensorInfo(name=k, shape=tuple(v.shape), dtype="F32", nbytes=4 * v.numel(), file=src)
        for k, v in model.state_dict().items()
    )
    del model
    cfg = config.to_dict()
    info = ModelInfo(
        path=src,
        format=CheckpointFormat.SAFETENSORS,
        architecture=cls,
        model_type=str(config.model_type),
        config=cfg,
        tensors=tensors,
        n_layers=int(cfg.get("num_hidden_layers") or 0),
    )
    try:
        return layout(info), cls
    except StudioError as err:
        raise ModelOpenError(
            f"{src.name} cannot be written as a Hugging Face folder: {err.message}",
            hint="Chat with and evaluate it in llama.cpp instead (open the .gguf file directly).",
        ) from None


def _transformers_config(src: Path, gguf_file: Any) -> Any:
    from transformers import AutoConfig

    try:
        with tempfile.TemporaryDirectory(prefix="quant-studio-meta-") as tmp:
            meta = _metadata_only_copy(gguf_file, Path(tmp))
            config = AutoConfig.from_pretrained(tmp, gguf_file=meta.name, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - e.g. "GGUF model with architecture x is not supported yet."
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        arch = gguf_file.metadata.get("general.architecture", "?")
        raise ModelOpenError(
            f"transformers cannot read {src.name} (architecture {arch}) as a Hugging Face model: {text}",
            hint="Chat with and evaluate it in llama.cpp instead (open the .gguf file directly).",
        ) from None
    # What the file really holds decides, where transformers' metadata mapping is silent or guesses:
    # tying, the vocabulary size (it counts the token list, left out of the copy above) and head_dim.
    by_name = {t.name: t for t in gguf_file.tensors}
    config.tie_word_embeddings = "output.weight" not in by_name
    embd = by_name.get("token_embd.weight")
    if embd is not None and len(embd.ne) == 2:
        config.vocab_size = int(embd.ne[1])
    arch = gguf_file.metadata.get("general.architecture")
    key_length = gguf_file.metadata.get(f"{arch}.attention.key_length")
    if isinstance(key_length, int) and hasattr(config, "head_dim"):
        config.head_dim = key_length
    return config


def _plan_tensors(src: Path, gguf_file: Any, lay: Any) -> list[tuple[Any, Any]]:
    """(TensorMap, GGUFTensor) for every HF tensor, checked against the file's tensors."""
    by_name = {t.name: t for t in gguf_file.tensors}
    pairs = []
    for tm in lay.tensors:
        g = by_name.get(tm.gguf_name)
        if g is None:
            raise ModelOpenError(
                f"{src.name} has no tensor {tm.gguf_name!r}, which {tm.hf_name!r} of the model needs.",
                hint="The file may be a variant of the architecture that transformers does not know.",
            )
        if tuple(g.shape) != tuple(tm.shape):
            raise ModelOpenError(
                f"Tensor {tm.gguf_name!r} of {src.name} has shape {list(g.shape)}, the model expects "
                f"{list(tm.shape)} for {tm.hf_name!r}."
            )
        pairs.append((tm, g))
    used = {tm.gguf_name for tm in lay.tensors}
    extra = [n for n in by_name if n not in used and n not in _DERIVED_TENSORS]
    if extra:
        raise ModelOpenError(
            f"{src.name} holds tensor {extra[0]!r} (and {len(extra) - 1} more) that the transformers model "
            "has no place for, so its Hugging Face folder would not be the same model.",
            hint="Chat with and evaluate it in llama.cpp instead (open the .gguf file directly).",
        )
    return pairs


def _write_safetensors(
    path: Path, pairs: list[tuple[Any, Any]], src: Path, config: dict[str, Any], ctx: JobContext
) -> None:
    """Stream every tensor, dequantized and in HF order and layout, into one float32 safetensors file."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "quant_studio.source": src.name}}
    pos = 0
    for tm, _g in pairs:
        hf_shape = list(tm.shape[::-1]) if tm.transform.value == "transpose" else list(tm.shape)
        n = 4 * math.prod(hf_shape)
        header[tm.hf_name] = {"dtype": "F32", "shape": hf_shape, "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    total = pos
    done = 0
    with open(src, "rb") as fsrc, open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for tm, g in pairs:
            ctx.check_cancelled()
            fsrc.seek(g.offset)
            data = np.frombuffer(fsrc.read(g.nbytes), dtype=np.uint8)
            if data.size != g.nbytes:
                raise ModelOpenError(f"{src.name} ends inside tensor {g.name!r}; the file is incomplete.")
            rows = g.n_elements // g.ne[0] if g.ne and g.ne[0] else 1
            x = dequantize_tensor(data.reshape(rows, -1), g.type_name, g.shape, tensor=g.name, file=src.name)
            x = _undo_transform(x, tm, config)
            if not np.isfinite(x).all():
                raise ModelOpenError(f"Tensor {g.name!r} of {src.name} holds NaN or Inf values.")
            b = memoryview(np.ascontiguousarray(x, dtype="<f4")).cast("B")
            for i in range(0, len(b), _ST_CHUNK):
                f.write(b[i : i + _ST_CHUNK])
            done += len(b)
            ctx.report(done, total, f"Writing {tm.hf_name}")
        f.flush()
        os.fsync(f.fileno())


def folder_is_complete(folder: Path, sha256: str | None = None) -> bool:
    """Whether ``folder`` is a whole folder written by ``write_hf_folder`` (from the file with ``sha256``)."""
    marker = Path(folder) / SOURCE_MARKER
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))  # noqa: TID251 - the source marker is written by write_hf_folder (this module)
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict) or info.get("version") != HF_FORMAT_VERSION:
        return False
    return sha256 is None or info.get("sha256") == sha256


def _check_space(folder: Path, need: int, target: Path) -> None:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < need:
        raise StudioError(
            f"Not enough disk space for {target} (needs {format_bytes(need)}, {format_bytes(free)} free).",
            hint="Free some space or set QUANT_STUDIO_CACHE to a folder on another disk.",
        )


def write_hf_folder(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    ctx: JobContext | None = None,
    *,
    sha256: str | None = None,
) -> Path:
    """Write the Hugging Face folder of the GGUF file ``src`` at ``dst`` (atomically) and return it.

    ``sha256`` (of ``src``, when the caller knows it) is recorded in the marker file so that a cache
    can tell whether the folder was made from this very file.
    """
    ctx = ctx or null_context()
    src, dst = Path(src), Path(dst)
    with _conversion_lock(dst, src, ctx):
        if folder_is_complete(dst, sha256):  # another process converted it while this one waited
            return dst
        return _write_hf_folder(src, dst, ctx, sha256)


@contextmanager
def _conversion_lock(dst: Path, src: Path, ctx: JobContext) -> Iterator[None]:
    """Hold the lock of the folder ``dst`` across processes, waiting (cancellable) while another holds it.

    Two commands started together on one GGUF would otherwise each convert it (minutes and 7 GB of float32
    for a 1.5B): the second now waits and reuses the first's folder. The lock file lives in the temporary
    folder, named by ``dst``'s path, so the cache holds only folders; the kernel frees a lock whose process
    died, so no stale lock can block a later run.
    """
    key = hashlib.sha256(str(dst.resolve()).encode()).hexdigest()[:24]
    path = Path(tempfile.gettempdir()) / "quant-studio-locks" / f"gguf-hf-{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    waited = False
    while True:
        ctx.check_cancelled()
        try:
            lock.acquire(timeout=0.2)
            break
        except Timeout:
            if not waited:
                waited = True
                ctx.report(0, 1, f"Waiting for another conversion of {src.name} to finish")
    try:
        yield
    finally:
        lock.release()


def _write_hf_folder(src: Path, dst: Path, ctx: JobContext, sha256: str | None) -> Path:
    g = read_gguf(src)  # bounded: before gguf-py's reader (inside transformers) trusts any count
    check_tokenizer(g)
    check_decodable(g.tensors, src)
    check_gguf_numbers(g.metadata, g.tensors, src.name)  # before transformers builds a model from them
    ctx.report(0, 1, f"Reading the metadata of {src.name}")
    with no_hf_progress_bars():
        config = _transformers_config(src, g)
        lay, cls = _hf_layout(src, config, g)
        pairs = _plan_tensors(src, g, lay)
        need = sum(4 * g2.n_elements for _, g2 in pairs) + (16 << 20)
        dst.parent.mkdir(parents=True, exist_ok=True)
        _check_space(dst.parent, need, dst)
        work = Path(tempfile.mkdtemp(prefix=f".{dst.name}-", suffix=".partial", dir=dst.parent))
        try:
            from transformers import AutoTokenizer

            ctx.report(0, 1, "Building the tokenizer")
            try:
                tok = AutoTokenizer.from_pretrained(
                    str(src.parent), gguf_file=src.name, trust_remote_code=False
                )
            except Exception as err:  # noqa: BLE001
                text = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
                raise ModelOpenError(
                    f"transformers cannot build the tokenizer of {src.name}: {text}"
                ) from None
            tok.save_pretrained(str(work))
            config.architectures = [cls]
            config.dtype = "float32"
            config.save_pretrained(str(work))
            _write_safetensors(work / "model.safetensors", pairs, src, config.to_dict(), ctx)
            marker = {
                "version": HF_FORMAT_VERSION,
                "source": str(src),
                "source_bytes": g.file_size,
                "sha256": sha256,
                "types": dict(source_summary(g).tensors_by_type),
            }
            (work / SOURCE_MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
            ctx.check_cancelled()
            if folder_is_complete(dst, sha256):
                # Another process wrote the same folder meanwhile and may be reading it now: keep its copy.
                return dst
            if dst.exists():
                shutil.rmtree(dst, ignore_errors=True)  # an older or broken folder
            try:
                os.replace(work, dst)
            except OSError:
                if not folder_is_complete(dst, sha256):  # another process finished first: keep its copy
                    raise
        except OSError as err:
            raise StudioError(
                f"The Hugging Face folder for {src.name} could not be written to {dst} ({err.strerror or err}).",
                hint="Check free disk space and permissions, or set QUANT_STUDIO_CACHE.",
            ) from err
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return dst


def file_sha256(path: str | os.PathLike[str], ctx: JobContext | None = None) -> str:
    """The hex sha256 of a file, read in chunks (cancellable)."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    done = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            h.update(b)
            done += len(b)
            if ctx is not None:
                ctx.check_cancelled()
                ctx.report(done, size, f"Checking {Path(path).name}")
    return h.hexdigest()


def hf_folder_for(
    src: str | os.PathLike[str],
    ctx: JobContext | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """The (cached) Hugging Face folder of any GGUF file: made once per file content, then reused."""
    src = Path(src).expanduser().resolve()
    folder = _hf_folder_path(src, cache_dir)
    if folder_is_complete(folder):
        return folder
    return write_hf_folder(src, folder, ctx)


def hf_folder_cached(src: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``hf_folder_for(src)`` would reuse its cached folder (no conversion to wait for)."""
    return folder_is_complete(_hf_folder_path(Path(src).expanduser().resolve(), cache_dir))


def _hf_folder_path(src: Path, cache_dir: str | os.PathLike[str] | None) -> Path:
    try:
        st = src.stat()
    except OSError as err:
        raise ModelOpenError(f"Cannot read {src}: {err.strerror or err}.") from None
    # path, size and mtime name the cache entry (hashing a 10 GB file on every open would be slow)
    key = hashlib.sha256(f"{src}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(cache_dir or user_cache_dir()) / "gguf-hf" / f"{src.stem[:60]}-{key}"


__all__ = [
    "HF_FORMAT_VERSION",
    "SOURCE_MARKER",
    "SourceSummary",
    "UnsupportedTensorTypeError",
    "can_decode",
    "check_decodable",
    "check_tokenizer",
    "copy_metadata",
    "dequantize_tensor",
    "file_sha256",
    "folder_is_complete",
    "hf_folder_cached",
    "hf_folder_for",
    "source_summary",
    "unpermute_rows",
    "write_hf_folder",
]
