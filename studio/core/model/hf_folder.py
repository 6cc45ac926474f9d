"""A model folder transformers can load without unpickling anything in this process.

``from_pretrained`` on a folder that holds only ``pytorch_model.bin`` would unpickle it in the
calling process (the GUI or the CLI). ``transformers_folder`` routes such a folder through
``open_model``: refused unless the caller opted in, else converted to safetensors in the
memory-limited child (``pickle_loader``, cached). transformers then loads a small cached folder
holding links to the original's config and tokenizer files and to the converted weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

from studio.core.jobs import JobContext, null_context
from studio.core.model import open_model
from studio.core.model.pickle_loader import pickle_cache_dir

WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors", ".ckpt", ".h5", ".msgpack")
_INDEXES = ("pytorch_model.bin.index.json", "model.safetensors.index.json")
_DONE = ".quant-studio-complete"


def holds_only_pickles(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` has pickle weights (``.bin``/``.pt``/``.pth``) and no safetensors."""
    p = Path(folder)
    if not p.is_dir():
        return False
    names = [f.suffix.lower() for f in p.iterdir() if f.is_file()]
    return ".safetensors" not in names and any(s in (".bin", ".pt", ".pth") for s in names)


def _link(src: Path, dst: Path) -> None:
    # a hard link keeps a converted file alive in the cache's own file system; elsewhere a symlink;
    # a copy only where neither works (small files, or Windows without the privilege)
    for make in (os.link, os.symlink):
        try:
            make(src, dst)
            return
        except OSError:
            continue
    shutil.copy2(src, dst)


def transformers_folder(
    folder: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    ctx: JobContext | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """``folder`` itself, or for a pickle-only folder the cached folder with its safetensors conversion.

    Raises the ``UnsafeFileError`` of ``open_model`` (the opt-in sentence) unless ``allow_pickle``.
    """
    src = Path(folder)
    if not holds_only_pickles(src):
        return src

    ctx = ctx or null_context()
    with open_model(src, ctx, allow_pickle=allow_pickle) as ck:
        stores: dict[str, Path] = dict(getattr(ck, "stores", {}))
    files = sorted(set(stores.values()))
    # the converted files are named after their contents; the folder decides config and tokenizer
    ident = "|".join([str(src.resolve()), *(f.name for f in files)])
    key = hashlib.sha256(ident.encode()).hexdigest()[:24]
    target = pickle_cache_dir(cache_dir) / "transformers" / key
    if (target / _DONE).is_file():
        return target
    tmp = target.with_name(f"{key}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o700)
    try:
        for f in src.iterdir():
            if f.is_file() and f.suffix.lower() not in WEIGHT_SUFFIXES and f.name not in _INDEXES:
                _link(f.resolve(), tmp / f.name)
        if len(files) == 1:
            _link(files[0], tmp / "model.safetensors")
        else:
            names = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
            for f, name in names.items():
                _link(f, tmp / name)
            index = {"metadata": {}, "weight_map": {t: names[f] for t, f in stores.items()}}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
        (tmp / _DONE).write_text("", encoding="utf-8")
        with contextlib.suppress(OSError):
            shutil.rmtree(target)  # an incomplete older attempt
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / _DONE).is_file():  # not another process that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
