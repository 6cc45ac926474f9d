"""One run of llama.cpp's converter up to its writer (the architecture layer for every model our own
mapping does not cover), and the converter's own F32 file as the conformance tests' reference.

The converter's model class (its ``conversion/`` package, loaded from the bundle of
``studio.core.gguf.converter_bundle``) maps names, reshapes, merges experts, writes the architecture
metadata and the vocabulary. Its normal last step writes everything through gguf-py's GGUFWriter;
the seam used here is just before that: after ``prepare_tensors`` (lazy: no tensor data read yet)
and ``prepare_metadata`` (hyper-parameters, tokenizer, general.*), the writer holds the key/value
list and one lazy tensor per GGUF tensor. Those are taken as they are and fed through the studio's
plan, quantizers and atomic writer in one pass: each tensor is evaluated only when it is written
(a merged expert tensor one expert at a time), so no F16 or F32 intermediate file exists.

What the studio changes, and why (each is also a documented exception of the conformance tests):
- ``general.file_type`` is the plan's, and ``quant_studio.version``/``quant_studio.plan`` are added;
- tensor types follow the plan (the converter's own types are what an F32 plan gives);
- a BPE tokenizer whose fingerprint the converter does not know (its ``get_vocab_base_pre`` raises)
  gets the pre-tokenizer that its ``tokenizer.json`` regex names, as the studio's own exporter does;
  the converter alone would refuse such a model.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core import safejson
from studio.core.errors import ExportError, RemoteCodeError
from studio.core.gguf.converter_bundle import (
    GGUF_MODULE,
    converter_available,
    load_converter,
)
from studio.core.gguf.converter_roles import hf_architecture, unknown_architecture_error
from studio.core.gguf.vocab import pre_tokenizer_name
from studio.core.modelinfo import CheckpointFormat, ModelInfo, rotation_config

CHUNK_BYTES = 16 << 20  # float32 bytes per block of rows handed to the quantizers


# ---------------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class ConvertedTensor:
    """One GGUF tensor as llama.cpp's converter produces it."""

    name: str
    shape: tuple[int, ...]  # numpy shape (ggml ne reversed)
    dtype: str  # GGML type name the converter gives it in an F32 conversion ("F32" for all we write)
    sources: tuple[str, ...]  # checkpoint tensors it is computed from, in order (experts: by index)


@dataclass
class ConverterRun:
    """llama.cpp's converter model class instantiated (lazily) for one checkpoint folder."""

    info: ModelInfo
    model: Any
    conv: Any
    tensors: dict[str, ConvertedTensor]
    warnings: list[str] = field(default_factory=list)  # what the converter logged
    notes: list[str] = field(default_factory=list)  # what the studio changed (tokenizer fallback)

    # -- metadata
    def key_values(self) -> list[tuple[str, Any, int, int | None]]:
        """(key, value, GGUFValueType number, sub type number) in the converter's order."""
        out = []
        for key, v in self.model.gguf_writer.kv_data[0].items():
            sub = int(v.sub_type) if v.sub_type is not None else None
            out.append((key, v.value, int(v.type), sub))
        return out

    def arch_params(self) -> dict[str, Any]:
        """The ``{arch}.*`` hyper-parameters the converter writes, keys without the prefix."""
        arch = self.gguf_arch
        out = {}
        for key, v in self.model.gguf_writer.kv_data[0].items():
            if key.startswith(arch + "."):
                out[key[len(arch) + 1 :]] = v.value
        return out

    @property
    def gguf_arch(self) -> str:
        """The GGUF architecture name (``general.architecture``)."""
        return str(self.conv.gguf.MODEL_ARCH_NAMES[self.model.model_arch])

    # -- tensor data
    def rows(self, name: str, *, chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
        """The float32 values of tensor ``name`` as consecutive 2-D blocks of rows (never crossing
        an expert boundary), computed as the converter computes them; the tensor's lazy graph is
        released afterwards."""
        ti = self.model.gguf_writer.tensors[0].pop(name)
        data = ti.tensor
        chunked = getattr(self.conv.gguf, "LazyChunkedTensor", None)
        if chunked is not None and isinstance(data, chunked):
            # the converter already splits this one into row chunks (a shard at a time)
            n = ti.shape[-1] if ti.shape else 1
            for load in data._chunks:
                block = _as_f32(load()).reshape(-1, n)
                step = max(1, chunk_bytes // (4 * n))
                for a in range(0, block.shape[0], step):
                    yield block[a : a + step]
            return
        yield from _stream(self.conv.gguf.LazyBase, data, tuple(ti.shape), chunk_bytes)


def _tag_sources(model: Any, info: ModelInfo) -> None:
    """Make every lazy checkpoint tensor remember its checkpoint name (to trace GGUF sources)."""
    names = {t.name for t in info.tensors}
    back: dict[str, str] = {}
    for n in names:
        item = type(model).filter_tensors((n, lambda: None))
        if item is not None:
            back[item[0]] = n

    def tagged(src: str, gen: Callable[[], Any]) -> Callable[[], Any]:
        def make() -> Any:
            t = gen()
            with contextlib.suppress(AttributeError, TypeError):
                t._qs_source = src
            return t

        return make

    model.model_tensors = {k: tagged(back.get(k, k), g) for k, g in model.model_tensors.items()}


def _read_from_view(model: Any, info: ModelInfo, values: Any) -> None:
    """Point the converter's tensors at a rotated view: its names and shapes, its float32 values read when
    a tensor is evaluated (lazily, one at a time), and its config's tied-or-not head."""
    import torch

    lazy = importlib.import_module(type(model).__module__.rsplit(".", 1)[0] + ".base").LazyTorchTensor

    def read(name: str) -> Any:
        if values is None:
            raise ExportError(f"The rotated values of {name} were not given to llama.cpp's converter.")
        return torch.from_numpy(np.ascontiguousarray(values.read(name), dtype=np.float32))

    tensors: dict[str, Callable[[], Any]] = {}
    for t in info.tensors:
        shape = tuple(int(d) for d in t.shape)

        def gen(name: str = t.name, shape: tuple[int, ...] = shape) -> Any:
            return lazy(meta=lazy.meta_with_dtype_and_shape(torch.float32, shape), args=(name,), func=read)

        item = type(model).filter_tensors((t.name, gen))
        if item is not None:
            tensors[item[0]] = item[1]
    model.model_tensors = tensors
    model.hparams["tie_word_embeddings"] = bool(info.config.get("tie_word_embeddings", False))


def _sources(lazy_base: type, node: Any) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    stack = [node]
    visited: set[int] = set()
    order: list[str] = []
    # depth-first, left to right: a stack of experts lists its sources by expert index
    while stack:
        x = stack.pop()
        if isinstance(x, list | tuple):
            stack.extend(reversed(x))
            continue
        if not isinstance(x, lazy_base) or id(x) in visited:
            continue
        visited.add(id(x))
        src = getattr(x, "_qs_source", None)
        if isinstance(src, str):
            if src not in seen:
                seen[src] = None
                order.append(src)
            continue
        stack.extend(reversed(list(x._args)))
    return tuple(order)


@contextlib.contextmanager
def _collect_warnings(sink: list[str]) -> Iterator[None]:
    class _H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage().strip()
            # the unknown-tokenizer banner is handled (see _pre_fallback); keep real warnings
            # the converter overwrites some keys on purpose ("Duplicated key name ...")
            if msg.startswith("Duplicated key name"):
                return
            if msg and not msg.startswith("*") and record.levelno >= logging.WARNING:
                sink.append(msg)

    h = _H(logging.WARNING)
    logs = [logging.getLogger("hf-to-gguf"), logging.getLogger(GGUF_MODULE)]
    saved = [(lg.level, lg.propagate) for lg in logs]
    for lg in logs:
        lg.addHandler(h)
        lg.setLevel(logging.WARNING)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, (level, prop) in zip(logs, saved, strict=True):
            lg.removeHandler(h)
            lg.setLevel(level)
            lg.propagate = prop


def _pre_fallback(model: Any, folder: Path, notes: list[str]) -> None:
    """When the converter does not know a BPE tokenizer's fingerprint, name its pre-tokenizer from
    tokenizer.json as the studio's exporter does (see the module docstring)."""
    original = model.get_vocab_base_pre

    def pre(tokenizer: Any) -> str:
        try:
            return str(original(tokenizer))
        except NotImplementedError:
            tj = safejson.loads((folder / "tokenizer.json").read_bytes(), "tokenizer.json", ValueError)
            if ((tj.get("model") or {}).get("type")) == "WordPiece":
                name = "default"
            else:
                name = pre_tokenizer_name(tj)
            notes.append(
                f"llama.cpp's converter does not know this BPE tokenizer's fingerprint; its tokenizer.json "
                f"names the pre-tokenizer {name!r}, which was written."
            )
            return name

    model.get_vocab_base_pre = pre


def _check_safe_for_converter(info: ModelInfo, folder: Path) -> None:
    """The converter reads the folder itself: only safetensors weights (a pickle would be unpickled
    in this process, not in the studio's memory-limited child), and no custom code: some of its tokenizer
    paths let transformers run a repository's own code, so a folder that asks for any (``auto_map``) is
    refused here, before the converter sees it."""
    if info.format is not CheckpointFormat.SAFETENSORS:
        raise ExportError(
            f"{info.path.name} is a {info.format.value} checkpoint; llama.cpp's converter path exports "
            "safetensors weights only, so save the model as safetensors first."
        )
    for name in ("config.json", "tokenizer_config.json"):
        p = folder / name
        try:
            data = safejson.loads(p.read_bytes(), name, ValueError) if p.is_file() else {}
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict) and data.get("auto_map"):
            raise RemoteCodeError(
                f"{folder.name}/{name} asks for custom Python code (auto_map), which llama.cpp's converter "
                "would run; Quant Studio does not run code from model repositories."
            )


def start_run(
    info: ModelInfo, *, out_path: Path | None = None, metadata: bool = False, values: Any = None
) -> ConverterRun:
    """Instantiate the converter for ``info`` and run its tensor preparation (lazy, no data read);
    with ``metadata`` also its hyper-parameters, general.* keys and vocabulary.

    A rotated view's ``info`` (``studio.core.model.rotate``): the converter sees the view's tensors (an
    untied head included) instead of the folder's, each read from ``values`` (the view) when it is
    written; without ``values`` (a layout: names and shapes only) reading one is an error."""
    import torch

    if not converter_available()[0]:
        raise unknown_architecture_error(info)
    conv = load_converter()
    arch = hf_architecture(info)
    cls = conv.model_class(arch)
    if cls is None:
        raise unknown_architecture_error(info)
    folder = info.path if info.path.is_dir() else info.path.parent
    _check_safe_for_converter(info, folder)
    warnings: list[str] = []
    notes: list[str] = []
    with _collect_warnings(warnings), torch.inference_mode():
        try:
            model = cls(
                folder,
                conv.gguf.LlamaFileType.ALL_F32,
                Path(out_path) if out_path is not None else folder / "converted.gguf",
                eager=False,
            )
            if rotation_config(info):
                _read_from_view(model, info, values)
            _tag_sources(model, info)
            _pre_fallback(model, folder, notes)
            model.prepare_tensors()
            if metadata:
                model.prepare_metadata(vocab_only=False)
            else:
                with contextlib.suppress(Exception):  # hyper-parameters only inform estimates here
                    model.set_gguf_parameters()
        except ExportError:
            raise
        except Exception as err:  # noqa: BLE001 - the converter raises anything; one sentence out
            raise ExportError(
                f"{conv.bundle.label} could not convert {info.path.name} ({arch}): "
                f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else 'no detail'}."
            ) from err
    tensors: dict[str, ConvertedTensor] = {}
    gq = conv.gguf.GGMLQuantizationType
    for name, ti in model.gguf_writer.tensors[0].items():
        dtype = gq(ti.dtype).name if not isinstance(ti.dtype, str) else ti.dtype
        tensors[name] = ConvertedTensor(
            name, tuple(int(s) for s in ti.shape), dtype, _sources(conv.gguf.LazyBase, ti.tensor)
        )
    return ConverterRun(info, model, conv, tensors, warnings, notes)


# ------------------------------------------------------------------------------ streaming values


def _eager(lazy_base: type, x: Any) -> Any:
    """Evaluate a lazy node without caching results in the graph (a cached graph would keep every
    intermediate of a tensor alive until the whole tensor is written)."""
    if isinstance(x, list):
        return [_eager(lazy_base, v) for v in x]
    if isinstance(x, tuple):
        return tuple(_eager(lazy_base, v) for v in x)
    if not isinstance(x, lazy_base):
        return x
    if x._data is not None:
        return x._data
    return x._func(*_eager(lazy_base, x._args), **x._kwargs)


def _as_f32(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        import torch

        if x.dtype != torch.float32:
            x = x.to(torch.float32)
        x = x.numpy()
    return np.asarray(x, dtype=np.float32)


_NUMPY_WRAPS = ("LazyTorchTensor.numpy.<locals>.<lambda>", "LazyNumpyTensor.astype.<locals>.<lambda>")


def _stacked_parts(lazy_base: type, node: Any) -> list[Any] | None:
    """The parts of ``torch.stack(parts, dim=0)`` under dtype/numpy wrappers, else None."""
    import torch

    x = node
    while isinstance(x, lazy_base) and x._data is None:
        if x._func is torch.stack:
            parts = x._args[0] if x._args else None
            if isinstance(parts, list | tuple) and int(x._kwargs.get("dim", 0)) == 0:
                return list(parts)
            return None
        qual = getattr(x._func, "__qualname__", "")
        if qual not in _NUMPY_WRAPS or not x._args:
            return None
        x = x._args[0]
    return None


def _stream(lazy_base: type, data: Any, shape: tuple[int, ...], chunk_bytes: int) -> Iterator[np.ndarray]:
    n = shape[-1] if shape else 1
    step = max(1, chunk_bytes // (4 * max(1, n)))
    parts = _stacked_parts(lazy_base, data) if len(shape) == 3 else None
    if parts is not None and len(parts) == shape[0]:
        # a merged expert tensor: evaluate and hand out one expert at a time
        for p in parts:
            x = _as_f32(_eager(lazy_base, p)).reshape(-1, n)
            for a in range(0, x.shape[0], step):
                yield x[a : a + step]
            del x
        return
    x = _as_f32(_eager(lazy_base, data))
    rows = x.reshape(-1, n) if x.size else x.reshape(0, n)
    if len(shape) == 3:
        per = shape[1]  # rows per expert: a block never crosses an expert
        step = max(1, min(step, per))
        for e in range(shape[0]):
            for a in range(e * per, (e + 1) * per, step):
                yield rows[a : min(a + step, (e + 1) * per)]
        return
    for a in range(0, rows.shape[0], step):
        yield rows[a : a + step]


def reference_convert(info: ModelInfo, out: Path) -> Path:
    """llama.cpp's converter writing its own F32 GGUF file with its own (non-atomic) writer, as
    ``convert_hf_to_gguf.py --outtype f32`` does: the reference the conformance tests compare with
    (the unknown-tokenizer fallback above applies, since the converter alone would stop there)."""
    run = start_run(info, out_path=out, metadata=True)
    w = run.model.gguf_writer
    with _collect_warnings(run.warnings):
        w.write_header_to_file(path=Path(out))
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=False)
        w.close()
    return Path(out)
